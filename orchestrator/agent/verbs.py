"""The queue verbs of ``orchestrator.agent.protocol``: submit, status, logs, cancel, retry, events.

Client verbs only insert queued rows, set cancel flags, or (retry) start a new attempt of a
finished job; everything else is the runner's. What the host's scheduler must hear of a
change (Slurm: sbatch, scancel, hold) goes through its backend (``agent/backend``). The
health, quality and sync rooms answer their own verbs (``verbs_health``, ``verbs_quality``,
``verbs_sync``); ``handlers`` maps every verb name to its function.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import Any, Dict

from orchestrator.agent import states as S
from orchestrator.agent.backend import of as backend_of
from orchestrator.agent.context import AgentContext
from orchestrator.agent.control import running_daemon, wake
from orchestrator.agent.diskfull import disk_status
from orchestrator.agent.protocol import BAD_INPUT, CONFLICT, GATE_REFUSED, VerbError, wire_job
from orchestrator.agent.secrets import held_back, redact
from orchestrator.agent.secrets import values as secret_values


def v_submit(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    runs = os.path.join(ctx.state_dir, "runs")
    rows = []
    for j in req.get("jobs", []):
        run_dir = os.path.join(runs, j["id"])
        # paths from profiles ("~/gpurun/work") are the box's: only the agent knows its HOME
        paths = {k: os.path.expanduser(j[k]) for k in ("cwd", "metrics", "checkpoints") if j.get(k)}
        rows.append(dict(j, run_dir=run_dir, log=os.path.join(run_dir, "log.txt"), **paths))
    added, present = ctx.store.insert_jobs(rows)
    for jid in added:
        try:  # the runner makes it again at launch; a full disk must not fail a submit that got in
            os.makedirs(os.path.join(runs, jid), exist_ok=True)
        except OSError:
            pass
    backend_of(ctx.config).after_submit(ctx, req.get("jobs", []), added)
    wake(ctx.state_dir)
    return {"added": added, "present": present, "code": _code_record(ctx.state_dir)}


def _code_record(state_dir: str) -> Any:
    """The record ``gpurun push`` left on the box, so submit can warn about stale code
    without another round trip."""
    try:
        with open(os.path.join(state_dir, "code_hash")) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def v_status(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    refs = req.get("jobs")
    if req.get("table") and not refs:
        # for a table (not --json): only the columns it shows (store.TABLE_COLS), so 50,000 jobs
        # cost a fifth of the bytes and of the JSON work on both ends; the same rows otherwise
        rows: Any = ctx.store.table_rows()
    else:
        rows = [wire_job(j) for j in ([ctx.find_job(r) for r in refs] if refs else ctx.store.jobs())]
    return {"jobs": rows, "daemon": running_daemon(ctx.state_dir),
            "disk": disk_status(ctx.state_dir)}  # None, or "disk full" while it is (issue 14)


def v_logs(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    job = ctx.find_job(req["job"])
    offset = int(req.get("offset", -1))
    limit = int(req.get("limit", 1 << 20))
    data = b""
    try:
        with open(job["log"], "rb") as f:
            if offset < 0:  # a tail: whole lines only, never from the middle of one
                f.seek(0, os.SEEK_END)
                size = f.tell()
                if req.get("tail_lines") is not None:
                    offset = _tail_lines_start(f, size, max(0, int(req["tail_lines"])))
                else:
                    offset = _next_line_start(f, max(0, size - int(req.get("tail_bytes", 64 * 1024))))
                # a long tail is read whole (up to the window it asked for), not cut at ``limit``
                limit = max(limit, size - offset)
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        offset = max(offset, 0)
    text = data.decode("utf-8", "replace")
    masks = secret_values(ctx.state_dir)  # a job that prints its key never gets it echoed
    if masks and text:
        cut = held_back(text, masks) if not S.is_terminal(job["state"]) else 0
        if cut:  # the end may be a secret the job is still writing: the next read returns it whole
            data = data[:len(data) - len(text[len(text) - cut:].encode("utf-8"))]
            text = text[:len(text) - cut]
        text = redact(text, masks)
    return {"job": wire_job(job), "data": text, "offset": offset + len(data)}


_CHUNK = 64 * 1024
# a tail never reads more than this: a log of progress bars redrawn with \r has few newlines
_MAX_TAIL = 8 << 20


def _tail_lines_start(f: Any, size: int, lines: int) -> int:
    """Offset of the first of the last ``lines`` lines of ``f`` (``size`` bytes), reading
    backwards in chunks so a 10 GB log costs only the chunks that hold those lines. A last
    line without its newline yet (a job still writing) counts as a line. Past ``_MAX_TAIL``
    bytes it gives up at the first line start inside that window (or the window's edge when
    the window holds no newline at all)."""
    if lines <= 0 or size == 0:
        return size
    end = size
    f.seek(size - 1)
    if f.read(1) == b"\n":
        end = size - 1  # the final newline ends the last line; it does not start another
    pos = end
    seen = 0
    floor = max(0, size - _MAX_TAIL)
    while pos > floor:
        start = max(floor, pos - _CHUNK)
        f.seek(start)
        chunk = f.read(pos - start)
        i = len(chunk)
        while True:
            i = chunk.rfind(b"\n", 0, i)
            if i < 0:
                break
            seen += 1
            if seen == lines:
                return start + i + 1
        pos = start
    if floor == 0:
        return 0
    first = _next_line_start(f, floor)
    return first if first < size else floor


def _next_line_start(f: Any, offset: int) -> int:
    """``offset`` if a line starts there, else the start of the next line (the end of the file
    if none): a byte tail must not begin in the middle of a line, or of a UTF-8 character."""
    if offset <= 0:
        return 0
    f.seek(offset - 1)
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return f.tell()
        i = chunk.find(b"\n")
        if i >= 0:
            return f.tell() - len(chunk) + i + 1


def v_cancel(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    backend = backend_of(ctx.config)
    backend.reconcile(ctx)
    jobs = ctx.store.jobs(S.ACTIVE) if req.get("all") else [ctx.find_job(r) for r in req.get("jobs", [])]
    backend.cancel(ctx, jobs)  # the scheduler's jobs first: a queued row's must not start after it
    out = []
    for job in jobs:
        if job["state"] == S.QUEUED and ctx.store.transition(job["id"], [S.QUEUED], S.CANCELLED, ended_at=time.time(),
                                                             reason="cancelled by user", stop_cause="user"):
            out.append({"id": job["id"], "name": job["name"], "result": "cancelled"})
        elif ctx.store.update_fields(job["id"], [S.QUEUED, S.RUNNING], cancel_requested=1, stop_cause="user"):
            out.append({"id": job["id"], "name": job["name"], "result": "stopping"})
        else:
            out.append({"id": job["id"], "name": job["name"], "result": "already %s" % job["state"]})
    wake(ctx.state_dir)
    return {"cancelled": out}


def v_retry(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    job = ctx.find_job(req["job"])
    if not S.is_terminal(job["state"]):
        raise VerbError("job %s is %s; only a finished job can be retried" % (job["name"], job["state"]),
                        BAD_INPUT, "cancel it first with `gpurun queue cancel %s`" % job["name"])
    if job["state"] == S.MOVED:
        raise VerbError("job %s was moved to %s; it lives there now" % (job["name"], job.get("moved_to")),
                        BAD_INPUT, "retry it on that host: `gpurun queue retry %s --host %s`"
                        % (shlex.quote(job["name"]), job.get("moved_to")))
    force = bool(req.get("force"))
    if not force:
        _retry_gate(ctx, job)
    ok = ctx.store.transition(job["id"], [job["state"]], S.QUEUED, user_retry=True, attempt_base=job["attempt"],
                              cancel_requested=0, stop_cause=None, force_resume=1 if force else 0, exit_code=None,
                              ended_at=None,
                              reason="retry requested%s" % (" with --force" if force else ""))
    if not ok:
        raise VerbError("job %s changed state while retrying; try again" % job["name"], CONFLICT)
    backend_of(ctx.config).after_retry(ctx, job)
    wake(ctx.state_dir)
    return {"job": wire_job(ctx.store.get_job(job["id"])), "next_attempt": job["attempt"] + 1}


def _retry_gate(ctx: AgentContext, job: Dict[str, Any]) -> None:
    """The runner's resume gate, asked before a retry is accepted, so ``retry`` never says
    "queued again" for a job the runner would then refuse. A refusal changes no state (the
    refusal is written to the job's history); an unreadable source is WAIT, as in the runner."""
    if not job["attempt"]:
        return  # never started (cancelled while queued): the runner gates only resumes
    from orchestrator.agent.quality_hook import gate_refusal  # the metric readers, only on a retry
    refused = gate_refusal(job, ctx.config, ctx.state_dir)
    if refused is None:
        return
    why, data = refused
    ctx.store.add_event(job["id"], "gate", "warn", "retry %s" % why, data)
    evidence = " (evidence: %s)" % data["evidence"] if data.get("evidence") else ""
    raise VerbError("job %s was not retried: %s%s" % (job["name"], why, evidence), GATE_REFUSED,
                    "to run it anyway: `gpurun queue retry %s --force` (the override is recorded in the "
                    "job's history)" % shlex.quote(job["name"]))


def v_events(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    job_id = ctx.find_job(req["job"])["id"] if req.get("job") else None
    return {"events": ctx.store.events(int(req.get("since_id", 0)), job_id, int(req.get("limit", 1000)),
                                       newest=bool(req.get("newest")))}


def v_release(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    """Let queued jobs go to another fleet host: ``queued -> moved`` by compare-and-set, so a
    job the runner claimed first (it started) is refused and stays here; a job moved already
    is answered again (a controller that died between release and submit finishes the move)."""
    to = str(req.get("to") or "")
    if not to:
        raise VerbError("release needs the host the jobs go to", BAD_INPUT, "pass {\"to\": HOST}")
    backend = backend_of(ctx.config)
    released, refused = [], []
    for jid in req.get("jobs") or []:
        job = ctx.store.get_job(jid)
        if job is None:
            refused.append({"id": jid, "state": None, "reason": "no such job here"})
            continue
        why = backend.withdraw(ctx, job)  # a job the host's scheduler started stays here
        if why is not None:
            refused.append({"id": jid, "state": (ctx.store.get_job(jid) or job)["state"], "reason": why})
            continue
        ok = job["state"] == S.MOVED or ctx.store.transition(
            job["id"], [S.QUEUED], S.MOVED, release=True, moved_to=to, ended_at=time.time(),
            reason="moved to %s" % to)
        if job["state"] == S.MOVED and job.get("moved_to") != to:
            ok = ctx.store.update_fields(job["id"], [S.MOVED], moved_to=to, reason="moved to %s" % to)
        if not ok:
            now = ctx.store.get_job(jid)
            refused.append({"id": jid, "state": now["state"] if now else None,
                            "reason": "it is %s here" % (now["state"] if now else "gone")})
            continue
        released.append(backend.release_spec(job, _spec(job)))
    return {"released": released, "refused": refused}


def _spec(job: Dict[str, Any]) -> Dict[str, Any]:
    """What submit needs to add ``job`` on another host: its spec and its attempt count
    (a job that ran before is a resume there, and passes the quality gate)."""
    keys = ("id", "name", "command", "cwd", "env", "gpus", "retries", "timeout_s", "metrics", "checkpoints",
            "source", "secrets", "attempt")
    return {k: job.get(k) for k in keys}
