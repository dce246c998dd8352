"""The one OpenSSH client argv gpurun hands to rsync (push and pull) and its host-key policy.

Policy (the same as the paramiko transport, see ``hostkeys``): keys are checked against
gpurun's own known_hosts only, where ``gpurun host add`` recorded them on first contact
(TOFU); an unknown or changed key is refused (``StrictHostKeyChecking=yes``), never
silently accepted. Only a host added with ``--insecure-host-key`` skips verification.
``~/.ssh/config`` is read once, by ``sshconfig.resolve``, and never again by ``ssh`` itself
(``-F /dev/null``), so the argv connects exactly where the transport does.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional, Union

from orchestrator.transport.sshconfig import Endpoint, resolve

CONNECT_TIMEOUT_S = 10.0
# Keepalives: a dead peer is noticed in ~30 s instead of the kernel's hours-long TCP timeout.
ALIVE_INTERVAL_S = 10
ALIVE_COUNT_MAX = 3


def _pct(s: str) -> str:
    return s.replace("%", "%%")  # ssh expands %-tokens in ProxyCommand / IdentityFile


def host_key_options(known_hosts: Union[str, os.PathLike], *, insecure: bool = False) -> list[str]:
    """The ``-o`` options that carry the host-key policy (see the module docstring)."""
    if insecure:
        return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return ["-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={_pct(str(known_hosts))}"]


def openssh_argv(hop: Endpoint, known_hosts: Union[str, os.PathLike], *, insecure: bool = False,
                 connect_timeout: float = CONNECT_TIMEOUT_S, with_target: bool = True) -> list[str]:
    """argv (``ssh ...``, without the destination) for one endpoint and its jump chain.
    ``with_target`` adds ``-l user``; the caller appends the host (or rsync's ``host:path``)."""
    argv = ["ssh", "-F", "/dev/null", "-p", str(hop.port), "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, int(connect_timeout))}",
            "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
            "-o", f"ServerAliveCountMax={ALIVE_COUNT_MAX}",
            "-o", "LogLevel=ERROR"]
    argv += host_key_options(known_hosts, insecure=insecure)
    for key in hop.keys:
        argv += ["-i", _pct(key)]
    if hop.keys:
        argv += ["-o", "IdentitiesOnly=yes"]
    if hop.jumps:
        *outer, last = hop.jumps
        inner = Endpoint(last.hostname, last.port, last.user, last.keys, last.proxy_command,
                         tuple(outer))
        proxy = openssh_argv(inner, known_hosts, insecure=insecure, connect_timeout=connect_timeout,
                             with_target=False) + ["-W", "%h:%p", f"{last.user}@{last.hostname}"]
        argv += ["-o", "ProxyCommand=" + " ".join(shlex.quote(a) for a in proxy)]
    elif hop.proxy_command:
        argv += ["-o", "ProxyCommand=" + hop.proxy_command]
    if with_target:
        argv += ["-l", hop.user]
    return argv


def rsync_host(hop: Endpoint) -> str:
    """The host part of rsync's ``host:path`` (IPv6 literals in brackets)."""
    return f"[{hop.hostname}]" if ":" in hop.hostname else hop.hostname


def host_argv(host_entry: dict, known_hosts: Optional[Union[str, os.PathLike]] = None, *,
              connect_timeout: float = CONNECT_TIMEOUT_S) -> tuple[list[str], str]:
    """(argv, ``user@host``) for an inventory entry, as the SSH transport would connect.

    Raises HostError when the entry does not say where to connect."""
    if known_hosts is None:
        from orchestrator.transport.hostkeys import default_known_hosts

        known_hosts = default_known_hosts()
    name = host_entry.get("name") or "ssh-host"
    hop = resolve(host_entry.get("ssh") or {}, where=f"host {name}")
    argv = openssh_argv(hop, Path(known_hosts), insecure=bool(host_entry.get("insecure_host_key")),
                        connect_timeout=connect_timeout)
    return argv, f"{hop.user}@{rsync_host(hop)}"
