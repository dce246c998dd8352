"""Agent verbs for bringing results home: ``manifest`` (stdlib only, runs on the box).

Request ``{"jobs": [refs] | null, "settle_s": float?}``; reply ``{"schema", "host_time",
"jobs": [...]}``; an unknown ref is a ``not_found`` error (see ``orchestrator.agent.manifest``).
"""

from __future__ import annotations

from typing import Any, Dict, List

from orchestrator.agent.manifest import build_manifest


def manifest(ctx: Any, req: Dict[str, Any]) -> Dict[str, Any]:
    refs = req.get("jobs")
    settle_s = float(req.get("settle_s", 2.0))
    unknown: List[Any] = []
    if refs is None:
        jobs = ctx.store.jobs()
    else:
        jobs, seen = [], set()
        for ref in refs:
            job = ctx.store.get_job(ref)
            if job is None:
                unknown.append(ref)
            elif job["id"] not in seen:
                seen.add(job["id"])
                jobs.append(job)
    if unknown:
        from orchestrator.agent.verbs import VerbError  # lazy: verbs.py imports this module

        raise VerbError("no job %r on this host" % str(unknown[0]), "not_found",
                        "see `gpurun queue status` for job names, ids and numbers")
    return build_manifest(ctx.state_dir, jobs, settle_s=max(0.0, min(settle_s, 30.0)))


VERBS = {"manifest": manifest}
