"""Files over the SSH connection's one SFTP session, and the lock that keeps its replies apart.

``SSHTransport`` (``transport/ssh.py``) owns the connection; this module owns what rides on
its SFTP subsystem: opening the session (asked twice when a box closes it at once), the
atomic ``put``, ``get``, ``mkdir -p``, and ``sftp_session()``, the one door for any other
SFTP user (the pull's ``SftpFetcher``, ``ssh_sync``'s fallback).

Why a lock: paramiko's ``SFTPClient`` reads replies without one. A thread waiting for its
reply can read and drop another thread's (which then waits forever), or two threads read
halves of one packet ("Garbage packet received"). So every SFTP use holds ``_sftp_lock``
from its first request to its last reply: a push (``put``) and a pull's file on one client
take turns, a whole file each (``tests/sync/test_sftp_shared_client.py``).
"""

from __future__ import annotations

import os
import posixpath
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from orchestrator.errors import OperationalError, TransportError
from orchestrator.transport.base import sftp_path
from orchestrator.transport.channel import _paramiko

if TYPE_CHECKING:
    import threading


class SFTPFiles:
    """The SFTP half of ``SSHTransport`` (a mixin: it uses the transport's connection)."""

    name: str
    _sftp: Any
    _lock: "threading.RLock"       # the connection's
    _sftp_lock: "threading.RLock"  # one SFTP user at a time; taken before ``_lock``

    connect: Callable[[], Any]       # SSHTransport's: open (or reuse) the connection
    _alive: Callable[[], bool]

    def sftp(self):
        """The connection's one SFTP session, for a caller that already holds
        ``_sftp_lock``; anyone else uses ``sftp_session()``."""
        paramiko = _paramiko()

        with self._lock:
            return self._open_sftp(paramiko)

    @contextmanager
    def sftp_session(self) -> Iterator[Any]:
        """The SFTP session, held for the ``with`` block: no other thread's request goes out
        until the block ends. A session that failed under the block (the link, not a file: an
        ``OSError`` is the box's answer about a file) is dropped, so the next one is fresh."""
        with self._sftp_lock:
            sftp = self.sftp()
            try:
                yield sftp
            except OSError:
                raise
            except BaseException:  # EOFError, SSHException, a garbled packet, Ctrl-C
                if self._sftp is sftp:
                    self._sftp = None
                raise

    def _open_sftp(self, paramiko):
        # Opened twice at most: a subsystem channel the box closed at once (EOFError; seen once
        # in ~5 CI runs with 8 verbs opening channels together) is asked again before the
        # gateway is blamed. Nothing was sent on it, so asking again is safe.
        for attempt in (0, 1):
            if self._sftp is not None and self._alive():
                break
            client = self.connect()
            try:
                self._sftp = client.open_sftp()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._sftp = None
                if attempt:
                    raise TransportError(f"{self.name}: SFTP unavailable: {reason(exc)}",
                                         hint="some gateways (e.g. RunPod basic SSH) have no SFTP; "
                                              "use the box's direct SSH port") from None
                time.sleep(0.2)
        return self._sftp

    def _mkdirs(self, sftp, path: str) -> None:
        if path in ("", ".", "/"):
            return
        try:
            sftp.stat(path)
            return
        except OSError:
            pass
        self._mkdirs(sftp, posixpath.dirname(path.rstrip("/")))
        try:
            sftp.mkdir(path)
        except OSError:
            sftp.stat(path)  # created concurrently is fine; otherwise re-raise

    def put(self, local_path: str, remote_path: str) -> None:
        """Upload to a temp name beside the target, then rename over it (atomic)."""
        target = sftp_path(remote_path)
        parent, base = posixpath.split(target)
        tmp = posixpath.join(parent, f".{base}.gpurun-{uuid.uuid4().hex[:8]}")
        with self._sftp_lock:
            sftp = self.sftp()
            try:
                self._mkdirs(sftp, parent)
                sftp.put(local_path, tmp)
                sftp.chmod(tmp, os.stat(local_path).st_mode & 0o777)
                sftp.posix_rename(tmp, target)
            except EOFError:
                self._sftp = None  # the session closed under the upload: the next call opens one
                raise TransportError(f"{self.name}: the SFTP session closed while writing {remote_path}",
                                     hint="nothing was renamed into place; run the command again") from None
            except OSError as exc:
                try:
                    sftp.remove(tmp)
                except OSError:
                    pass
                raise TransportError(f"{self.name}: cannot write {remote_path}: {reason(exc)}",
                                     hint="check free space and permissions on the box",
                                     retryable=False) from None

    def get(self, remote_path: str, local_path: str) -> None:
        local = Path(local_path)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.gpurun-{uuid.uuid4().hex[:8]}")
        try:
            with self._sftp_lock:
                self.sftp().get(sftp_path(remote_path), str(tmp))
            os.replace(tmp, local)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise OperationalError(f"{self.name}: no such file {remote_path}") from None
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise TransportError(f"{self.name}: cannot read {remote_path}: {reason(exc)}") from None


def reason(exc: BaseException) -> str:
    """An SSH or SFTP failure in one short line, for an error message."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
