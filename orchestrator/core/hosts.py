"""Host inventory use cases: add an SSH host (entry from flags and profile, first contact that
records its key), list, show, remove, and resolve the hosts a command acts on; and the job
names a host is known to have, read at home (for shell completion and event lines).

The inventory file itself (``hosts.json``, the built-in ``local``) is ``orchestrator.hosts``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from orchestrator import hosts as inventory
from orchestrator.errors import HostError

__all__ = ["add", "check_new_name", "describe", "first_contact", "host_names", "known_jobs", "list_hosts",
           "remove", "resolve", "ssh_entry", "watch_targets"]


def ssh_entry(name: str, *, profile: str = "generic-ssh", ssh_spec: Optional[str] = None,
              key: Optional[str] = None, jump: Optional[str] = None, state_dir: Optional[str] = None,
              workdir: Optional[str] = None, slots: Optional[int] = None, python: str = "python3",
              insecure_host_key: bool = False, slurm: tuple = ()) -> dict:
    """The inventory entry for SSH host ``name`` (no network, nothing written).

    Without ``ssh_spec``, ``name`` is an ``~/.ssh/config`` alias. Paths and the SSH user
    default to the profile's. Raises HostError (``local``, a bad target, no target at all),
    ProfileError for an unknown or invalid profile."""
    from orchestrator.profiles import load_profile

    if name == "local":
        raise HostError("'local' is built in", "use `gpurun queue submit --slots N` to change its slots")
    prof = load_profile(profile)
    target = inventory.parse_ssh(ssh_spec) if ssh_spec else {"user": None, "hostname": None, "port": None,
                                                             "alias": name}
    if ssh_spec is None and not os.path.exists(os.path.expanduser("~/.ssh/config")):
        raise HostError(f"no --ssh target for {name!r} and no ~/.ssh/config to find it in",
                        f"pass --ssh user@host:port, e.g. `gpurun host add {name} --ssh root@1.2.3.4:22`")
    target["user"] = target.get("user") or prof.get("ssh.user")
    if key:
        target["key"] = os.path.abspath(key)
    if jump:
        problem = inventory.jump_problem(jump)
        if problem:
            raise HostError(f"--jump {jump!r}: {problem}", "write it as " + inventory.FORM)
        target["proxy_jump"] = jump
    entry = {"name": name, "profile": prof.name, "kind": "ssh", "ssh": target, "python": python,
             "state_dir": state_dir or prof.path("state_dir", name) or "~/.gpurun",
             "workdir": workdir or prof.path("workdir", name) or "~/gpurun-work",
             "slots": slots or 1, "insecure_host_key": insecure_host_key}
    if slurm:
        entry["slurm"] = slurm_overrides(prof, slurm)
    return entry


SLURM_HOST_KEYS = ("partition", "account", "qos", "constraint", "time_default", "gres")


def slurm_overrides(prof: Any, pairs: tuple) -> dict:
    """``--slurm KEY=VALUE`` words as a host's ``slurm:`` mapping, checked by the profile
    schema's own rules; a non-Slurm profile or an unknown key is bad input."""
    from orchestrator.profile_schema import SLURM, Validator

    if prof.get("kind") != "slurm":
        raise HostError(f"--slurm is for Slurm hosts; profile {prof.name!r} is kind {prof.get('kind')!r}",
                        "add the host with --profile slurm (or a profile that extends it)")
    out: dict = {}
    for word in pairs:
        key, sep, val = word.partition("=")
        if not sep or key not in SLURM_HOST_KEYS or not val:
            raise HostError(f"--slurm {word!r}: expected KEY=VALUE with KEY among {', '.join(SLURM_HOST_KEYS)}",
                            "e.g. --slurm partition=gpu --slurm account=lab42")
        out[key] = val
    try:
        Validator("--slurm", {}).validate(out, SLURM)
    except Exception as exc:  # the schema's ProfileError names the key; say it as a host problem
        raise HostError(str(exc).replace("--slurm: key", "--slurm"), getattr(exc, "hint", "")) from None
    return out


def first_contact(entry: dict) -> tuple[str, str]:
    """Connect once and record the box's host key (trust on first use); returns
    ``(key type, "SHA256:...")``. Raises HostKeyError when a recorded key differs,
    ConnectError when the box cannot be reached."""
    from orchestrator.transport.ssh import first_contact as contact

    return contact(entry)


def check_new_name(name: str, *, replace: bool = False) -> None:
    """Refuse a name that is taken (unless ``replace``) or malformed, before anything is
    contacted: ``host add`` must not reach a box and record its key only to say no."""
    if not inventory.NAME_RE.match(name or ""):
        raise HostError(f"invalid host name {name!r}", "use letters, digits, '.', '_' or '-' (max 63)")
    if not replace and name != "local" and name in inventory.load_hosts():
        raise HostError(f"host {name!r} already exists",
                        f"see it with `gpurun host show {name}`; replace it with `--replace`, "
                        f"or remove it first with `gpurun host rm {name}`")


def add(entry: dict, *, replace: bool = False) -> dict:
    """Write ``entry`` to the inventory. Raises HostError when the name exists (unless
    ``replace``) or is not a valid host name."""
    return inventory.add_host(entry, replace=replace)


def list_hosts() -> list[dict]:
    """Every host of the inventory (``local`` included), in name order."""
    hosts = inventory.load_hosts()
    return [hosts[n] for n in sorted(hosts)]


def host_names() -> list[str]:
    """Every host name of the inventory (``local`` included), sorted; never raises (a torn
    inventory gives ``["local"]``), so shell completion can call it."""
    try:
        return sorted(inventory.load_hosts())
    except HostError:
        return ["local"]


def describe(name: Optional[str] = None) -> dict:
    """What gpurun uses to reach host ``name`` (default: $GPURUN_HOST, else ``local``):
    ``{name, kind, profile, target, ssh, slots, state_dir, workdir, python, insecure_host_key,
    instance}``, no network. ``target`` is the SSH target in one string (``user@host:port``
    or the ``~/.ssh/config`` alias), or ``this machine``. Raises HostError if unknown."""
    h = inventory.get_host(name)
    ssh = dict(h.get("ssh") or {})
    if h.get("kind", "local") == "local":
        target = "this machine"
    elif ssh.get("alias"):
        target = f"{ssh['alias']} (~/.ssh/config alias)"
    else:
        user = f"{ssh['user']}@" if ssh.get("user") else ""
        target = f"{user}{ssh.get('hostname')}:{ssh.get('port') or 22}"
    return {"name": h["name"], "kind": h.get("kind", "local"), "profile": h.get("profile"), "target": target,
            "ssh": ssh or None, "slots": h.get("slots") or 1, "state_dir": h.get("state_dir"),
            "workdir": h.get("workdir"), "python": h.get("python"),
            "insecure_host_key": bool(h.get("insecure_host_key")), "instance": h.get("instance")}


def known_jobs(name: Optional[str] = None) -> list[dict]:
    """``[{id, name, seq}]`` of the jobs host ``name`` is known to have, read at home with no
    network: the local store read-only for ``local``, the controller-side snapshot
    (``core/snapshot``) for SSH hosts. Never raises: it feeds completion and labels."""
    import sqlite3

    from orchestrator.core import snapshot

    try:
        h = inventory.get_host(name)
    except HostError:
        return []
    if h.get("kind", "local") != "local":
        return [{"id": j.get("id"), "name": j.get("name"), "seq": j.get("seq")}
                for j in snapshot.jobs(h["name"]) if j.get("id")]
    db = os.path.join(os.path.expanduser(h.get("state_dir") or ""), "gpurun.db")
    if not os.path.exists(db):
        return []
    try:  # read-only: completion must never create, migrate or lock the agent's store
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            rows = con.execute("SELECT id, name, seq FROM jobs ORDER BY seq").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []
    return [{"id": r[0], "name": r[1], "seq": r[2]} for r in rows]


def remove(name: str) -> None:
    """Forget host ``name`` (nothing on the box is touched). Raises HostError if unknown."""
    inventory.remove_host(name)


def resolve(name: Optional[str] = None) -> dict:
    """The inventory entry of ``name`` (default: $GPURUN_HOST, else ``local``); HostError if unknown."""
    return inventory.get_host(name)


def watch_targets(names: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """The hosts ``watch`` shows: those named, else every host but ``local``, else ``local``."""
    if names:
        return [inventory.get_host(n) for n in names]
    inv = inventory.load_hosts()
    remote = [h for n, h in sorted(inv.items()) if n != "local"]
    return remote or [inv["local"]]
