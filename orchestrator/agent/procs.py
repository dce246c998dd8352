"""Process facts from /proc: boot identity, liveness by marker, process-group signals.

A pid alone proves nothing (pids are reused); a job's process counts as alive only when it
is not a zombie and its environment carries the job's marker ``GPURUN_JOB_TOKEN=<id>:<attempt>``.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Optional

PROC = "/proc"
MARKER = "GPURUN_JOB_TOKEN"


def boot_id() -> str:
    """The kernel's boot id; changes on every reboot (falls back to boot time)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "btime-%d" % int(time.time() - _uptime())


def _uptime() -> float:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def token(job_id: str, attempt: int) -> str:
    return "%s:%d" % (job_id, attempt)


def _is_zombie(pid: int) -> bool:
    try:
        with open("%s/%d/stat" % (PROC, pid), "rb") as f:
            data = f.read()
        return data[data.rfind(b")") + 2:][:1] in (b"Z", b"X")
    except OSError:
        return True


def _environ(pid: int) -> Optional[bytes]:
    try:
        with open("%s/%d/environ" % (PROC, pid), "rb") as f:
            return f.read()
    except OSError:
        return None


def alive_with_token(pid: Optional[int], tok: str) -> bool:
    """True if ``pid`` runs, is not a zombie, and carries the job's marker."""
    if not pid or pid <= 0:
        return False
    env = _environ(pid)
    if env is None or _is_zombie(pid):
        return False
    return ("%s=%s" % (MARKER, tok)).encode() in env.split(b"\0")


def _session(pid: int) -> int:
    try:
        with open("%s/%d/stat" % (PROC, pid), "rb") as f:
            data = f.read()
        return int(data[data.rfind(b")") + 2:].split()[4])
    except (OSError, ValueError, IndexError):
        return -1


def find_marked() -> Dict[str, int]:
    """Map token -> the session leader carrying it (the job's wrapper), else its lowest pid."""
    found: Dict[str, int] = {}
    prefix = ("%s=" % MARKER).encode()
    try:
        names = os.listdir(PROC)
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        env = _environ(pid)
        if not env or prefix not in env:
            continue
        for item in env.split(b"\0"):
            if item.startswith(prefix):
                tok = item[len(prefix):].decode("utf-8", "replace")
                if _is_zombie(pid):
                    continue
                if _session(pid) == pid or tok not in found:
                    found[tok] = pid
                elif _session(found[tok]) != found[tok] and pid < found[tok]:
                    found[tok] = pid
    return found


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by ``pid`` (each job is its own session)."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
            return True
        except OSError:
            return False
