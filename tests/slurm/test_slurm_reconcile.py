"""``slurm_reconcile``'s decisions from what Slurm says and what the wrapper left in the run dir,
on a real SQLite store and real files (the cases the end-to-end test cannot force: a node
failure's requeue, a job Slurm forgot, a requeue the gate let run, a scancel while pending,
a failure within its retry budget becoming a new sbatch)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.agent import slurm_reconcile as R
from orchestrator.agent import states as S
from orchestrator.agent.context import AgentContext
from orchestrator.agent.store import Store


@pytest.fixture
def ctx(tmp_path: Path):
    store = Store(str(tmp_path / "gpurun.db"))
    yield AgentContext(str(tmp_path), store, {"scheduler": "slurm", "host": "c"})
    store.close()


def add(ctx: AgentContext, jid: str = "j1", retries: int = 0, bid: str = "41") -> dict:
    run_dir = Path(ctx.state_dir) / "runs" / jid
    run_dir.mkdir(parents=True)
    ctx.store.insert_jobs([{"id": jid, "name": jid, "command": "true", "run_dir": str(run_dir),
                            "log": str(run_dir / "log.txt"), "retries": retries}])
    ctx.store.update_fields(jid, [S.QUEUED], backend_id=bid)
    return ctx.store.get_job(jid)


def write(job: dict, name: str, obj: dict) -> None:
    Path(job["run_dir"], name).write_text(json.dumps(obj))


def step(ctx: AgentContext, jid: str, state) -> dict:
    R._one(ctx, ctx.store.get_job(jid), state, time.time())
    return ctx.store.get_job(jid)


def test_started_then_exit_codes(ctx) -> None:
    job = add(ctx)
    assert step(ctx, "j1", "PENDING")["state"] == S.QUEUED
    write(job, "started.1", {"time": time.time(), "node": "n1", "pid": 7, "slurm_job_id": "41"})
    row = step(ctx, "j1", "RUNNING")
    assert (row["state"], row["attempt"]) == (S.RUNNING, 1)
    write(job, "exit.1", {"code": 3, "signal": None, "stop_cause": None})
    row = step(ctx, "j1", "RUNNING")  # the exit file decides, before Slurm says the job ended
    assert (row["state"], row["exit_code"], row["failure_class"]) == (S.FAILED, 3, "error")


def test_node_failure_requeue_then_the_new_attempt(ctx) -> None:
    job = add(ctx)
    write(job, "started.1", {"time": time.time()})
    assert step(ctx, "j1", "RUNNING")["state"] == S.RUNNING
    row = step(ctx, "j1", "PENDING")  # Slurm requeued it: no exit file for attempt 1
    assert row["state"] == S.QUEUED and "requeued by Slurm" in row["reason"]
    write(job, "started.2", {"time": time.time()})
    row = step(ctx, "j1", "RUNNING")
    assert (row["state"], row["attempt"]) == (S.RUNNING, 2)
    write(job, "exit.2", {"code": 0})
    assert step(ctx, "j1", "COMPLETED")["state"] == S.SUCCEEDED


def test_forgotten_and_scancelled_while_pending(ctx) -> None:
    add(ctx, "a", bid="51")
    add(ctx, "b", bid="52")
    row = step(ctx, "a", "CANCELLED")  # scancel outside gpurun before the wrapper started
    assert (row["state"], row["stop_cause"]) == (S.CANCELLED, "user")
    R._forgotten(ctx, ctx.store.get_job("b"))
    row = ctx.store.get_job("b")
    assert row["state"] == S.FAILED and "Slurm no longer knows job 52" in row["reason"]


def test_failure_within_budget_is_a_new_sbatch(ctx) -> None:
    job = add(ctx, retries=1)
    write(job, "started.1", {"time": time.time()})
    step(ctx, "j1", "RUNNING")
    Path(job["log"]).write_text("RuntimeError: NCCL timeout\n")
    write(job, "exit.1", {"code": 1})
    row = step(ctx, "j1", "FAILED")
    assert row["state"] == S.QUEUED and row["backend_id"] is None  # the next verb sbatches it again
    assert any(e["kind"] == "retry" for e in ctx.store.events(0, "j1"))


def test_requeue_after_the_end_follows_the_gate(ctx) -> None:
    job = add(ctx)
    write(job, "started.1", {"time": time.time() - 10})
    step(ctx, "j1", "RUNNING")
    write(job, "exit.1", {"code": -15, "signal": 15, "stop_cause": "quality"})
    assert step(ctx, "j1", "FAILED")["state"] == S.QUALITY_STOPPED
    time.sleep(0.01)
    # scontrol requeue; the wrapper's gate refused attempt 2: the row stays, one event says so
    write(job, "started.2", {"time": time.time()})
    write(job, "gate.2", {"why": "resume refused by quality gate: NaN"})
    write(job, "exit.2", {"code": None, "stop_cause": "quality"})
    for _ in range(2):
        assert step(ctx, "j1", "COMPLETED")["state"] == S.QUALITY_STOPPED
    refused = [e for e in ctx.store.events(0, "j1") if R.REQUEUE_REFUSED in e["message"]]
    assert len(refused) == 1 and "NaN" in refused[0]["message"]
    # a second requeue the gate let run: a new attempt, running again
    write(job, "started.3", {"time": time.time() + 1})
    row = step(ctx, "j1", "RUNNING")
    assert (row["state"], row["attempt"]) == (S.RUNNING, 3)


def test_finals_pending_reads_the_final_pass_cursor(ctx) -> None:
    from orchestrator.agent import quality_cadence

    assert not R._finals_pending(ctx.store)
    add(ctx)
    ctx.store.transition("j1", [S.QUEUED], S.CANCELLED, ended_at=time.time())
    assert R._finals_pending(ctx.store) == quality_cadence.finals_pending(ctx.store) is True
    quality_cadence.final_pass(ctx, time.time())
    assert R._finals_pending(ctx.store) == quality_cadence.finals_pending(ctx.store) is False


def test_a_retried_job_cancelled_before_its_new_sbatch_started(ctx) -> None:
    job = add(ctx)
    write(job, "started.1", {"time": time.time() - 5})
    step(ctx, "j1", "RUNNING")
    write(job, "exit.1", {"code": 2})
    assert step(ctx, "j1", "FAILED")["state"] == S.FAILED
    # queue retry: queued again with a new Slurm job, which is scancel'd while pending
    assert ctx.store.transition("j1", [S.FAILED], S.QUEUED, user_retry=True, attempt_base=1, ended_at=None)
    ctx.store.update_fields("j1", [S.QUEUED], backend_id="99")
    row = step(ctx, "j1", "CANCELLED")
    assert (row["state"], row["attempt"]) == (S.CANCELLED, 1)


def test_the_command_that_sees_a_failure_sends_its_notification(ctx, monkeypatch) -> None:
    """No daemon on a login node: the reconcile of a command sends the webhook, once."""
    from orchestrator.agent import notify
    from rigs import webhook

    with webhook.serve() as srv:
        monkeypatch.setenv("S2_HOOK", srv.url)
        ctx.config["notify"] = [{"kind": "generic", "url_env": "S2_HOOK"}]
        try:
            job = add(ctx)
            R.send_notifications(ctx)  # the first flush takes the history as seen
            write(job, "started.1", {"time": time.time()})
            step(ctx, "j1", "RUNNING")
            write(job, "exit.1", {"code": 3})
            step(ctx, "j1", "FAILED")
            R.send_notifications(ctx)
            R.send_notifications(ctx)  # nothing new: nothing sent again
            failed = [b for b in srv.bodies if b["kind"] == "failed"]
            assert len(failed) == 1 and "j1" in failed[0]["message"], srv.bodies
        finally:
            notify._CACHE.clear()
