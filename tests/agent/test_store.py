"""The SQLite store: compare-and-set transitions, ordered states, concurrent writers."""

from __future__ import annotations

import multiprocessing as mp

from orchestrator.agent import states as S
from orchestrator.agent.store import Store


def _job(i: int) -> dict:
    return {"id": "j%d" % i, "name": "n%d" % i, "command": "true", "run_dir": "/r/%d" % i, "log": "/r/%d/l" % i}


def test_cas_transitions_and_late_writer(tmp_path):
    s = Store(str(tmp_path / "db"))
    s.insert_jobs([_job(1)])
    assert s.transition("j1", [S.QUEUED], S.RUNNING, attempt=1)
    assert not s.transition("j1", [S.QUEUED], S.RUNNING)           # second claimer loses
    assert s.transition("j1", [S.RUNNING], S.SUCCEEDED, exit_code=0)
    # a late writer (e.g. a stale daemon) cannot move a finished job anywhere
    for dst in (S.RUNNING, S.QUEUED, S.FAILED, S.CANCELLED):
        assert not s.transition("j1", [S.RUNNING, S.QUEUED], dst)
    assert not s.transition("j1", [S.SUCCEEDED], S.FAILED)           # not an allowed move at all
    assert s.get_job("j1")["state"] == S.SUCCEEDED
    # only an explicit user retry reopens it
    assert s.transition("j1", [S.SUCCEEDED], S.QUEUED, user_retry=True)
    kinds = [e["data"].get("to") for e in s.events(job_id="j1")]
    assert kinds == [S.RUNNING, S.SUCCEEDED, S.QUEUED]


def test_get_job_by_id_name_or_number(tmp_path):
    s = Store(str(tmp_path / "db"))
    s.insert_jobs([_job(1), _job(2)])
    assert s.get_job("j2")["name"] == "n2"
    assert s.get_job("n1")["id"] == "j1"
    assert s.get_job("2")["id"] == "j2" and s.get_job("#1")["id"] == "j1"
    assert s.get_job("nope") is None


def _insert_many(path: str, start: int) -> None:
    s = Store(path)
    for i in range(start, start + 200, 10):
        s.insert_jobs([_job(k) for k in range(i, i + 10)])
    s.close()


def test_concurrent_inserts_from_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "db")
    Store(path).close()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_insert_many, args=(path, base)) for base in (0, 100, 200, 300)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ids = {j["id"] for j in Store(path).jobs()}
    assert ids == {"j%d" % i for i in range(0, 500)}   # overlapping ranges dedupe, none lost
