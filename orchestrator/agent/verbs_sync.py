"""Agent verbs for bringing results home: ``manifest`` (what the box holds, hashed) and
``mark_pulled`` (what home has verified, for the box-side gate in ``pulled``).

Shapes: ``ManifestRequest``/``ManifestReply`` and ``MarkPulledRequest``/``MarkPulledReply`` in
``orchestrator.agent.protocol``; the manifest's job entries are described in
``orchestrator.agent.manifest``.
"""

from __future__ import annotations

from typing import Any, Dict, List

from orchestrator.agent import pulled
from orchestrator.agent.context import AgentContext
from orchestrator.agent.manifest import build_manifest


def v_manifest(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    refs = req.get("jobs")
    settle_s = float(req.get("settle_s", 2.0))
    if refs is None:
        jobs = ctx.store.jobs()
    else:
        jobs: List[Dict[str, Any]] = []
        seen = set()
        for ref in refs:
            job = ctx.find_job(ref)
            if job["id"] not in seen:
                seen.add(job["id"])
                jobs.append(job)
    return build_manifest(ctx.state_dir, jobs, settle_s=max(0.0, min(settle_s, 30.0)))


def v_mark_pulled(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    """Record on the box which files of a job were verified at home (or in S3)."""
    job = ctx.find_job(req.get("job"))
    files = {f["path"]: f["sha256"] for f in req.get("files", []) if f.get("path") and f.get("sha256")}
    pulled.record(ctx, job["id"], files, req.get("where", "home"), req.get("at"))
    return {"job": job["id"], "files": len(files)}
