"""The verbs the CLI sends to the agent: one request in (JSON on stdin), one framed reply out.

Client verbs only insert queued rows, set cancel flags, or (retry) start a new attempt of a
finished job; everything else is the runner's. Extension rooms add verbs through their own
``verbs_*`` modules, merged in ``all_verbs``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict

from orchestrator.agent import AGENT_VERSION, daemon
from orchestrator.agent import states as S

JOB_KEYS = ("id", "seq", "name", "state", "exit_code", "attempt", "gpus", "gpu_ids", "command", "cwd", "log",
            "run_dir", "metrics", "checkpoints", "retries", "timeout_s", "pid", "reason", "submitted_at",
            "started_at", "ended_at")


class VerbError(Exception):
    """A request the agent refuses; ``kind`` maps to the client's error tree."""

    def __init__(self, message: str, kind: str = "bad_input", hint: str = ""):
        super().__init__(message)
        self.kind = kind
        self.hint = hint


def public(job: dict) -> dict:
    return {k: job.get(k) for k in JOB_KEYS}


def _find(ctx: Any, ref: Any) -> dict:
    job = ctx.store.get_job(ref)
    if job is None:
        raise VerbError("no job %r on this host" % str(ref), "not_found",
                        "see `gpurun queue status` for job names, ids and numbers")
    return job


def v_ping(ctx: Any, req: dict) -> dict:
    info = daemon.running_daemon(ctx.state_dir)
    return {"agent_version": AGENT_VERSION, "daemon": info, "time": time.time(), "pid": os.getpid()}


def v_submit(ctx: Any, req: dict) -> dict:
    runs = os.path.join(ctx.state_dir, "runs")
    rows = []
    for j in req.get("jobs", []):
        run_dir = os.path.join(runs, j["id"])
        # paths from profiles ("~/gpurun/work") are the box's: only the agent knows its HOME
        paths = {k: os.path.expanduser(j[k]) for k in ("cwd", "metrics", "checkpoints") if j.get(k)}
        rows.append(dict(j, run_dir=run_dir, log=os.path.join(run_dir, "log.txt"), **paths))
    added, present = ctx.store.insert_jobs(rows)
    for jid in added:
        os.makedirs(os.path.join(runs, jid), exist_ok=True)
    daemon.wake(ctx.state_dir)
    return {"added": added, "present": present, "code": _code_record(ctx.state_dir)}


def _code_record(state_dir: str) -> Any:
    """The record ``gpurun push`` left on the box, so submit can warn about stale code
    without another round trip."""
    try:
        with open(os.path.join(state_dir, "code_hash")) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def v_status(ctx: Any, req: dict) -> dict:
    refs = req.get("jobs")
    jobs = [_find(ctx, r) for r in refs] if refs else ctx.store.jobs()
    return {"jobs": [public(j) for j in jobs], "daemon": daemon.running_daemon(ctx.state_dir)}


def v_logs(ctx: Any, req: dict) -> dict:
    job = _find(ctx, req["job"])
    offset = int(req.get("offset", -1))
    limit = int(req.get("limit", 1 << 20))
    data = b""
    try:
        size = os.path.getsize(job["log"])
        if offset < 0:  # tail: start ``tail_bytes`` before the end
            offset = max(0, size - int(req.get("tail_bytes", 64 * 1024)))
        with open(job["log"], "rb") as f:
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        offset = max(offset, 0)
    return {"job": public(job), "data": data.decode("utf-8", "replace"), "offset": offset + len(data)}


def v_cancel(ctx: Any, req: dict) -> dict:
    jobs = ctx.store.jobs(S.ACTIVE) if req.get("all") else [_find(ctx, r) for r in req.get("jobs", [])]
    out = []
    for job in jobs:
        if job["state"] == S.QUEUED and ctx.store.transition(job["id"], [S.QUEUED], S.CANCELLED,
                                                             ended_at=time.time(), reason="cancelled by user"):
            out.append({"id": job["id"], "name": job["name"], "result": "cancelled"})
        elif ctx.store.update_fields(job["id"], [S.QUEUED, S.RUNNING], cancel_requested=1):
            out.append({"id": job["id"], "name": job["name"], "result": "stopping"})
        else:
            out.append({"id": job["id"], "name": job["name"], "result": "already %s" % job["state"]})
    daemon.wake(ctx.state_dir)
    return {"cancelled": out}


def v_retry(ctx: Any, req: dict) -> dict:
    job = _find(ctx, req["job"])
    if not S.is_terminal(job["state"]):
        raise VerbError("job %s is %s; only a finished job can be retried" % (job["name"], job["state"]),
                        "bad_input", "cancel it first with `gpurun queue cancel %s`" % job["name"])
    force = bool(req.get("force"))
    ok = ctx.store.transition(job["id"], [job["state"]], S.QUEUED, user_retry=True, attempt_base=job["attempt"],
                              cancel_requested=0, force_resume=1 if force else 0, exit_code=None, ended_at=None,
                              reason="retry requested%s" % (" with --force" if force else ""))
    if not ok:
        raise VerbError("job %s changed state while retrying; try again" % job["name"], "conflict")
    daemon.wake(ctx.state_dir)
    return {"job": public(ctx.store.get_job(job["id"])), "next_attempt": job["attempt"] + 1}


def v_events(ctx: Any, req: dict) -> dict:
    job_id = _find(ctx, req["job"])["id"] if req.get("job") else None
    return {"events": ctx.store.events(int(req.get("since_id", 0)), job_id, int(req.get("limit", 1000)),
                                       newest=bool(req.get("newest")))}


VERBS: Dict[str, Callable[[Any, dict], dict]] = {
    "ping": v_ping, "submit": v_submit, "status": v_status, "logs": v_logs, "cancel": v_cancel,
    "retry": v_retry, "events": v_events,
}


EXTENSIONS = ("verbs_health", "verbs_quality", "verbs_sync")


def lookup(name: str) -> Callable[[Any, dict], dict]:
    """The handler of verb ``name``; extension rooms are imported only when needed."""
    if name in VERBS:
        return VERBS[name]
    for ext in EXTENSIONS:
        try:
            mod = __import__("orchestrator.agent." + ext, fromlist=["VERBS"])
        except ImportError:
            continue
        if name in getattr(mod, "VERBS", {}):
            return mod.VERBS[name]
    raise VerbError("unknown agent verb %r" % name, "bad_input", "the CLI and agent versions may differ")
