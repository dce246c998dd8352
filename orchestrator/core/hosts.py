"""Host inventory use cases: add an SSH host (entry from flags and profile, first contact that
records its key), list, remove, and resolve the hosts a command acts on.

The inventory file itself (``hosts.json``, the built-in ``local``) is ``orchestrator.hosts``.
"""

from __future__ import annotations

import os
from typing import Optional

from orchestrator import hosts as inventory
from orchestrator.errors import HostError

__all__ = ["add", "first_contact", "list_hosts", "remove", "resolve", "ssh_entry", "watch_targets"]


def ssh_entry(name: str, *, profile: str = "generic-ssh", ssh_spec: Optional[str] = None,
              key: Optional[str] = None, jump: Optional[str] = None, state_dir: Optional[str] = None,
              workdir: Optional[str] = None, slots: Optional[int] = None, python: str = "python3",
              insecure_host_key: bool = False) -> dict:
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
        target["proxy_jump"] = jump
    return {"name": name, "profile": prof.name, "kind": "ssh", "ssh": target, "python": python,
            "state_dir": state_dir or prof.path("state_dir", name) or "~/.gpurun",
            "workdir": workdir or prof.path("workdir", name) or "~/gpurun-work",
            "slots": slots or 1, "insecure_host_key": insecure_host_key}


def first_contact(entry: dict) -> tuple[str, str]:
    """Connect once and record the box's host key (trust on first use); returns
    ``(key type, "SHA256:...")``. Raises HostKeyError when a recorded key differs,
    ConnectError when the box cannot be reached."""
    from orchestrator.transport.ssh import first_contact as contact

    return contact(entry)


def add(entry: dict, *, replace: bool = False) -> dict:
    """Write ``entry`` to the inventory. Raises HostError when the name exists (unless
    ``replace``) or is not a valid host name."""
    return inventory.add_host(entry, replace=replace)


def list_hosts() -> list[dict]:
    """Every host of the inventory (``local`` included), in name order."""
    hosts = inventory.load_hosts()
    return [hosts[n] for n in sorted(hosts)]


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
