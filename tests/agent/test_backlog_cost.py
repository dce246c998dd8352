"""Issue 15 item 4: a job start reads only what it places, never the whole queued set."""

from __future__ import annotations

import sys

from orchestrator.agent import states as S
from orchestrator.agent.runner import Runner
from orchestrator.agent.store import Store


def _store(tmp_path, n: int) -> Store:
    store = Store(str(tmp_path / "gpurun.db"))
    store.insert_jobs([{"id": "j%05d" % i, "name": "j%05d" % i, "command": "true",
                        "run_dir": str(tmp_path / "runs" / str(i)), "log": str(tmp_path / "runs" / str(i) / "log")}
                       for i in range(n)])
    return store


def _plan(store: Store, q: str, args=()) -> str:
    return " ".join(str(tuple(r)) for r in store.db.execute("EXPLAIN QUERY PLAN " + q, args).fetchall())


def test_queue_reads_are_index_ranges(tmp_path):
    store = _store(tmp_path, 10)
    assert "USING INDEX jobs_state (state=? AND rowid>?)" in _plan(
        store, "SELECT * FROM jobs WHERE state='queued' AND seq>? ORDER BY seq LIMIT ?", (0, 5))
    assert "jobs_queued_cancel" in _plan(
        store, "SELECT * FROM jobs INDEXED BY jobs_queued_cancel WHERE state='queued' AND cancel_requested=1")
    assert [j["id"] for j in store.queued_page(3, 2)] == ["j00002", "j00003", "j00004"]
    store.update_fields("j00007", [S.QUEUED], cancel_requested=1)
    assert [j["id"] for j in store.queued_cancelled()] == ["j00007"]


def test_a_pass_reads_a_page_not_the_backlog(tmp_path, monkeypatch):
    store = _store(tmp_path, 500)
    store.update_fields("j00400", [S.QUEUED], cancel_requested=1)  # deep in the queue
    runner = Runner(store, str(tmp_path), {"slots": 1, "gpus": []}, [sys.executable, "-c", "pass"])
    read = []
    page = store.queued_page
    monkeypatch.setattr(store, "queued_page", lambda limit, after=0: read.extend(page(limit, after)) or read[-limit:])
    monkeypatch.setattr(store, "jobs", lambda states=None: [] if states == [S.RUNNING] else 1 / 0)
    runner.step()
    assert len(read) <= 32
    assert store.get_job("j00000")["state"] == S.RUNNING
    assert store.get_job("j00400")["state"] == S.CANCELLED  # cancel checks reach the whole queue
    assert store.get_job("j00001")["state"] == S.QUEUED
    for proc in runner.children.values():
        proc.wait()
