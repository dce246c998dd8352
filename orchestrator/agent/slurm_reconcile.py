"""Slurm host: the store brought up to date with Slurm and the run dirs, by compare-and-set.

No daemon runs on a login node, so every verb that reads jobs first calls ``sync`` (through
``agent/backend.SlurmBackend``, whose hooks the changing verbs call too): queued rows
without a Slurm job id are submitted (``slurm.submit_pending``), then one ``squeue`` call for all
jobs (``scontrol show job`` for an active one squeue forgot) and the files the in-allocation
wrapper (``agent/slurmjob``) wrote in each run dir decide each row's move:

* ``started.<n>`` newer than the row's attempt: attempt n runs (queued -> running, started_at
  from the file). After a terminal state it is a requeue (``scontrol requeue``, a node failure):
  the row goes back to queued/running as a new attempt only because the wrapper's resume gate
  let it run; a ``gate.<n>`` file (refused) keeps it where it is, with one event saying so;
* ``exit.<n>``: the attempt ended: succeeded, failed (its class from ``agent/failures``, with
  the retry budget the runner applies: a retry is a new sbatch), quality_stopped or cancelled;
* Slurm PENDING for a running row: Slurm requeued it before it started again -> queued;
* Slurm ended (or forgot) the job and no exit file came: cancelled (a scancel before the
  wrapper started) or failed, with a reason naming Slurm's state and its output file.

The wrapper's events (``events.jsonl``) and its latest verdict (``quality.json``) are copied
into the store, and jobs that ended get the final quality check as the daemon gives it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Dict, Optional

from orchestrator.agent import failures, slurm
from orchestrator.agent import states as S
from orchestrator.agent.protocol import VerbError

NOTIFY_WAIT_S = 10.0  # how long a command waits for its webhooks' deliveries
SCONTROL_MAX = 16  # `scontrol show job` calls per command for jobs squeue no longer lists
RECENT_S = 86400.0  # ended rows Slurm may still requeue (it forgets a job after MinJobAge, 300 s by default)
_FILE = re.compile(r"^(started|exit|gate)\.(\d+)$")
REQUEUE_REFUSED = "requeue refused by the resume gate"


def sync(ctx: Any, submit_errors: bool = False) -> None:
    """Submit what waits for sbatch, then reconcile. ``submit_errors``: raise an sbatch
    failure (the ``submit`` verb); other verbs record it on the job and answer anyway."""
    try:
        slurm.submit_pending(ctx)
    except VerbError as exc:
        if submit_errors:
            raise
        _note_sbatch_failure(ctx, exc)
    reconcile(ctx)


def _note_sbatch_failure(ctx: Any, exc: VerbError) -> None:
    for job in ctx.store.jobs([S.QUEUED]):
        if not job.get("backend_id") and job.get("reason") != str(exc):
            ctx.store.update_fields(job["id"], [S.QUEUED], reason=str(exc))
            ctx.store.add_event(job["id"], "slurm", "warn", "%s (tried again by the next gpurun command)" % exc)
            return  # the first one: sbatch stopped there


# --- reconcile ---------------------------------------------------------------------------------
def reconcile(ctx: Any, now: Optional[float] = None) -> int:
    """Move every Slurm job's row to what Slurm and its files say; returns the rows looked at."""
    now = time.time() if now is None else now
    rows = ctx.store.backend_jobs(now - RECENT_S)
    if not rows:
        return 0
    try:
        known = slurm.squeue()
    except VerbError as exc:  # the store stays as it was; the answer says what it could
        sys.stderr.write("slurm reconcile skipped: %s\n" % exc)
        return 0
    seen, asks = 0, SCONTROL_MAX
    for job in rows:
        bid = job["backend_id"]
        # an array's tasks that never started stay one record under the array's own id (squeue
        # -r lists a cancelled remainder as ``A``, not ``A_T``): its state is theirs
        sq = known.get(bid) or known.get(bid.split("_")[0] if "_" in bid else "\0")
        if S.is_terminal(job["state"]) and sq is None:
            continue  # ended, and Slurm holds nothing more of it (a requeue needs the job known)
        state = sq[0] if sq else None
        if state is None and not S.is_terminal(job["state"]):
            if asks <= 0:
                continue  # a burst of forgotten jobs is taken a few per command, not 1,000 scontrols
            asks -= 1
            state = slurm.scontrol_job(bid).get("JobState")  # squeue forgot it; the controller may not have
        seen += 1
        _one(ctx, job, state, now)
    if seen and _finals_pending(ctx.store):
        from orchestrator.agent import quality_cadence  # the metric readers: only when a job ended
        quality_cadence.final_pass(ctx, now)
    send_notifications(ctx)
    return seen


def send_notifications(ctx: Any, wait_s: float = NOTIFY_WAIT_S) -> None:
    """No daemon sends a Slurm host's notifications (failures, quality STOPs, queue done): the
    command that brought the events in does, under a lock (two commands never send one event
    twice), waiting up to ``wait_s`` for the deliveries before it answers. Nothing at all when
    no webhook is configured or no event is new."""
    if not ctx.config.get("notify"):
        return
    last = ctx.store.kv_get("notify.last_event_id")
    if last is not None and not ctx.store.events(int(last), None, 1):
        return
    import fcntl
    fd = os.open(os.path.join(ctx.state_dir, "notify.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # another command is sending them
        from orchestrator.agent import notifications, notify
        notifications.flush_notifications(ctx)
        notifier = notify.notifier_for(ctx.state_dir, ctx.config, state_dir=ctx.state_dir)
        if notifier is not None and notifier.flush(wait_s):
            notifications.flush_notifications(ctx)  # failed deliveries become events now (not re-sent)
    finally:
        os.close(fd)


def _finals_pending(store: Any) -> bool:
    """``quality_cadence.finals_pending`` without importing the readers: a state event after
    the final pass's cursor (kv ``quality.final_seen``)."""
    cur = store.kv_get("quality.final_seen")
    return store.last_event_id("state") > (int(cur.get("id") or 0) if isinstance(cur, dict) else 0)


def withdraw(ctx: Any, job: Dict[str, Any]) -> bool:
    """Take a queued job's Slurm job back before a fleet release moves the row: ``scontrol
    hold`` succeeds only on a job still pending, and a held job never starts, so it is then
    scancel'd and the row loses its id (True). A job Slurm started (or ended) is not taken back:
    the row follows what Slurm says, and the release refuses it (False)."""
    bid = job["backend_id"]
    rc, _, _ = slurm.run(["scontrol", "hold", bid])
    if rc != 0:
        reconcile(ctx)
        return False
    slurm.cancel([bid])
    return ctx.store.update_fields(job["id"], [S.QUEUED], backend_id=None)


def attempt_files(run_dir: str) -> Dict[int, set]:
    """``{attempt: {"started", "exit", "gate"}}`` of the files the wrapper wrote (one listdir)."""
    out: Dict[int, set] = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return out
    for name in names:
        m = _FILE.match(name)
        if m:
            out.setdefault(int(m.group(2)), set()).add(m.group(1))
    return out


def _read(job: Dict[str, Any], kind: str, n: int) -> Dict[str, Any]:
    return slurm.read_json(os.path.join(job["run_dir"], "%s.%d" % (kind, n))) or {}


def _one(ctx: Any, job: Dict[str, Any], state: Optional[str], now: float) -> None:
    store, jid, bid = ctx.store, job["id"], job["backend_id"]
    import_wrapper_records(ctx, job)
    files = attempt_files(job["run_dir"])
    latest = max(files) if files else 0
    if latest > job["attempt"] and "started" in files[latest]:
        job = _new_attempt(ctx, job, latest, files[latest])
        if job is None:
            return
    n = job["attempt"]
    have = files.get(n, set()) if n else set()
    if job["state"] == S.QUEUED or S.is_terminal(job["state"]):
        if job["state"] == S.QUEUED and state in slurm.ENDED:  # and no attempt started since it was queued
            _ended_unstarted(ctx, job, state)
        elif job["state"] == S.QUEUED and state is None:
            _forgotten(ctx, job)
        return
    # running
    if "exit" in have:
        settle(ctx, job, _read(job, "exit", n), "gate" in have, state, now)
    elif state in slurm.WAITING:
        if store.transition(jid, [S.RUNNING], S.QUEUED, reason="requeued by Slurm (%s)" % state, pid=None):
            store.add_event(jid, "requeued", "info", "Slurm job %s requeued; attempt %d left no exit file" % (bid, n))
    elif state in slurm.ENDED:
        settle(ctx, job, {"code": None, "signal": None, "stop_cause": None}, False, state, now)
    elif state is None:
        _forgotten(ctx, job)


def _new_attempt(ctx: Any, job: Dict[str, Any], n: int, have: set) -> Optional[Dict[str, Any]]:
    """Attempt ``n`` started (its started file): the row follows, or says why it does not."""
    store, jid = ctx.store, job["id"]
    st = _read(job, "started", n)
    started = float(st.get("time") or time.time())
    if S.is_terminal(job["state"]):
        if started <= float(job.get("ended_at") or 0):
            return None  # it started before the row ended (cancelled as it started): not a requeue
        key = "slurm.requeue:%s" % jid
        if "gate" in have:
            if store.kv_get(key) != n:
                store.kv_set(key, n)
                gate = _read(job, "gate", n)
                store.add_event(jid, "gate", "warn", "%s: %s (attempt %d of Slurm job %s did not run)" % (
                    REQUEUE_REFUSED, gate.get("why") or "quality STOP", n, job["backend_id"]), gate.get("data") or {})
            return None
        if not store.transition(jid, [job["state"]], S.QUEUED, user_retry=True, attempt_base=job["attempt"],
                                cancel_requested=0, exit_code=None, ended_at=None,
                                reason="requeued by Slurm; the resume gate let attempt %d run" % n):
            return None
    elif job["state"] == S.RUNNING:  # Slurm requeued a running attempt (node failure) and it runs again
        store.add_event(jid, "requeued", "warn", "attempt %d ended without an exit file; Slurm started attempt %d"
                        % (job["attempt"], n))
        store.transition(jid, [S.RUNNING], S.QUEUED, pid=None, reason="requeued by Slurm")
    if not store.transition(jid, [S.QUEUED], S.RUNNING, attempt=n, started_at=started, ended_at=None, exit_code=None,
                            pid=st.get("pid"), boot_id=None, reason=None):
        return None
    store.add_event(jid, "slurm", "info", "attempt %d started on %s (Slurm job %s)" % (
        n, st.get("node") or "?", st.get("slurm_job_id") or job["backend_id"]), st)
    return store.get_job(jid)


def _ended_unstarted(ctx: Any, job: Dict[str, Any], state: str) -> None:
    """Slurm ended a job whose wrapper never started: scancel'd while pending, or a start error."""
    store, jid, bid = ctx.store, job["id"], job["backend_id"]
    out = slurm.output_file(job)
    if state == "CANCELLED" or job.get("cancel_requested"):
        store.transition(jid, [S.QUEUED], S.CANCELLED, ended_at=time.time(), stop_cause="user",
                         reason="cancelled by user" if job.get("cancel_requested") else "cancelled in Slurm (scancel)")
        return
    why = "Slurm job %s ended %s before gpurun's wrapper started (see %s)" % (bid, state, out)
    if store.transition(jid, [S.QUEUED], S.FAILED, ended_at=time.time(), reason=why):
        store.add_event(jid, "failed", "error", "job %s failed: %s" % (job["name"], why))


def _forgotten(ctx: Any, job: Dict[str, Any]) -> None:
    store, jid, bid = ctx.store, job["id"], job["backend_id"]
    why = "Slurm no longer knows job %s and it left no exit file (see %s)" % (bid, slurm.output_file(job))
    if store.transition(jid, [job["state"]], S.FAILED, ended_at=time.time(), reason=why, pid=None):
        store.add_event(jid, "failed", "error", "job %s failed: %s" % (job["name"], why))


def settle(ctx: Any, job: Dict[str, Any], ex: Dict[str, Any], refused: bool, state: Optional[str],
           now: float) -> None:
    """The running attempt ended (its exit file, or Slurm ended it without one): the runner's
    outcome rules, with Slurm's own words for what gpurun did not ask for."""
    from orchestrator.agent.runner import STOP_OUTCOME, stop_cause
    store, jid = ctx.store, job["id"]
    code, sig = ex.get("code"), ex.get("signal")
    cause = ex.get("stop_cause") or stop_cause(job)
    if refused:
        gate = _read(job, "gate", job["attempt"])
        if store.transition(jid, [S.RUNNING], S.QUALITY_STOPPED, ended_at=now, pid=None, stop_cause="quality",
                            reason=gate.get("why") or "resume refused by quality gate"):
            store.add_event(jid, "quality_stopped", "error", gate.get("why") or "resume refused", gate.get("data"))
        return
    if job.get("cancel_requested") and STOP_OUTCOME.get(cause or "") is None:
        cause = "user"
    if not cause and state == "CANCELLED":
        cause = "user"  # a scancel outside gpurun
    if not cause and state in ("TIMEOUT", "DEADLINE"):
        cause = "timeout"
    outcome = STOP_OUTCOME.get(cause or "")
    if code == 0 and outcome is None:
        store.transition(jid, [S.RUNNING], S.SUCCEEDED, exit_code=0, ended_at=now, pid=None, failure_class=None,
                         failure_hint=None)
        return
    from orchestrator.agent.failure_facts import read_tail, this_attempt
    runtime = now - job["started_at"] if job.get("started_at") else None
    fail = failures.classify(code, sig if sig else failures.signal_of(code), this_attempt(read_tail(job["log"])),
                             1 if state == "OUT_OF_MEMORY" else None, False, runtime, cause,
                             state in ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL"), "")
    tag = {"failure_class": fail.cls, "failure_hint": fail.hint}
    if outcome == S.QUALITY_STOPPED:
        store.transition(jid, [S.RUNNING], S.QUALITY_STOPPED, exit_code=code, ended_at=now, pid=None, stop_cause=cause,
                         **tag)
        return
    if outcome == S.CANCELLED:
        store.transition(jid, [S.RUNNING], S.CANCELLED, exit_code=code, ended_at=now, pid=None, stop_cause=cause,
                         reason=job.get("reason") if cause == "watchdog" else "cancelled by user", **tag)
        return
    reason = job.get("reason") or ex.get("error") or (
        "exit code %d" % code if code is not None else "Slurm job %s ended %s without an exit file" % (
            job["backend_id"], state or "(forgotten)"))
    used = job["attempt"] - job["attempt_base"]
    free = failures.free_retry(fail, job)
    if fail.retryable and (free or used <= job["retries"]) and not ex.get("error"):
        # a retry is a new sbatch: the next verb submits the row again (no backend_id)
        if store.transition(jid, [S.RUNNING], S.QUEUED, exit_code=code, pid=None, reason=reason, backend_id=None,
                            attempt_base=job["attempt_base"] + int(free), **tag):
            store.add_event(jid, "retry", "warn", failures.retry_message(job, reason, fail, used - int(free)),
                            failures.event_data(fail, code, job["attempt"]))
        return
    if fail.holds:
        reason = failures.held_reason(fail, job["name"])
    if store.transition(jid, [S.RUNNING], S.FAILED, exit_code=code, ended_at=now, pid=None, reason=reason,
                        stop_cause=cause, **tag):
        store.add_event(jid, "failed", "error", failures.failed_message(job["name"], reason, fail),
                        failures.event_data(fail, code, job["attempt"]))


# --- what the wrapper wrote ------------------------------------------------------------------
def import_wrapper_records(ctx: Any, job: Dict[str, Any]) -> None:
    """Copy the wrapper's new events (``events.jsonl``, from a byte cursor in kv), its latest
    verdict (``quality.json`` -> ``jobs.quality``) and its cadence record into the store."""
    store, jid = ctx.store, job["id"]
    key = "slurm.events:%s" % jid
    pos = int(store.kv_get(key) or 0)
    path = os.path.join(job["run_dir"], "events.jsonl")
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except OSError:
        data = b""
    end = data.rfind(b"\n") + 1  # whole lines only: the wrapper may be writing the next one
    if end:
        import json
        for line in data[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            store.add_event(jid, str(ev.get("kind") or "wrapper"), str(ev.get("severity") or "info"),
                            str(ev.get("message") or ""), ev.get("data") or None)
        store.kv_set(key, pos + end)
    rec = slurm.read_json(os.path.join(job["run_dir"], "quality.json"))
    if isinstance(rec, dict) and rec != job.get("quality"):
        store.update_fields(jid, list(S.ORDER), quality=rec)
        job["quality"] = rec
    cad = slurm.read_json(os.path.join(job["run_dir"], "quality-state.json"))
    if isinstance(cad, dict) and cad.get("attempt") == job.get("attempt"):
        store.kv_set("quality:%s" % jid, cad)  # the final check goes on from the wrapper's record

