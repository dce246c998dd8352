"""One SSH exec channel: feeding stdin, collecting output, timeouts; and the paramiko import.

Kept apart from ``ssh.py`` (connections, host keys, files) because this is the hot path of
every agent verb: one channel per command, output read until EOF or a quiet grace period.
"""

from __future__ import annotations

import select
import sys
import threading
import time

from orchestrator.errors import TransportError
from orchestrator.transport.base import RunResult

_CHUNK = 32768
_EOF_GRACE_S = 2.0


class LinkLost(Exception):
    """The connection died while a command ran (exit status never arrived)."""


_IMPORT_LOCK = threading.Lock()
_LOADED: list = []  # [paramiko] once fully imported


class _LazyInvoke:
    """Stands in for ``invoke`` in paramiko.config, imported on first use (``Match exec``)."""

    def __getattr__(self, attr: str):
        import invoke
        return getattr(invoke, attr)


def _paramiko():
    """paramiko, imported without ``invoke``: its config module imports invoke (~40 ms of
    unittest.mock, asyncio, yaml) only to evaluate ``Match exec``, so it gets it lazily."""
    if _LOADED:
        return _LOADED[0]
    with _IMPORT_LOCK:  # threads (status --all-hosts) wait here for a fully imported module
        if _LOADED:
            return _LOADED[0]
        block = "invoke" not in sys.modules and "paramiko" not in sys.modules
        if block:
            sys.modules["invoke"] = None  # type: ignore[assignment]  # import invoke -> ImportError
        try:
            import paramiko
        finally:
            if block and sys.modules.get("invoke", False) is None:
                del sys.modules["invoke"]
        if block and getattr(paramiko.config, "invoke", True) is None:
            paramiko.config.invoke = _LazyInvoke()
        _LOADED.append(paramiko)
    return paramiko


def pump(chan, stdin, timeout: float | None, name: str) -> RunResult:
    """Run the exec'd channel to completion. Raises TransportError on timeout, LinkLost when
    the connection died under the command."""
    deadline = time.monotonic() + timeout if timeout else None
    out: list[bytes] = []
    err: list[bytes] = []
    pending = b""
    source = None
    if isinstance(stdin, (bytes, bytearray)):
        pending = bytes(stdin)
    elif stdin is not None:
        source = stdin
    # no input: the command reads /dev/null (``ssh._guarded``) and is sent no EOF, which could
    # race the box's CLOSE; empty input: EOF now (the box drains its stdin until it comes)
    if stdin is not None and not pending and source is None:
        chan.shutdown_write()
    chan.setblocking(False)
    quiet_since: float | None = None
    while True:
        busy = False
        if source is not None and not pending:
            pending = source.read(_CHUNK)
            if not pending:
                source = None
                chan.shutdown_write()
        if pending and chan.send_ready():
            try:
                n = chan.send(pending[:_CHUNK])
            except (OSError, EOFError):  # remote closed its stdin early
                n, pending, source = 0, b"", None
            pending = pending[n:]
            busy = True
            if not pending and source is None:
                chan.shutdown_write()
        while chan.recv_ready():
            out.append(chan.recv(65536))
            busy = True
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
            busy = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            # sshd sends exit-status as soon as the command exits, possibly before all
            # of its output; EOF marks the end. A background child still holding
            # stdout would delay EOF forever, so stop after a quiet grace period.
            if chan.eof_received or chan.closed:
                break
            if busy or quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > _EOF_GRACE_S:
                break
        if deadline is not None and time.monotonic() > deadline:
            raise TransportError(f"{name}: command timed out after {timeout:g}s",
                                 hint="it may still be running on the box")
        if not busy:
            select.select([chan], [], [], 0.02 if pending else 0.05)
    code = chan.recv_exit_status()
    transport = chan.get_transport()
    if code == -1 and (transport is None or not transport.is_active()):
        raise LinkLost()
    return RunResult(code, b"".join(out).decode("utf-8", "replace"),
                     b"".join(err).decode("utf-8", "replace"))
