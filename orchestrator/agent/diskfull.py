"""The agent on a full disk: it keeps running, says "disk full", and loses no exit code.

What a full state-dir filesystem did before (issue 14): the daemon's error handler wrote the
traceback to ``agent.log`` on the same disk, that write raised, and the daemon died within
seconds; status still said ``running``; a job that exited 0 meanwhile was later recorded
``failed`` because its wrapper could not write the exit code. This module owns the agent's
side of the cure:

- ``is_full``: one test for "no space" across SQLite (``database or disk is full``) and the
  OS (``ENOSPC``, ``EDQUOT``), looking through chained exceptions (a failed ROLLBACK after a
  failed COMMIT hides the first error).
- ``SafeStream``: ``agent.log`` as the daemon's stderr, whose writes never raise.
- ``DiskWatch``: the daemon's state while the disk is full: a backoff for the loop, the
  ``agent.health`` file (allocated while there was room and rewritten in place, so it can be
  written when nothing else can) that the status verbs read, a notification sent from memory
  at once (the events table cannot take one), and the ``disk_full`` / ``disk_ok`` events
  written once writes work again.
- ``disk_status``: what ``status`` and ``agent_info`` say about the state dir's disk.

The wrapper keeps its exit code in memory and retries its write (``jobwrap``), so the runner,
which settles a job only once its wrapper is gone, never judges an unwritten exit code.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from typing import Any, Callable, Dict, Optional

HEALTH = "agent.health"
HEALTH_SIZE = 512           # bytes, allocated at daemon start and rewritten in place, never grown
BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)  # the loop's pauses while full; the last one repeats
FULL_BELOW = 16 * 1024      # free bytes under which the disk counts as full without a failed write
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
HINT = ("free space on the host (`df -h %s`; old checkpoints and logs are the usual culprits, `gpurun pull` "
        "them first), then run the command again; running jobs keep running and keep their exit codes")


def is_full(exc: Optional[BaseException]) -> bool:
    """True when ``exc`` (or an exception it was raised from or while handling) means "no space"."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower():
            return True  # SQLITE_FULL: "database or disk is full"
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def free_bytes(path: str) -> Optional[int]:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem; None if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def full_free(path: str) -> Optional[int]:
    """The free bytes of ``path``'s disk when it counts as full (under ``FULL_BELOW``; 0 is full),
    else None (room, or unknown)."""
    free = free_bytes(path)
    return free if free is not None and free < FULL_BELOW else None


class SafeStream:
    """A text stream whose writes and flushes never raise: a log line lost to a full disk must
    not take the daemon with it. ``dropped`` counts the writes that failed."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.dropped = 0

    def write(self, text: Any) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ENOSPC, EIO, or a closed file at exit
            self.dropped += 1
            return 0

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self.dropped += 1

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _health_path(state_dir: str) -> str:
    return os.path.join(state_dir, HEALTH)


def write_health(state_dir: str, record: Dict[str, Any]) -> bool:
    """Rewrite ``agent.health`` in place (same size: no new block is needed on a full disk);
    creates it (padded) when missing. False when it could not be written."""
    data = json.dumps(record, sort_keys=True).encode()[:HEALTH_SIZE - 1]
    data = data + b"\n" + b" " * (HEALTH_SIZE - len(data) - 1)
    path = _health_path(state_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        os.pwrite(fd, data, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read_health(state_dir: str) -> Dict[str, Any]:
    try:
        with open(_health_path(state_dir), "rb") as f:
            return json.loads(f.read(HEALTH_SIZE).split(b"\n", 1)[0] or b"{}")
    except (OSError, ValueError):
        return {}


def disk_status(state_dir: str) -> Optional[Dict[str, Any]]:
    """``{"full": True, "since", "message", "hint", "free_bytes"}`` while the state dir's disk is
    full (as the daemon found it, or as ``statvfs`` shows it now); None when it is fine."""
    rec = read_health(state_dir)
    free = free_bytes(state_dir)
    full_now = free is not None and free < FULL_BELOW
    if not rec.get("disk_full") and not full_now:
        return None
    since = rec.get("since") if rec.get("disk_full") else None
    left = "?" if free is None else "%d KiB" % (free // 1024)
    if not full_now:  # the daemon has not had its next pass since space came back
        message = "disk full until a moment ago: %s has %s free again; the agent is catching up" % (state_dir, left)
    else:
        message = "disk full: %s has %s free%s" % (
            state_dir, left, "; the agent cannot record job changes (%s)" % rec["error"] if rec.get("error") else "")
    return {"full": True, "since": since, "message": message, "hint": HINT % state_dir, "free_bytes": free}


class DiskWatch:
    """The daemon's memory of a full disk; ``full`` on every no-space failure, ``passed`` after
    every pass of the loop that raised nothing."""

    def __init__(self, state_dir: str, notify: Optional[Callable[[Dict[str, Any]], Any]] = None):
        self.state_dir = state_dir
        self.notify = notify          # sends an event dict from memory (the webhook notifier)
        self.since: Optional[float] = None
        self.error = ""
        self.failures = 0
        self.notified = False
        write_health(state_dir, {"disk_full": False})  # allocate it now, while there is room

    def full(self, exc: BaseException) -> float:
        """A write failed for want of space: remember since when, say so, and return the pause."""
        now = time.time()
        if self.since is None:
            self.since = now
            self.error = str(exc)[:200]
            write_health(self.state_dir, {"disk_full": True, "since": now, "error": self.error})
        if not self.notified and self.notify is not None:
            try:
                self.notify({"kind": "disk_full", "severity": "error", "job_id": None, "ts": now,
                             "message": self._message(), "data": {"since": self.since, "error": self.error}})
                self.notified = True
            except Exception:  # noqa: BLE001 - a notifier problem is no reason to stop guarding jobs
                pass
        pause = BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)]
        self.failures += 1
        return pause

    def check(self) -> None:
        """Raise ENOSPC when ``statvfs`` shows the disk full: called after a pass that raised
        nothing (it may have written nothing), so "full" is never cleared while it still is."""
        free = full_free(self.state_dir)
        if free is not None:
            raise OSError(errno.ENOSPC, "no space left on the state dir's disk (%d bytes free)" % free)

    def passed(self, store: Any) -> None:
        """A pass raised nothing: if the disk was full, it is not any more. The events that
        could not be written then are written now (the notification went out already)."""
        if self.since is None:
            return
        now = time.time()
        took = now - self.since
        store.add_event(None, "disk_full", "error", self._message(),
                        {"since": self.since, "until": now, "error": self.error, "notify": not self.notified})
        store.add_event(None, "disk_ok", "info", "disk space is back after %.0fs; the agent caught up (exit codes "
                        "held by the jobs' wrappers were kept)" % took, {"since": self.since, "until": now})
        self.since, self.error, self.failures, self.notified = None, "", 0, False
        write_health(self.state_dir, {"disk_full": False, "last_full_until": now})

    def _message(self) -> str:
        free = free_bytes(self.state_dir)
        return "disk full on the agent's state dir %s (%s free): %s; jobs keep running, their exit codes are " \
               "kept and recorded once there is space" % (self.state_dir, "?" if free is None else
                                                          "%d KiB" % (free // 1024), self.error or "no space")
