"""VRAM admission before a job is placed: which processes outside any live job hold GPU
memory (the reaper's plan with this agent's running jobs protected), reaped first only when
the profile opts in (``reap: {auto: true}``), and whether enough MiB are free afterwards.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from orchestrator.agent import procs
from orchestrator.agent import states as S
from orchestrator.agent.context import AgentContext
from orchestrator.agent.gpus import gpu_report
from orchestrator.health import reaper


def reap_plan(ctx: AgentContext, **kw: Any) -> Dict[str, Any]:
    """``reaper.plan`` with this agent's running attempts protected (by marker and pid): a
    process left over from an earlier attempt of a running job is an orphan like any other."""
    running = ctx.store.jobs([S.RUNNING])
    return reaper.plan([procs.token(j["id"], j["attempt"]) for j in running],
                       [j["pid"] for j in running if j.get("pid")], **kw)


def admission(ctx: AgentContext, gpu_ids: List[int], need_mib: Optional[float] = None) -> Dict[str, Any]:
    """Admission check for the runner before placing a job on ``gpu_ids``: MiB free per GPU
    once VRAM zombies are gone; reaps them first only when the profile opts in
    (``reap: {auto: true}``). Returns ``{ok, free_mib, zombies, reaped}``."""
    opts = ctx.config.get("reap") or {}
    plan = reap_plan(ctx, min_age_s=float(opts.get("min_age_s", reaper.MIN_AGE_S)))
    rep = gpu_report(ctx.config)
    zombies = reaper.orphans_by_gpu(plan, rep["_samples"])
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
