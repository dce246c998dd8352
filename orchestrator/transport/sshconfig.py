"""Resolve a host inventory entry plus ``~/.ssh/config`` into concrete SSH endpoints.

The inventory entry wins over ``~/.ssh/config`` (like flags over config in OpenSSH); the
config fills what the entry leaves out (HostName, User, Port, IdentityFile, ProxyJump,
ProxyCommand) for the alias or host name.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.errors import HostError


@dataclass(frozen=True)
class Endpoint:
    """One SSH hop: where to connect and as whom."""

    hostname: str
    port: int = 22
    user: str = ""
    keys: tuple[str, ...] = ()
    proxy_command: str | None = None
    jumps: tuple["Endpoint", ...] = field(default=())

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH files this host's key under in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def _config_path() -> Path:
    return Path(os.path.expanduser("~")) / ".ssh" / "config"


def _lookup(alias: str) -> dict:
    path = _config_path()
    if not path.is_file():
        return {}
    import paramiko

    try:
        cfg = paramiko.SSHConfig.from_path(str(path))
        found = cfg.lookup(alias)
    except Exception as exc:  # paramiko raises assorted types on odd config lines
        raise HostError(f"{path}: cannot read SSH config: {exc}",
                        hint="fix the file or set the host's ssh fields explicitly") from None
    # paramiko echoes the alias back as hostname when nothing matched; that is fine.
    return dict(found)


def _port(value: object, where: str) -> int:
    try:
        port = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise HostError(f"{where}: port {value!r} is not a number",
                        hint="use an integer between 1 and 65535") from None
    if not 0 < port < 65536:
        raise HostError(f"{where}: port {port} is out of range", hint="use 1..65535")
    return port


_HOP = re.compile(r"^(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>\d+))?$")


def _parse_hop(spec: str, where: str, depth: int) -> Endpoint:
    """``[user@]host[:port]`` or an alias from ``~/.ssh/config``."""
    spec = spec.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    m = _HOP.match(spec)
    if not m:
        raise HostError(f"{where}: cannot parse proxy_jump {spec!r}",
                        hint="use user@host:port or an alias from ~/.ssh/config")
    return resolve({"user": m.group("user"), "alias": m.group("host").strip("[]"),
                    "port": m.group("port")}, where=where, _depth=depth + 1)


def resolve(ssh: dict, *, where: str = "host", _depth: int = 0) -> Endpoint:
    """Turn an entry's ``ssh`` dict into an Endpoint (with its jump chain).

    Raises HostError when neither the entry nor ``~/.ssh/config`` says where to connect."""
    if _depth > 8:
        raise HostError(f"{where}: ProxyJump chain is deeper than 8 hops (a loop?)",
                        hint="check ProxyJump in ~/.ssh/config")
    alias = ssh.get("alias") or ssh.get("hostname")
    if not alias:
        raise HostError(f"{where}: ssh needs a hostname or an alias",
                        hint="set ssh.hostname (and port/user) or ssh.alias from ~/.ssh/config")
    cfg = _lookup(alias)
    # Like `ssh user@name`: a Host block matching the name may map it to another HostName.
    hostname = cfg.get("hostname") or alias
    port = _port(ssh.get("port") or cfg.get("port") or 22, where)
    user = ssh.get("user") or cfg.get("user") or getpass.getuser()
    keys: list[str] = []
    if ssh.get("key"):
        keys.append(os.path.expanduser(str(ssh["key"])))
    for k in cfg.get("identityfile", []) or []:
        k = os.path.expanduser(k)
        if k not in keys and os.path.exists(k):
            keys.append(k)
    jump_spec = ssh.get("proxy_jump")
    if jump_spec is None:
        jump_spec = cfg.get("proxyjump")
    jumps: tuple[Endpoint, ...] = ()
    if jump_spec and str(jump_spec).lower() != "none":
        jumps = tuple(_parse_hop(h, where, _depth) for h in str(jump_spec).split(","))
    # A jump hop with no key of its own tries the target's key (the usual single-key setup).
    jumps = tuple(j if j.keys else replace(j, keys=tuple(keys)) for j in jumps)
    proxy_command = None if jumps else cfg.get("proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    return Endpoint(hostname=hostname, port=port, user=user, keys=tuple(keys),
                    proxy_command=proxy_command, jumps=jumps)
