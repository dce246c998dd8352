"""The Transport contract: run, put, get, sync, check, close.

One contract for the local machine and for SSH hosts, so every use case is written once.
Implementations raise ``ConnectError`` when no command could start (safe to retry) and
``TransportError`` when the link died while a command may have run (never retried blindly).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


def rpath(path: str) -> str:
    """Quote a host path for ``sh``, keeping a leading ``~`` expandable (as ``"$HOME"``, which
    also expands after ``=`` and inside other words, where a bare ``~`` would not)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def sftp_path(path: str) -> str:
    """SFTP does not expand ``~``; its working directory is the login home."""
    if path in ("~", "~/"):
        return "."
    return path[2:] if path.startswith("~/") else path


@dataclass(frozen=True)
class RunResult:
    """What one remote command produced."""

    exit_code: int
    stdout: str
    stderr: str


@runtime_checkable
class Transport(Protocol):
    """Runs commands and moves files on one host.

    ``run`` takes a shell command line (already quoted by the caller with ``shlex.quote``)
    and returns its exit code and output; it never raises on a non-zero exit. ``input``
    is written to the command's stdin. ``timeout`` bounds the whole call in seconds.
    """

    name: str

    def run(self, command: str, *, input: str | bytes | None = None,
            timeout: float | None = None, env: dict[str, str] | None = None) -> RunResult: ...

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy one file to the host, atomically (temp name then rename); a leading ``~/``
        means the login home."""

    def get(self, remote_path: str, local_path: str) -> None:
        """Copy one file from the host."""

    def sync(self, local_dir: str, remote_dir: str, *, excludes: Sequence[str] = ()) -> dict:
        """Mirror a directory to the host; returns stats (``method``, ``files``, ``bytes``)."""

    def check(self) -> None:
        """Raise ``ConnectError`` with a hint if the host cannot be reached."""

    def close(self) -> None: ...
