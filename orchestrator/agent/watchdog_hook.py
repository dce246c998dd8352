"""The agent's watchdog tick: sample GPUs and the host, check running jobs, write findings as
events and apply the profile's policy (record / notify / kill / requeue).

The daemon calls ``tick(ctx)`` every ``watchdog.interval_s``; state between ticks lives in the
store's kv table (``watchdog.state``), so an agent restart neither repeats nor loses findings.
The GPU report is ``gpus.gpu_report``; forwarding events to webhooks is ``notifications``.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from orchestrator.agent import states as S
from orchestrator.agent.context import AgentContext
from orchestrator.agent.gpus import gpu_report
from orchestrator.agent.notifications import flush_notifications
from orchestrator.agent.procs import signal_group
from orchestrator.health import reaper, system, watchdog
from orchestrator.quality import progress  # the judge's step/loss parsing, as a tail read

STATE_KEY = "watchdog.state"
FINDINGS_KEY = "watchdog.findings"


def storage_paths(ctx: AgentContext, cfg: Dict[str, Any], jobs: List[Dict[str, Any]]) -> List[str]:
    """Every storage tier a job can fill: state dir, workdir, /, tmp, profile paths, job dirs."""
    paths = [ctx.state_dir, ctx.config.get("workdir"), "/", tempfile.gettempdir()] + list(cfg["paths"])
    for j in jobs:
        paths += [j.get("cwd"), j.get("run_dir"), j.get("checkpoints")]
    out = []
    for p in paths:
        if p and p not in out and os.path.exists(p):
            out.append(p)
    return out


def _stop_job(ctx: AgentContext, job: Dict[str, Any], finding: Dict[str, Any], action: str) -> Dict[str, Any]:
    """kill: cancel the job (TERM then KILL, no retry). requeue: TERM it with a watchdog reason
    so the runner's retry budget decides the next attempt."""
    jid, pid = job["id"], job.get("pid")
    # stop_cause tells the runner how the attempt ends (see runner.STOP_OUTCOME); reason is for people
    fields: Dict[str, Any] = {"reason": "watchdog %s: %s" % (action, finding["message"]),
                              "stop_cause": "watchdog" if action == "kill" else "watchdog_requeue"}
    if action == "kill":
        fields["cancel_requested"] = 1
    ctx.store.update_fields(jid, [S.RUNNING], **fields)
    runner = ctx.runner
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


def tick(ctx: AgentContext, now: Optional[float] = None, the_probe: Any = None,
         proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup", statvfs: Any = os.statvfs) -> List[Dict[str, Any]]:
    """One watchdog pass. Returns the kill/requeue actions it applied (for the runner)."""
    now = time.time() if now is None else now
    try:
        cfg = watchdog.settings(ctx.config)
    except ValueError as exc:
        ctx.store.add_event(None, "watchdog_config", "error", "bad watchdog config, using defaults: %s" % exc)
        cfg = watchdog.settings({})
    jobs = ctx.store.jobs([S.RUNNING])
    gpu = gpu_report(ctx.config, the_probe)
    gpu_jobs = [j for j in jobs if (j.get("gpus") or 0) > 0 or j.get("gpu_ids")]
    holders = {h["pid"] for h in reaper.scan_holders(cfg["device_glob"], proc)} if gpu_jobs else set()
    kids = system.children_map(proc) if jobs else {}
    prev = ctx.store.kv_get(STATE_KEY, {}) or {}
    prev_jobs = prev.get("jobs") or {}
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
