"""Agent verbs of the health room: ``gpu`` (samples + verdict), ``reap`` (plan, and with
``kill`` execute), ``snapshot`` (everything ``gpurun watch`` shows for one host).

Shapes: ``GpuReply``, ``ReapReply`` and ``SnapshotReply`` in ``orchestrator.agent.protocol``.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, List

from orchestrator.agent import states as S
from orchestrator.agent.admission import reap_plan
from orchestrator.agent.context import AgentContext
from orchestrator.agent.gpus import gpu_report

SNAPSHOT_EVENTS = 20


def _public_gpu(rep: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in rep.items() if not k.startswith("_")}


def v_gpu(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    """``{probe, available, driver, no_driver, status, reasons, gpus: [sample + status + reasons]}``."""
    cfg = dict(ctx.config)
    if req.get("expect_gpus") is not None:
        cfg["expect_gpus"] = int(req["expect_gpus"])
    return _public_gpu(gpu_report(cfg))


def v_reap(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    """``{plan: {candidates, skipped, device_glob, min_age_s, all_users}, executed: [..] | null,
    free_after_reap_mib: {index: MiB}}``. Kills only when ``kill`` is true."""
    from orchestrator.health import reaper, watchdog

    try:
        cfg = watchdog.settings(ctx.config)
    except ValueError:
        cfg = watchdog.settings({})
    min_age = float(req.get("min_age_s", (ctx.config.get("reap") or {}).get("min_age_s", reaper.MIN_AGE_S)))
    plan = reap_plan(ctx, device_glob=req.get("device_glob") or cfg["device_glob"], min_age_s=min_age,
                          all_users=bool(req.get("all_users")))
    executed = None
    if req.get("kill"):
        executed = reaper.execute(plan, float(req.get("grace", 10.0)))
        for r in executed:
            ctx.store.add_event(None, "reaped", "warn", "VRAM zombie pid %d: %s" % (r["pid"], r["outcome"]),
                                dict(r, notify=False))
    rep = gpu_report(ctx.config)
    free = reaper.free_after_reap(plan, rep["_samples"])
    return {"plan": plan, "executed": executed, "free_after_reap_mib": {str(k): v for k, v in free.items()}}


def _job_row(job: Dict[str, Any], progress: Dict[str, Any], now: float) -> Dict[str, Any]:
    started = job.get("started_at")
    end = job.get("ended_at") or now
    p = progress.get(str(job["id"])) or {}
    if job["state"] == S.RUNNING and p.get("step") is None:
        # the watchdog has not ticked since this job started: read its progress now (a tail read)
        from orchestrator.quality.progress import metrics_path, read_progress
        step, loss = read_progress(metrics_path(job), job.get("log"))
        p = {"step": step, "loss": loss}
    return {"id": job["id"], "name": job.get("name"), "state": job["state"], "gpu_ids": job.get("gpu_ids") or [],
            "pid": job.get("pid"), "attempt": job.get("attempt"),
            "runtime_s": round(end - started, 1) if started else None,
            "step": p.get("step"), "loss": p.get("loss"), "reason": job.get("reason")}


def v_snapshot(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    """``{host, time, gpu: <gpu reply>, jobs: [..], findings: [..], events: [..], system: {..}}``:
    jobs are the active ones plus the last few finished; findings are the watchdog's last tick."""
    now = time.time()
    from orchestrator.agent.watchdog_hook import FINDINGS_KEY  # the tick's rooms load only for `watch`
    last = ctx.store.kv_get(FINDINGS_KEY, {}) or {}
    jobs = ctx.store.jobs([S.RUNNING, S.QUEUED])
    done = sorted(ctx.store.jobs(S.TERMINAL),
                  key=lambda j: j.get("ended_at") or 0)[-int(req.get("finished", 5)):]
    events: List[Dict[str, Any]] = ctx.store.events(0, None, SNAPSHOT_EVENTS, newest=True)
    return {
        "host": ctx.config.get("host") or ctx.config.get("name") or socket.gethostname(), "time": now,
        "gpu": _public_gpu(gpu_report(ctx.config)),
        "jobs": [_job_row(j, last.get("jobs") or {}, now) for j in jobs + done],
        "findings": last.get("findings") or [], "findings_at": last.get("at"),
        "system": last.get("host") or {},
        "events": [{k: e.get(k) for k in ("id", "ts", "job_id", "kind", "severity", "message")} for e in events],
    }
