"""Queue use cases: submit a queue file (parse, pick the host, build agent jobs, send them,
warn about stale code), read the queue of one host or of all of them, and wait for jobs (until
each has ended and has its final quality verdict).
"""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from orchestrator import hosts as hostinv
from orchestrator.agent import states as S
from orchestrator.agent.protocol import Job
from orchestrator.errors import BadInput
if TYPE_CHECKING:
    from orchestrator.queuefile import JobSpec

__all__ = ["Job", "SubmitPlan", "SubmitResult", "judged_stop", "plan_submit", "quality_settled", "submit",
           "status", "status_all", "status_report", "to_jobs", "wait_for"]


@dataclass(frozen=True)
class SubmitPlan:
    """A queue file read and bound to a host, before anything crosses the network."""

    host: dict                 # the inventory entry (slots already updated)
    jobs: list[dict]           # agent job rows, duplicates dropped
    warnings: list[str] = field(default_factory=list)   # one per duplicate line

    @property
    def ids(self) -> list[str]:
        return [j["id"] for j in self.jobs]


@dataclass(frozen=True)
class SubmitResult:
    """What a submit did: ``added`` and ``present`` are job ids, as the agent answered."""

    host: str
    added: list[str]
    present: list[str]
    warnings: list[str]        # the plan's duplicate lines, then the stale-code warning if any
    ids: list[str]             # every job of the file (added or present): what ``--wait`` waits for


def plan_submit(file: str, host: Optional[str] = None, *, start: int = 1, slots: Optional[int] = None,
                cwd: Optional[str] = None) -> SubmitPlan:
    """Read ``file`` from its ``start``-th job and bind it to ``host`` (no network).

    The file is read first so a bad line is reported even for an unknown host. ``slots``
    is remembered for the host. Raises QueueFileError / BadInput for the file, HostError
    for the host."""
    every, specs = read_specs(file, start)
    entry = hostinv.get_host(host)
    if slots is not None:
        hostinv.update_host(entry["name"], slots=slots)
        entry = hostinv.get_host(entry["name"])
    from orchestrator.core.secrets import default_names
    jobs, warnings = to_jobs(specs, entry, file, cwd, default_secrets=default_names(entry))
    if not every:  # a queue of only comments is almost always the wrong file: say so
        warnings.append(f"{file} has no jobs (only comments and blank lines): nothing submitted")
    return SubmitPlan(entry, jobs, warnings)


def read_specs(file: str, start: int = 1) -> tuple[list, list]:
    """``(every job of file, the jobs from the start-th on)``; BadInput for a ``start`` past
    the end, QueueFileError for the file."""
    from orchestrator.queuefile import parse_file, select  # only submit parses (a cold-CLI cost)
    every = parse_file(file)
    if start > 1 and start > len(every):
        raise BadInput(f"--from {start} is past the end: {file} has {len(every)} job(s)",
                       f"pick N from 1 to {len(every)} (jobs are counted, not lines)" if every else
                       "the file has only comments and blank lines; add a command line")
    return every, select(every, start)


def submit(session: Any, plan: SubmitPlan) -> SubmitResult:
    """Send the plan's jobs through ``session`` (an ``AgentClient`` for ``plan.host``); one
    round trip. Submitting the same jobs again adds nothing (they come back as ``present``)."""
    from orchestrator.core.push import code_differs_warning, never_pushed_warning

    res = session.submit(plan.jobs)
    warnings = list(plan.warnings)
    added = set(res["added"])
    stale = (code_differs_warning(plan.host, res.get("code"))
             or never_pushed_warning(plan.host, res.get("code"), [j for j in plan.jobs if j["id"] in added]))
    if stale:
        warnings.append(stale)
    return SubmitResult(plan.host["name"], list(res["added"]), list(res["present"]), warnings, plan.ids)


def status(host: Optional[str] = None, *, table: bool = False) -> tuple[str, list[Job]]:
    """``(host name, jobs)`` of one host (default: local, or $GPURUN_HOST)."""
    name, jobs, _ = status_report(host, table=table)
    return name, jobs


def status_report(host: Optional[str] = None, *, table: bool = False) -> tuple[str, list[Job], Optional[dict]]:
    """``(host name, jobs, disk)``: ``disk`` is None, or the agent's "disk full" report
    (``{full, since, message, hint, free_bytes}``) while its state dir's disk is full.
    ``table``: the jobs carry only what the status table shows (``agent/store.TABLE_COLS``)."""
    from orchestrator.core.session import open_session

    entry = hostinv.get_host(host)
    with open_session(host=entry) as s:
        res = s.status(table=table)
        return entry["name"], res["jobs"], res.get("disk")


def status_all(max_workers: int = 32, *, table: bool = False, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Every host of the inventory in name order (or ``names``, in their order), queried in
    parallel: ``{host, jobs}``, or ``{host, jobs: [], error}`` for a host that failed (the
    others are still answered)."""
    names = sorted(hostinv.load_hosts()) if names is None else list(names)
    if not names:
        return []

    from orchestrator.core.fanout import map_caught
    return map_caught(lambda name: {"host": name, "jobs": status(name, table=table)[1]}, names,
                      lambda name, exc: {"host": name, "error": exc.message, "jobs": []},
                      max_workers=max_workers)


def _resolve(base: str | None, path: str | None, local: bool) -> str | None:
    if path is None:
        return None
    if path.startswith("wandb:"):  # a W&B run reference (queuefile checked it), never a path
        return path
    if local:
        return os.path.abspath(os.path.join(base or os.getcwd(), os.path.expanduser(path)))
    if path.startswith("/") or path.startswith("~") or not base:
        return path
    return posixpath.normpath(posixpath.join(base, path))


def to_jobs(specs: list[JobSpec], host: dict, source: str, cwd: str | None = None, *,
            default_secrets: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Agent job rows for ``specs`` on ``host``; returns (jobs, warnings about duplicates).
    A job without ``secrets=`` asks for ``default_secrets`` (the host's or profile's names)."""
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
            "secrets": list(spec.secrets if spec.secrets is not None else default_secrets or []),
            **({"slurm": dict(spec.slurm)} if spec.slurm else {}),  # sbatch's options (a Slurm host)
        })
    return jobs, warnings


FINAL_GRACE_S = 60.0  # how long --wait waits for final quality checks once every job has ended


def quality_settled(job: dict) -> bool:
    """Whether a finished job has its last quality word: a final record for its current
    attempt, or it never ran (nothing to judge)."""
    if job["state"] not in S.TERMINAL:
        return False
    if not job.get("started_at") or not job.get("attempt"):
        return True
    q = job.get("quality") or {}
    return bool(q.get("final")) and q.get("attempt") == job.get("attempt")


def judged_stop(job: dict) -> bool:
    """A job the quality check judged STOP: its recorded verdict, or stopped by it."""
    return (job.get("quality") or {}).get("verdict") == "STOP" or job["state"] == S.QUALITY_STOPPED


def wait_for(session, ids: list[str], *, poll: float = 0.5, on_change: Callable[[list[dict]], None] | None = None,
             timeout: float | None = None, final_grace: float = FINAL_GRACE_S) -> list[dict]:
    """Poll the agent until every job in ``ids`` is terminal and has its final quality verdict
    (the agent's final check comes a pass or two after the end; at most ``final_grace``
    seconds are waited for it); returns their final rows."""
    deadline = time.time() + timeout if timeout else None
    last: tuple = ()
    ended_at: float | None = None
    while True:
        jobs = session.status(ids)["jobs"]
        key = tuple((j["id"], j["state"], j["attempt"], (j.get("quality") or {}).get("verdict")) for j in jobs)
        if key != last and on_change:
            on_change(jobs)
        last = key
        if all(j["state"] in S.TERMINAL for j in jobs):
            ended_at = ended_at or time.time()
            if all(quality_settled(j) for j in jobs) or time.time() - ended_at > final_grace:
                return jobs
        else:
            ended_at = None
        if deadline and time.time() > deadline:
            return jobs
        time.sleep(poll)
