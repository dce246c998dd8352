"""Queue use cases: turn a parsed queue file into agent jobs, and wait for them to finish."""

from __future__ import annotations

import os
import posixpath
import time
from typing import Callable

from orchestrator.agent import states as S
from orchestrator.queuefile import JobSpec


def _resolve(base: str | None, path: str | None, local: bool) -> str | None:
    if path is None:
        return None
    if local:
        return os.path.abspath(os.path.join(base or os.getcwd(), os.path.expanduser(path)))
    if path.startswith("/") or path.startswith("~") or not base:
        return path
    return posixpath.normpath(posixpath.join(base, path))


def to_jobs(specs: list[JobSpec], host: dict, source: str, cwd: str | None = None) -> tuple[list[dict], list[str]]:
    """Agent job rows for ``specs`` on ``host``; returns (jobs, warnings about duplicates)."""
    local = host.get("kind", "local") == "local"
    base = cwd or (os.getcwd() if local else host.get("workdir"))
    jobs: list[dict] = []
    seen: dict[str, int] = {}
    warnings: list[str] = []
    for spec in specs:
        job_cwd = _resolve(base, spec.cwd, local) if spec.cwd else base
        jid = spec.id
        if jid in seen:
            warnings.append(f"{source}:{spec.line}: same job as line {seen[jid]}; skipped "
                            f"(give it a distinct name= to run it twice)")
            continue
        seen[jid] = spec.line
        jobs.append({
            "id": jid, "name": spec.display_name, "command": spec.command, "cwd": job_cwd,
            "env": spec.env, "gpus": spec.gpus if spec.gpus is not None else 1,
            "retries": spec.retries, "timeout_s": spec.timeout_s,
            "metrics": _resolve(job_cwd, spec.metrics, local), "checkpoints": _resolve(job_cwd, spec.checkpoints, local),
            "source": f"{source}:{spec.line}",
        })
    return jobs, warnings


def wait_for(session, ids: list[str], *, poll: float = 0.5, on_change: Callable[[list[dict]], None] | None = None,
             timeout: float | None = None) -> list[dict]:
    """Poll the agent until every job in ``ids`` is terminal; returns their final rows."""
    deadline = time.time() + timeout if timeout else None
    last: tuple = ()
    while True:
        jobs = session.status(ids)["jobs"]
        key = tuple((j["id"], j["state"], j["attempt"]) for j in jobs)
        if key != last and on_change:
            on_change(jobs)
        last = key
        if all(j["state"] in S.TERMINAL for j in jobs):
            return jobs
        if deadline and time.time() > deadline:
            return jobs
        time.sleep(poll)
