"""The controller-side copy of each SSH host's job table: ``data_home()/hosts/<name>/jobs.json``.

Written after every successful ``submit`` / ``status`` round trip (see ``AgentClient.submit`` and ``status``) so
``gpurun recover`` can move a preempted box's queue without asking the dead box. Submit
contributes the full job spec (env, source); status refreshes state and attempt.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from orchestrator import paths
from orchestrator.agent import protocol as P

SCHEMA = "gpurun/JOBS-SNAPSHOT/v1"
# what a job was submitted with, and what status refreshes: the protocol's shapes, not copies
SPEC_KEYS = tuple(k for k in P.JobSpec.__annotations__ if k != "attempt")
STATUS_KEYS = P.JOB_KEYS


def snapshot_file(host_name: str) -> Path:
    return paths.data_home() / "hosts" / host_name / "jobs.json"


def load(host_name: str) -> dict:
    """``{"schema", "host", "updated_at", "jobs": {id: job}}``; empty when never recorded."""
    try:
        data = json.loads(snapshot_file(host_name).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("jobs"), dict):
            return data
    except (OSError, ValueError):
        pass  # a torn or missing snapshot is the same as none: the live agent is the truth
    return {"schema": SCHEMA, "host": host_name, "updated_at": None, "jobs": {}}


def jobs(host_name: str, snap: dict | None = None) -> list[dict]:
    """The recorded jobs of a host in submission order (``seq`` when known); ``snap`` is an
    already loaded snapshot, so a caller that needs both reads the file once."""
    rows = list((snap if snap is not None else load(host_name))["jobs"].values())
    return sorted(rows, key=lambda j: (j.get("seq") is None, j.get("seq") or 0, j.get("submitted_at") or 0))


def record(host: dict, verb: str, request: dict, result: dict) -> None:
    """Merge one successful agent reply into the host's snapshot. Local hosts are skipped
    (their store is on this machine). Never raises: a snapshot is a convenience."""
    if host.get("kind", "local") == "local" or verb not in ("submit", "status"):
        return
    try:
        _merge(host["name"], verb, request, result)
    except (OSError, ValueError, TypeError, KeyError):
        pass


def _merge(name: str, verb: str, request: dict, result: dict) -> None:
    path = snapshot_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name("jobs.lock"), "a") as lk:
        fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
        data = load(name)
        table: dict[str, Any] = data["jobs"]
        now = time.time()
        if verb == "submit":
            added = set(result.get("added") or [])
            for spec in request.get("jobs") or []:
                row = table.setdefault(spec["id"], {})
                row.update({k: spec.get(k) for k in SPEC_KEYS if k in spec})
                if spec["id"] in added:
                    row.setdefault("state", "queued")
                    row.setdefault("attempt", int(spec.get("attempt") or 0))
        else:
            for job in result.get("jobs") or []:
                table.setdefault(job["id"], {}).update({k: job.get(k) for k in STATUS_KEYS if k in job})
        data.update(schema=SCHEMA, host=name, updated_at=now)
        _write(path, data)


def mark_moved(host_name: str, ids: list[str], to_host: str) -> None:
    """Note on the lost box's snapshot where its jobs went (a second recover skips them)."""
    path = snapshot_file(host_name)
    if not ids or not path.exists():
        return
    with open(path.with_name("jobs.lock"), "a") as lk:
        fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
        data = load(host_name)
        for jid in ids:
            if jid in data["jobs"]:
                data["jobs"][jid]["moved_to"] = to_host
        _write(path, data)


def _write(path: Path, data: dict) -> None:
    """Replace the snapshot in one rename (the caller holds ``jobs.lock``)."""
    tmp = path.with_name(f"jobs.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)
