"""Agent verbs for bringing results home: ``manifest`` (stdlib only, runs on the box).

Request ``{"jobs": [refs] | null, "settle_s": float?}``; reply ``{"schema", "host_time",
"jobs": [...]}``; an unknown ref is a ``not_found`` error (see ``orchestrator.agent.manifest``).
"""

from __future__ import annotations

from typing import Any, Dict, List

from orchestrator.agent.manifest import build_manifest
from orchestrator.agent.states import ACTIVE


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


PULLED_KEY = "pulled:"


def mark_pulled(ctx: Any, req: Dict[str, Any]) -> Dict[str, Any]:
    """Record on the box which files of a job were verified at home (or in S3), so the
    box-side autostop gate can tell, with the laptop closed, that nothing would be lost."""
    job = ctx.store.get_job(req.get("job"))
    if job is None:
        from orchestrator.agent.verbs import VerbError

        raise VerbError("no job %r on this host" % str(req.get("job")), "not_found")
    files = {f["path"]: f["sha256"] for f in req.get("files", []) if f.get("path") and f.get("sha256")}
    rec = {"files": files, "where": req.get("where", "home"), "at": req.get("at")}
    ctx.store.kv_set(PULLED_KEY + job["id"], rec)
    return {"job": job["id"], "files": len(files)}


def unpulled(ctx: Any) -> List[str]:
    """Files of any job whose current bytes were never verified at home: the autostop gate."""
    jobs = ctx.store.jobs()
    if any(j["state"] in ACTIVE for j in jobs):
        return ["jobs still queued or running"]
    man = build_manifest(ctx.state_dir, jobs, settle_s=0.0)
    missing: List[str] = []
    for job in man["jobs"]:
        rec = ctx.store.kv_get(PULLED_KEY + job["id"], {}) or {}
        have = rec.get("files", {})
        for f in job["files"]:
            if have.get(f["path"]) != f["sha256"]:
                missing.append("%s:%s" % (job.get("name") or job["id"], f["path"]))
        missing.extend("%s:%s (still being written)" % (job.get("name") or job["id"], p["path"])
                       for p in job.get("pending", []))
    return missing


VERBS = {"manifest": manifest, "mark_pulled": mark_pulled}
