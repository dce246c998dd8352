"""Shared rendering helpers for the CLI: rich tables, state colours, durations, JSON out."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.core.queue import Job

STATE_STYLE = {"queued": "cyan", "running": "yellow", "succeeded": "green", "failed": "red",
               "cancelled": "magenta", "quality_stopped": "bold red"}


def console(stderr: bool = False) -> Any:
    from rich.console import Console
    # messages on stderr are never wrapped (they get grepped and logged); tables on stdout fit the terminal
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def json_job(j: Job) -> dict[str, Any]:
    """The documented ``--json`` shape of one job (README, "JSON contract"): a projection of
    the wire job with ``seq`` as ``number`` and the times as ISO 8601 UTC."""
    return {"id": j["id"], "number": j["seq"], "name": j["name"], "state": j["state"],
            "exit_code": j["exit_code"], "attempt": j["attempt"], "gpus": j["gpus"], "gpu_ids": j["gpu_ids"],
            "command": j["command"], "cwd": j["cwd"], "log": j["log"], "run_dir": j["run_dir"],
            "reason": j["reason"], "submitted_at": iso(j["submitted_at"]), "started_at": iso(j["started_at"]),
            "ended_at": iso(j["ended_at"])}
