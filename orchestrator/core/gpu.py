"""Use case ``gpu``: one host's GPU health verdict (Xid, ECC, throttling, heat, lost or
missing GPUs), as the agent on the box judges it, and the command's exit code.
"""

from __future__ import annotations

from typing import Any, Optional

from orchestrator.health.verdict import exit_code as _exit_code

__all__ = ["exit_code", "gpu_report"]


def gpu_report(host: Optional[str] = None, expect: Optional[int] = None) -> tuple[str, dict[str, Any]]:
    """``(host name, verdict)`` for ``host`` (default: local, or $GPURUN_HOST); ``expect`` GPUs
    overrides the host's ``expect_gpus``. One round trip. Raises HostError, TransportError."""
    from orchestrator.core.session import open_session

    with open_session(host) as s:
        return s.host["name"], dict(s.gpu(expect))


def exit_code(status: str) -> int:
    """The ``gpurun gpu`` contract: 0 for PASS or WARN, 2 for FAIL (so a script can re-rent)."""
    return _exit_code(status)
