"""The agent's watchdog tick: sample GPUs and the host, check running jobs, write findings as
events, apply the profile's policy (record / notify / kill / requeue), and forward events to
the notifier (job failures, findings, queue done) without ever blocking on the network.

The daemon calls ``tick(ctx)`` every ``watchdog.interval_s``; state between ticks lives in the
store's kv table (``watchdog.state``), so an agent restart neither repeats nor loses findings.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from orchestrator.agent.procs import signal_group
from orchestrator.health.probe import FAKE_ENV, open_probe
from orchestrator.health.verdict import host_verdict

# notify (urllib), reaper, system and watchdog load inside the functions that use them: the
# one-shot ``gpu`` and ``snapshot`` verbs run from a zipapp that recompiles every module it imports.

STATE_KEY = "watchdog.state"
FINDINGS_KEY = "watchdog.findings"
NOTIFY_KEY = "notify.last_event_id"
QUEUE_KEY = "watchdog.queue_busy"
_PROBES: Dict[str, Any] = {}


def probe() -> Any:
    """One probe per process and fake path: NVML init and its event set are kept between ticks."""
    key = os.environ.get(FAKE_ENV, "")
    if key not in _PROBES:
        _PROBES[key] = open_probe()
    return _PROBES[key]


def gpu_report(config: Dict[str, Any], the_probe: Any = None) -> Dict[str, Any]:
    """Samples plus verdict for this host: the shape ``gpu`` and ``snapshot`` reply with."""
    try:
        p = the_probe or probe()
        samples = p.samples()
    except Exception as exc:  # a broken fake file or driver hiccup: report, do not crash
        return {"probe": "error", "available": False, "driver": None, "no_driver": "GPU probe failed: %s" % exc,
                "status": "WARN", "reasons": [{"code": "probe_error", "status": "WARN", "message": str(exc)}],
                "gpus": [], "_samples": []}
    verdict = host_verdict(samples, expected=config.get("expect_gpus"), available=p.available,
                           no_driver_reason=p.reason)
    rows = []
    for s, v in zip(samples, verdict["gpus"]):
        row = s.to_dict()
        row.update(status=v["status"], reasons=v["reasons"])
        rows.append(row)
    return {"probe": p.kind, "available": p.available, "driver": p.driver_version() if p.available else None,
            "no_driver": None if p.available else p.reason, "status": verdict["status"],
            "reasons": verdict["reasons"], "gpus": rows, "_samples": samples, "_verdict": verdict}


def reap_plan(ctx: Any, **kw: Any) -> Dict[str, Any]:
    """``reaper.plan`` with this agent's running jobs (ids and pids) protected."""
    from orchestrator.health import reaper

    running = ctx.store.jobs(["running"])
    return reaper.plan([j["id"] for j in running], [j["pid"] for j in running if j.get("pid")], **kw)


def admission(ctx: Any, gpu_ids: List[int], need_mib: Optional[float] = None) -> Dict[str, Any]:
    """Admission check for the runner before placing a job on ``gpu_ids``: MiB free per GPU
    once VRAM zombies are gone; reaps them first only when the profile opts in
    (``reap: {auto: true}``). Returns ``{ok, free_mib, zombies, reaped}``."""
    from orchestrator.health import reaper

    opts = ctx.config.get("reap") or {}
    plan = reap_plan(ctx, min_age_s=float(opts.get("min_age_s", reaper.MIN_AGE_S)))
    rep = gpu_report(ctx.config)
    zombies = reaper.zombies_by_gpu(plan, rep["_samples"])
    mine = sorted({pid for g in gpu_ids for pid in zombies.get(g, [])})
    reaped: List[Dict[str, Any]] = []
    if mine and opts.get("auto"):
        reaped = reaper.execute({"candidates": [c for c in plan["candidates"] if c["pid"] in mine]},
                                float(opts.get("grace_s", 10.0)))
        for r in reaped:
            ctx.store.add_event(None, "reaped", "warn", "auto-reaped VRAM zombie pid %d on GPU %s: %s"
                                % (r["pid"], ",".join(map(str, gpu_ids)), r["outcome"]), dict(r, notify=False))
        rep = gpu_report(ctx.config)
        plan = {"candidates": []}
    free = reaper.free_after_reap(plan, rep["_samples"])
    ok = need_mib is None or all((free.get(g) or 0.0) >= need_mib for g in gpu_ids)
    return {"ok": ok, "free_mib": {g: free.get(g) for g in gpu_ids}, "zombies": mine, "reaped": reaped}


def storage_paths(ctx: Any, cfg: Dict[str, Any], jobs: List[Dict[str, Any]]) -> List[str]:
    """Every storage tier a job can fill: state dir, workdir, /, tmp, profile paths, job dirs."""
    paths = [ctx.state_dir, ctx.config.get("workdir"), "/", tempfile.gettempdir()] + list(cfg["paths"])
    for j in jobs:
        paths += [j.get("cwd"), j.get("run_dir"), j.get("checkpoints")]
    out = []
    for p in paths:
        if p and p not in out and os.path.exists(p):
            out.append(p)
    return out


def _stop_job(ctx: Any, job: Dict[str, Any], finding: Dict[str, Any], action: str) -> Dict[str, Any]:
    """kill: cancel the job (TERM then KILL, no retry). requeue: TERM it with a watchdog reason
    so the runner's retry budget decides the next attempt."""
    jid, pid = job["id"], job.get("pid")
    # stop_cause tells the runner how the attempt ends (see runner.STOP_OUTCOME); reason is for people
    fields: Dict[str, Any] = {"reason": "watchdog %s: %s" % (action, finding["message"]),
                              "stop_cause": "watchdog" if action == "kill" else "watchdog_requeue"}
    if action == "kill":
        fields["cancel_requested"] = 1
    ctx.store.update_fields(jid, ["running"], **fields)
    runner = getattr(ctx, "runner", None)
    if runner is not None and pid:
        if action == "requeue":
            runner.signal_job(jid, pid, "watchdog_requeue")
        # kill: the runner sees cancel_requested on its next pass and escalates TERM -> KILL
    elif pid:
        grace = float(ctx.config.get("kill_grace_s", 10.0))
        signal_group(pid, signal.SIGTERM)
        t = threading.Timer(grace, signal_group, (pid, signal.SIGKILL))
        t.daemon = True
        t.start()
    return {"action": action, "job_id": jid, "pid": pid, "code": finding["code"], "reason": fields["reason"]}


def _queue_done(ctx: Any, now: float) -> None:
    busy = bool(ctx.store.jobs(["queued", "running"]))
    was = ctx.store.kv_get(QUEUE_KEY, False)
    if was and not busy:
        done = ctx.store.jobs(["succeeded", "failed", "cancelled", "quality_stopped"])
        counts: Dict[str, int] = {}
        for j in done:
            counts[j["state"]] = counts.get(j["state"], 0) + 1
        ctx.store.add_event(None, "queue_done", "info", "queue done: " + ", ".join(
            "%d %s" % (n, s) for s, n in sorted(counts.items())), {"counts": counts})
    if busy != was:
        ctx.store.kv_set(QUEUE_KEY, busy)


def _forward(ctx: Any, notifier: Any) -> int:
    """Send every new event the notifier wants; record failed deliveries (never re-sent)."""
    from orchestrator.agent import notify

    last = ctx.store.kv_get(NOTIFY_KEY)
    events = ctx.store.events(int(last or 0), None, 500)
    if last is None:  # first run: do not flood the channel with history
        ctx.store.kv_set(NOTIFY_KEY, events[-1]["id"] if events else 0)
        events = [e for e in events if e["kind"] in notify.ALWAYS or e["ts"] >= time.time() - 300]
    sent = 0
    if notifier is not None:
        for res in notifier.drain_results():
            if not res["ok"]:
                ctx.store.add_event(None, "notify_failed", "warn", "%s webhook (%s) failed after %s attempt(s): %s"
                                    % (res["kind"], res["url_env"], res.get("attempts"), res.get("error")),
                                    {"notify": False})
        for e in events:
            if (e.get("data") or {}).get("notify") is False or e["kind"] == "notify_failed":
                continue
            sent += notifier.send({k: e.get(k) for k in ("kind", "severity", "job_id", "message", "data", "ts")})
    if events:
        ctx.store.kv_set(NOTIFY_KEY, events[-1]["id"])
    return sent


def tick(ctx: Any, now: Optional[float] = None, the_probe: Any = None,
         proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup", statvfs: Any = os.statvfs) -> List[Dict[str, Any]]:
    """One watchdog pass. Returns the kill/requeue actions it applied (for the runner)."""
    from orchestrator.health import reaper, system, watchdog

    now = time.time() if now is None else now
    try:
        cfg = watchdog.settings(ctx.config)
    except ValueError as exc:
        ctx.store.add_event(None, "watchdog_config", "error", "bad watchdog config, using defaults: %s" % exc)
        cfg = watchdog.settings({})
    jobs = ctx.store.jobs(["running"])
    gpu = gpu_report(ctx.config, the_probe)
    gpu_jobs = [j for j in jobs if (j.get("gpus") or 0) > 0 or j.get("gpu_ids")]
    holders = {h["pid"] for h in reaper.scan_holders(cfg["device_glob"], proc)} if gpu_jobs else set()
    kids = system.children_map(proc) if jobs else {}
    prev = ctx.store.kv_get(STATE_KEY, {}) or {}
    prev_jobs = prev.get("jobs") or {}
    from orchestrator.quality import progress  # the judge's step/loss parsing, as a tail read
    obs = [watchdog.observe_job(j, kids, holders, prev_jobs.get(str(j["id"])) or {}, proc, progress)
           for j in jobs]
    host = {"cgroup": system.cgroup_memory(cgroup_root, proc),
            "disks": system.disk_usage(storage_paths(ctx, cfg, jobs), statvfs),
            "boot_id": system.boot_id(proc), "gpu_available": gpu["available"],
            "gpu_verdict": gpu.get("_verdict")}
    findings, state = watchdog.evaluate(obs, gpu["_samples"], host, prev, cfg, now)
    new, cleared = watchdog.new_and_cleared(findings, prev)
    by_id = {str(j["id"]): j for j in jobs}
    actions = []
    for f in new:
        action = cfg["policy"].get(f["code"], "record")
        data = dict(f["data"], code=f["code"], key=f["key"], action=action, notify=action != "record")
        ctx.store.add_event(f["job_id"], f["code"], f["severity"], f["message"], data)
        if action in ("kill", "requeue") and f["job_id"] in by_id:
            actions.append(_stop_job(ctx, by_id[f["job_id"]], f, action))
    for key in cleared:
        code, jid, subject = (key.split("|", 2) + ["", ""])[:3]
        ctx.store.add_event(jid or None, "cleared", "info", "%s%s no longer holds" % (
            code, " (%s)" % subject if subject else ""), {"key": key, "code": code, "notify": False})
    ctx.store.kv_set(STATE_KEY, state)
    ctx.store.kv_set(FINDINGS_KEY, {"at": now, "findings": findings, "host": {
        k: host[k] for k in ("cgroup", "disks", "boot_id")}, "jobs": {o["job_id"]: {
            "step": o["step"], "loss": o["loss"], "alive": o["alive"]} for o in obs}})
    flush_notifications(ctx, now)
    return actions


def flush_notifications(ctx: Any, now: Optional[float] = None) -> None:
    """Record queue-done and send new events. Cheap (events since the last id), so the
    daemon also calls it every few seconds: a failed job is reported within seconds, not
    at the next watchdog tick."""
    from orchestrator.agent import notify

    _queue_done(ctx, time.time() if now is None else now)
    try:
        notifier = notify.notifier_for(ctx.state_dir, ctx.config)
    except ValueError as exc:
        if ctx.store.kv_get("notify.bad_config") != str(exc):
            ctx.store.kv_set("notify.bad_config", str(exc))
            ctx.store.add_event(None, "notify_config", "error", "notifications off: %s" % exc, {"notify": False})
        notifier = None
    _forward(ctx, notifier)
