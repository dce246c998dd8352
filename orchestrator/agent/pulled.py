"""The box-side teardown gate: which files of which jobs were verified at home (or in S3).

``gpurun pull`` records, through the ``mark_pulled`` verb, the SHA-256 of every file it
verified; ``unpulled`` compares those records with the box's current manifest, so idle
autostop can tell with the laptop closed that stopping the box would lose nothing.
"""

from __future__ import annotations

from typing import Any, Dict, List

from orchestrator.agent.context import AgentContext
from orchestrator.agent.manifest import build_manifest
from orchestrator.agent.states import ACTIVE

PULLED_KEY = "pulled:"


def record(ctx: AgentContext, job_id: str, files: Dict[str, str], where: str, at: Any) -> None:
    """Remember that ``files`` ({path: sha256}) of ``job_id`` are verified ``where``."""
    ctx.store.kv_set(PULLED_KEY + job_id, {"files": files, "where": where, "at": at})


def unpulled(ctx: AgentContext) -> List[str]:
    """Files of any job whose current bytes were never verified at home: what blocks autostop."""
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
