"""The agent's view of its jobs' processes: boot identity, liveness by marker, group signals.

The facts (the /proc table, the zombie rule, the ``GPURUN_JOB_TOKEN`` marker) live in
``orchestrator.health.procs`` so the watchdog and the reaper read them the same way; this
module adds only what the agent does with them: signal a job's process group.
"""

from __future__ import annotations

import os

from orchestrator.health import system
from orchestrator.health.procs import MARKER, alive_with_token, find_marked, token

__all__ = ["MARKER", "alive_with_token", "boot_id", "find_marked", "signal_group", "token"]


def boot_id() -> str:
    """The kernel's boot id (``health.system.boot_id``); "" when the host hides it."""
    return system.boot_id() or ""


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
