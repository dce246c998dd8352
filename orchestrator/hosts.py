"""The host inventory: ``$XDG_DATA_HOME/gpurun/hosts.json``.

The host ``local`` always exists (this machine, profile ``local``) and is the default. Writes
go through a temp file and a rename under an flock, so two CLIs never half-write the file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from contextlib import contextmanager
from typing import Iterator

from orchestrator import paths
from orchestrator.errors import HostError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SSH_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[0-9a-fA-F:]+\]|[^:@\s]+)(?::(?P<port>\d{1,5}))?$")


def _file() -> str:
    return str(paths.data_home() / "hosts.json")


def local_entry(overrides: dict | None = None) -> dict:
    entry = {"name": "local", "profile": "local", "kind": "local",
             "state_dir": str(paths.local_state_dir("local")), "workdir": None, "slots": 1}
    if overrides:
        entry.update({k: v for k, v in overrides.items() if k in ("slots", "expect_gpus", "gpus", "notify", "secrets")})
    return entry


def load_hosts() -> dict[str, dict]:
    try:
        with open(_file()) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    except ValueError as exc:
        raise HostError(f"{_file()}: not valid JSON ({exc})",
                        "fix the file by hand or move it away; gpurun rewrites it on the next `host add`")
    hosts = data.get("hosts", {}) if isinstance(data, dict) else {}
    hosts["local"] = local_entry(hosts.get("local"))
    return hosts


def get_host(name: str | None) -> dict:
    name = name or os.environ.get("GPURUN_HOST") or "local"
    hosts = load_hosts()
    if name not in hosts:
        import difflib
        known = ", ".join(sorted(hosts))
        close = difflib.get_close_matches(name, sorted(hosts), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise HostError(f"unknown host {name!r}", f"{hint}known hosts: {known}; add one with "
                        f"`gpurun host add {name} --profile generic-ssh --ssh user@host:port`")
    return hosts[name]


@contextmanager
def _locked() -> Iterator[dict]:
    os.makedirs(os.path.dirname(_file()), exist_ok=True)
    with open(_file() + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            with open(_file()) as f:
                data = json.load(f)
        except (FileNotFoundError, ValueError):
            data = {"hosts": {}}
        data.setdefault("hosts", {})
        yield data
        tmp = _file() + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, _file())


def add_host(entry: dict, *, replace: bool = False) -> dict:
    name = entry.get("name", "")
    if not NAME_RE.match(name or ""):
        raise HostError(f"invalid host name {name!r}", "use letters, digits, '.', '_' or '-' (max 63)")
    with _locked() as data:
        if name in data["hosts"] and not replace and name != "local":
            raise HostError(f"host {name!r} already exists", f"remove it first with `gpurun host rm {name}`")
        data["hosts"][name] = entry
    return entry


def update_host(name: str, **fields: object) -> None:
    with _locked() as data:
        entry = data["hosts"].get(name) or (local_entry() if name == "local" else None)
        if entry is None:
            raise HostError(f"unknown host {name!r}")
        entry.update(fields)
        data["hosts"][name] = entry


def remove_host(name: str) -> None:
    if name == "local":
        raise HostError("the host 'local' always exists and cannot be removed")
    with _locked() as data:
        if name not in data["hosts"]:
            raise HostError(f"unknown host {name!r}", "see `gpurun host ls`")
        del data["hosts"][name]


def parse_ssh(spec: str) -> dict:
    """``user@host:port`` (user and port optional) or an ``~/.ssh/config`` alias."""
    m = SSH_RE.match(spec.strip())
    if not m:
        raise HostError(f"cannot read SSH target {spec!r}", "write it as user@host:port, e.g. root@1.2.3.4:22022")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise HostError(f"SSH port {port} out of range in {spec!r}", "ports go from 1 to 65535")
    return {"user": m.group("user"), "hostname": m.group("host").strip("[]"), "port": port}
