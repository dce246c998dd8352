"""Watchdog checks: observe running jobs and the host, then ``evaluate`` (pure) turns one tick's
observations plus the previous tick's state into findings; ``policy`` maps codes to actions.

A finding is ``{code, severity, job_id, key, message, data}``; ``key`` identifies it across
ticks so the caller reports it once when it appears. Progress means log, metrics or
checkpoint growth or an advancing step counter: a data-bound job (0 % GPU, steps advancing)
is never called stalled.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Set, Tuple

ACTIONS = ("record", "notify", "kill", "requeue")
SEVERITIES = ("info", "warn", "error", "critical")
JOB_CODES = ("process_gone", "stalled", "data_bound", "no_gpu_memory")
HOST_CODES = ("cgroup_memory_high", "oom_kill", "disk_full", "inodes_full", "reboot", "gpu_fail", "gpu_warn")
OCCURRENCES = ("oom_kill", "reboot")  # events, not conditions: never "cleared"
DEFAULT_POLICY = {
    "process_gone": "record", "stalled": "notify", "data_bound": "record", "no_gpu_memory": "notify",
    "cgroup_memory_high": "notify", "oom_kill": "notify", "disk_full": "notify", "inodes_full": "notify",
    "reboot": "notify", "gpu_fail": "notify", "gpu_warn": "record",
}
DEFAULTS: Dict[str, Any] = {"interval_s": 60.0, "stall_after_s": 1800.0, "no_gpu_grace_s": 300.0,
                            "idle_util_pct": 5.0, "cgroup_mem_pct": 90.0, "disk_pct": 95.0,
                            "inode_pct": 95.0, "paths": [], "device_glob": None}


def settings(config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The watchdog section of a host config with defaults filled in and the policy checked.
    Raises ``ValueError`` naming the bad key (``watchdog.<key>``)."""
    wd = dict((config or {}).get("watchdog") or {})
    out = dict(DEFAULTS)
    for key, val in wd.items():
        if key == "policy":
            continue
        if key not in DEFAULTS:
            raise ValueError("watchdog.%s: unknown key (known: %s, policy)" % (key, ", ".join(sorted(DEFAULTS))))
        if key in ("paths", "device_glob"):
            if not isinstance(val, list) or not all(isinstance(p, str) and p for p in val):
                raise ValueError("watchdog.%s: must be a list of paths" % key)
        elif not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0:
            raise ValueError("watchdog.%s: must be a positive number, got %r" % (key, val))
        out[key] = val
    out["policy"] = validate_policy(wd.get("policy") or {})
    return out


def validate_policy(policy: Dict[str, Any]) -> Dict[str, str]:
    """Defaults overlaid with ``policy``; unknown codes or actions raise ``ValueError``."""
    if not isinstance(policy, dict):
        raise ValueError("watchdog.policy: must be a mapping of finding code to action")
    out = dict(DEFAULT_POLICY)
    for code, action in policy.items():
        if code not in DEFAULT_POLICY:
            raise ValueError("watchdog.policy.%s: unknown finding code (known: %s)"
                             % (code, ", ".join(sorted(DEFAULT_POLICY))))
        if action not in ACTIONS:
            raise ValueError("watchdog.policy.%s: unknown action %r (use %s)" % (code, action, "|".join(ACTIONS)))
        if action in ("kill", "requeue") and code not in JOB_CODES:
            raise ValueError("watchdog.policy.%s: %s applies to job findings only (%s)"
                             % (code, action, ", ".join(JOB_CODES)))
        out[code] = action
    return out


def _stat(path: Optional[str]) -> Tuple[Optional[int], Optional[float]]:
    if not path:
        return None, None
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return st.st_size, st.st_mtime


def observe_job(job: Dict[str, Any], kids: Dict[int, List[int]], gpu_holders: Set[int],
                prev: Dict[str, Any], proc: str = "/proc", progress: Any = None) -> Dict[str, Any]:
    """One running job's facts this tick. ``prev`` is this job's entry from the last state
    (used to skip re-reading progress when files did not grow). ``progress`` is the quality
    room's reader (``orchestrator.quality.progress``: ``metrics_path``, ``read_progress``),
    passed in by the agent because health may not import quality; None reads no progress."""
    pid = job.get("pid")
    # one liveness rule with the agent's reconcile (procs.job_liveness): running, not a
    # zombie, and carrying this attempt's marker; a running pid without it was reused.
    from orchestrator.health import procs  # agent-side only: profiles import this module for its codes
    live = procs.job_liveness(int(pid) if pid else None, str(job["id"]), job.get("attempt") or None, proc)
    alive = live == procs.ALIVE
    tree = procs.descendants([int(pid)], kids) if alive else set()
    log_size, log_mtime = _stat(job.get("log"))
    metrics = progress.metrics_path(job) if progress is not None else None
    met_size, met_mtime = _stat(metrics)
    _, ck_mtime = _stat(job.get("checkpoints"))
    if (log_size, met_size) == (prev.get("log_size"), prev.get("metrics_size")) and "step" in prev:
        step, loss = prev.get("step"), prev.get("loss")
    elif progress is not None:
        step, loss = progress.read_progress(metrics, job.get("log"))
    else:
        step = loss = None
    return {"job_id": str(job["id"]), "pid": pid, "alive": alive,
            # exited, not yet reaped by its parent (the agent settles it on its next pass)
            "ending": live == procs.ZOMBIE,
            "pid_reused": live == procs.FOREIGN, "tree": sorted(tree),
            "holds_gpu": bool(tree & gpu_holders), "gpu_ids": list(job.get("gpu_ids") or []),
            "gpus": int(job.get("gpus") or 0), "started_at": job.get("started_at"),
            "log_size": log_size, "log_mtime": log_mtime, "metrics_size": met_size,
            "metrics_mtime": met_mtime, "ckpt_mtime": ck_mtime, "step": step, "loss": loss}


def _f(code: str, severity: str, message: str, job_id: Optional[str] = None,
       subject: str = "", **data: Any) -> Dict[str, Any]:
    key = "|".join([code, job_id or "", subject])
    return {"code": code, "severity": severity, "job_id": job_id, "key": key, "message": message, "data": data}


def _job_findings(o: Dict[str, Any], p: Dict[str, Any], samples: List[Any], host: Dict[str, Any],
                  cfg: Dict[str, Any], now: float) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    jid, out = o["job_id"], []
    step_at = p.get("step_at")
    if o["step"] is not None and o["step"] != p.get("step"):
        step_at = now if "step" in p else None  # first sight is not evidence of motion
    state = {k: o[k] for k in ("log_size", "metrics_size", "step", "loss")}
    state["step_at"] = step_at
    if not o["alive"] and o.get("ending"):
        return out, state  # an exit the runner has yet to collect: not a lost process
    if not o["alive"]:
        why = "its pid now belongs to another process" if o["pid_reused"] else "its process is gone"
        out.append(_f("process_gone", "error", "job %s is marked running but %s (pid %s)" % (jid, why, o["pid"]),
                      jid, pid=o["pid"], pid_reused=o["pid_reused"]))
        return out, state
    by_index = {s.index: s for s in samples}
    utils = [by_index[i].util_pct for i in o["gpu_ids"] if i in by_index and by_index[i].util_pct is not None]
    util = sum(utils) / len(utils) if utils else None
    last = max([t for t in (o["log_mtime"], o["metrics_mtime"], o["ckpt_mtime"], step_at, o["started_at"])
                if t is not None] or [now])
    idle_s = now - last
    stepping = step_at is not None and step_at == now
    if idle_s >= cfg["stall_after_s"] and not stepping:
        hung = util is None or util < cfg["idle_util_pct"]
        out.append(_f("stalled", "error" if hung else "warn",
                      "job %s: no log/metrics/checkpoint growth for %d min while alive (GPU util %s)%s"
                      % (jid, idle_s // 60, "unknown" if util is None else "%.0f %%" % util,
                         ": hung" if hung else "; stdout may be block-buffered"),
                      jid, idle_s=round(idle_s), util_pct=util, last_step=o["step"]))
    elif stepping and util is not None and util < cfg["idle_util_pct"]:
        out.append(_f("data_bound", "info", "job %s: steps advance (step %s) but GPU util is %.0f %%: "
                      "input-bound, not stalled" % (jid, o["step"], util), jid, util_pct=util, step=o["step"]))
    started = o["started_at"] or now
    if (o["gpus"] > 0 and host.get("gpu_available") and now - started >= cfg["no_gpu_grace_s"]
            and not o["holds_gpu"]):
        nvml_pids = {pr.pid for i in o["gpu_ids"] if i in by_index for pr in (by_index[i].processes or [])}
        if not nvml_pids & set(o["tree"]):
            out.append(_f("no_gpu_memory", "warn", "job %s has run %d min but holds no GPU (no /dev/nvidia* fd): "
                          "running on CPU by mistake?" % (jid, (now - started) // 60), jid, gpu_ids=o["gpu_ids"]))
    return out, state


def _host_findings(host: Dict[str, Any], prev: Dict[str, Any], cfg: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    cg = host.get("cgroup") or {}
    if cg.get("pct") is not None and cg["pct"] > cfg["cgroup_mem_pct"]:
        out.append(_f("cgroup_memory_high", "warn", "container memory at %.0f %% of its cgroup limit (OOM kill "
                      "risk; host-wide free is irrelevant)" % cg["pct"], pct=cg["pct"], limit_bytes=cg["limit_bytes"]))
    count, before = cg.get("oom_kill"), prev.get("oom_kill")
    if count is not None and before is not None and count > before:
        out.append(_f("oom_kill", "error", "the cgroup OOM killer ended %d process(es): a bare 'Killed' / exit 137 "
                      "is host RAM, not VRAM" % (count - before), subject=str(count), count=count, delta=count - before))
    for d in host.get("disks") or []:
        if d.get("pct") is not None and d["pct"] >= cfg["disk_pct"]:
            out.append(_f("disk_full", "error", "%s is %.0f %% full" % (d["path"], d["pct"]), subject=d["path"],
                          path=d["path"], pct=d["pct"], bytes_free=d.get("bytes_free")))
        if d.get("inodes_pct") is not None and d["inodes_pct"] >= cfg["inode_pct"]:
            out.append(_f("inodes_full", "error", "%s has used %.0f %% of its inodes (no space left even with "
                          "free bytes)" % (d["path"], d["inodes_pct"]), subject=d["path"], path=d["path"],
                          inodes_pct=d["inodes_pct"], pct=d.get("pct")))
    boot, old = host.get("boot_id"), prev.get("boot_id")
    if boot and old and boot != old:
        out.append(_f("reboot", "error", "host rebooted (boot id changed): running jobs were lost",
                      subject=boot, boot_id=boot, previous=old))
    verdict = host.get("gpu_verdict") or {}
    for g in verdict.get("gpus") or []:
        if g["status"] in ("FAIL", "WARN"):
            code = "gpu_fail" if g["status"] == "FAIL" else "gpu_warn"
            codes = ",".join(r["code"] for r in g["reasons"])
            out.append(_f(code, "error" if code == "gpu_fail" else "warn", "GPU %d %s: %s" % (
                g["index"], g["status"], "; ".join(r["message"] for r in g["reasons"])),
                subject="%d:%s" % (g["index"], codes), index=g["index"], reasons=g["reasons"]))
    for r in verdict.get("reasons") or []:
        if r["code"] == "missing_gpus":
            out.append(_f("gpu_fail", "error", r["message"], subject="host:missing", reasons=[r]))
    return out


def evaluate(observations: List[Dict[str, Any]], samples: List[Any], host: Dict[str, Any],
             prev: Dict[str, Any], cfg: Dict[str, Any], now: float) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Pure: findings for this tick and the state to pass next time."""
    findings: List[Dict[str, Any]] = []
    jobs_prev = prev.get("jobs") or {}
    jobs_state = {}
    for o in observations:
        f, st = _job_findings(o, jobs_prev.get(o["job_id"]) or {}, samples, host, cfg, now)
        findings.extend(f)
        jobs_state[o["job_id"]] = st
    findings.extend(_host_findings(host, prev, cfg))
    cg = host.get("cgroup") or {}
    state = {"jobs": jobs_state, "boot_id": host.get("boot_id") or prev.get("boot_id"),
             "oom_kill": cg.get("oom_kill") if cg.get("oom_kill") is not None else prev.get("oom_kill"),
             "active": sorted(f["key"] for f in findings if f["code"] not in OCCURRENCES)}
    return findings, state


def new_and_cleared(findings: List[Dict[str, Any]], prev: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Findings not active last tick, and keys active last tick that are gone now."""
    before = set(prev.get("active") or [])
    now_keys = {f["key"] for f in findings}
    return [f for f in findings if f["key"] not in before], sorted(before - now_keys)
