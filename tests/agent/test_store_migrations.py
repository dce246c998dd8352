"""Store migrations: an old box's ``gpurun.db`` opens intact, a newer one is refused untouched.

``fixtures/gpurun-v0.db`` was written by the real agent before schema versioning (see
``fixtures/make_v0_db.py``): nine jobs in every state, events with data, kv and pull records.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.agent.framing import unframe
from orchestrator.agent.migrations import LATEST, MIGRATIONS
from orchestrator.agent.store import Store, StoreTooNew

FIXTURE = Path(__file__).parent / "fixtures" / "gpurun-v0.db"
REPO = Path(__file__).resolve().parents[2]
DB_NAME = "gpurun.db"  # orchestrator.agent daemon/control files(): the store's name in a state dir


def _box(tmp_path: Path, version: int | None = None) -> Path:
    """A state dir holding a copy of the v0 fixture (optionally stamped with ``version``)."""
    state = tmp_path / "state"
    state.mkdir()
    shutil.copyfile(FIXTURE, state / DB_NAME)
    if version is not None:
        db = sqlite3.connect(str(state / DB_NAME), isolation_level=None)
        db.execute("PRAGMA user_version=%d" % version)
        db.close()
    return state


ADDED = ("stop_cause", "secrets", "quality", "failure_class", "failure_hint",  # columns of migrations 2-6
         "moved_to", "backend_id")


def _dump(path: Path) -> dict:
    """Every row of every table, by plain sqlite3 (no Store), minus columns added by migrations."""
    db = sqlite3.connect(str(path))
    db.row_factory = sqlite3.Row
    out = {}
    for table, key in (("jobs", "seq"), ("events", "id"), ("kv", "key")):
        rows = [dict(r) for r in db.execute("SELECT * FROM %s ORDER BY %s" % (table, key))]
        out[table] = [{k: v for k, v in r.items() if k not in ADDED} for r in rows]
    db.close()
    return out


def _pragma(path: Path, name: str):
    db = sqlite3.connect(str(path))
    try:
        return db.execute("PRAGMA %s" % name).fetchall()
    finally:
        db.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _agent(verb: str, state: Path, req: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.agent", verb, "--state-dir", str(state)],
                          input=json.dumps(req or {}), capture_output=True, text=True, cwd=str(REPO), timeout=timeout, check=False)


def test_fixture_is_a_pre_versioning_db():
    db = FIXTURE
    assert db.stat().st_size < 100 * 1024
    assert _pragma(db, "user_version") == [(0,)]
    assert "stop_cause" not in [c[1] for c in _pragma(db, "table_info(jobs)")]
    assert not Path(str(db) + "-wal").exists()


def test_old_box_opens_with_every_record_intact(tmp_path):
    path = _box(tmp_path) / DB_NAME
    before = _dump(path)
    assert len(before["jobs"]) == 9 and len(before["events"]) >= 15 and len(before["kv"]) == 3

    store = Store(str(path))
    jobs = {j["id"]: j for j in store.jobs()}
    events = store.events(limit=10_000)
    pulled = store.kv_get("pulled:v0-done-03")
    idle = store.kv_get("autostop.idle_since")
    store.close()

    assert _dump(path) == before                    # every old column of every row, byte for byte
    assert _pragma(path, "user_version") == [(LATEST,)]
    assert "stop_cause" in [c[1] for c in _pragma(path, "table_info(jobs)")]
    assert "secrets" in [c[1] for c in _pragma(path, "table_info(jobs)")]
    assert all(j["secrets"] == [] for j in jobs.values())  # an old job asked for no secret
    assert all(j["quality"] is None and j["failure_class"] is None for j in jobs.values())
    assert _pragma(path, "journal_mode") == [("wal",)]

    states = {jid: j["state"] for jid, j in jobs.items()}
    assert states == {"v0-queued-01": "queued", "v0-running-02": "running", "v0-done-03": "succeeded",
                      "v0-failed-04": "failed", "v0-cancel-05": "cancelled", "v0-quality-06": "quality_stopped",
                      "v0-wdkill-07": "running", "v0-qstop-08": "running", "v0-retried-09": "queued"}
    q = jobs["v0-queued-01"]
    assert q["env"] == {"WANDB_MODE": "offline", "SEED": "7"} and q["gpus"] == 1 and q["retries"] == 2
    assert jobs["v0-running-02"]["gpu_ids"] == [0, 1] and jobs["v0-running-02"]["pid"] == 4242
    assert jobs["v0-failed-04"]["attempt"] == 2 and jobs["v0-failed-04"]["exit_code"] == 137
    assert jobs["v0-retried-09"]["attempt_base"] == 1 and jobs["v0-retried-09"]["reason"] == "retry requested"
    assert jobs["v0-wdkill-07"]["cancel_requested"] is True
    assert [e["message"] for e in events if e["kind"] == "retry"] == [
        "attempt 1 ended (exit code 1); retrying (1 of 1 retries used)"]
    qs = [e for e in events if e["kind"] == "quality_stopped"]
    assert qs and qs[0]["data"]["verdict"] == "STOP" and qs[0]["data"]["evidence"].endswith("evidence.json")
    assert pulled["where"] == "home" and pulled["at"] == 1700000600.0
    assert pulled["files"] == {"log.txt": "a" * 64, "ckpt/model.pt": "b" * 64}
    assert idle == 1700000500.5


def test_migration_backfills_stop_cause_from_the_old_reason_rules(tmp_path):
    """Jobs outlive the daemon across an upgrade: a stop the old agent asked for must end the
    same way when the new agent settles it."""
    store = Store(str(_box(tmp_path) / DB_NAME))
    causes = {j["id"]: j["stop_cause"] for j in store.jobs()}
    store.close()
    assert causes == {"v0-queued-01": None, "v0-running-02": None, "v0-done-03": None, "v0-failed-04": None,
                      "v0-cancel-05": "user", "v0-quality-06": "quality", "v0-wdkill-07": "watchdog",
                      "v0-qstop-08": "quality", "v0-retried-09": None}


def test_real_agent_status_on_an_old_box(tmp_path):
    state = _box(tmp_path)
    before = _dump(state / DB_NAME)
    res = _agent("status", state)
    assert res.returncode == 0, res.stderr
    reply = unframe(res.stdout)
    assert reply["ok"], reply
    got = {j["id"]: (j["name"], j["state"], j["attempt"], j["exit_code"]) for j in reply["result"]["jobs"]}
    assert got == {r["id"]: (r["name"], r["state"], r["attempt"], r["exit_code"]) for r in before["jobs"]}
    assert _pragma(state / DB_NAME, "user_version") == [(LATEST,)]
    ev = unframe(_agent("events", state, {"job": "flaky"}).stdout)
    assert ev["ok"] and [e["data"].get("to") for e in ev["result"]["events"] if e["kind"] == "state"][-1] == "failed"
    assert _dump(state / DB_NAME) == before


def test_newer_db_is_refused_and_left_untouched(tmp_path):
    state = _box(tmp_path, version=LATEST + 1)
    path = state / DB_NAME
    digest = _sha(path)

    with pytest.raises(StoreTooNew) as err:
        Store(str(path))
    msg = str(err.value)
    assert "newer gpurun agent" in msg and "schema %d" % (LATEST + 1) in msg and "knows %d" % LATEST in msg
    assert err.value.kind == "store_too_new" and "upgrade" in err.value.hint

    # the real agent: a framed error reply, not a traceback
    res = _agent("status", state)
    reply = unframe(res.stdout)
    assert not reply["ok"] and reply["error"]["kind"] == "store_too_new", reply
    assert "schema %d" % (LATEST + 1) in reply["error"]["message"] and reply["error"]["hint"]
    assert "trace" not in reply["error"]

    # the daemon refuses to start (non-zero, the reason in its log) rather than write to it
    daemon = _agent("daemon", state, timeout=30)
    assert daemon.returncode != 0
    assert "newer gpurun agent" in daemon.stderr

    assert _sha(path) == digest
    assert not (state / (DB_NAME + "-wal")).exists() and not (state / (DB_NAME + "-journal")).exists()
    assert _pragma(path, "user_version") == [(LATEST + 1,)]


def test_fresh_db_gets_the_newest_schema_same_as_a_migrated_one(tmp_path):
    fresh = tmp_path / "fresh.db"
    Store(str(fresh)).close()
    migrated = _box(tmp_path) / DB_NAME
    Store(str(migrated)).close()
    assert _pragma(fresh, "user_version") == [(LATEST,)]
    assert _pragma(fresh, "journal_mode") == [("wal",)]
    for table in ("jobs", "events", "kv"):
        assert _pragma(fresh, "table_info(%s)" % table) == _pragma(migrated, "table_info(%s)" % table)
    assert [m[0] for m in MIGRATIONS] == list(range(1, LATEST + 1))


def test_migration_is_idempotent_and_a_current_open_writes_nothing(tmp_path):
    path = _box(tmp_path) / DB_NAME
    Store(str(path)).close()
    after_first = _dump(path)
    causes = _pragma(path, "user_version")
    digest = _sha(path)
    s = Store(str(path))
    assert s.db.total_changes == 0               # already current: nothing ran
    s.close()
    assert _dump(path) == after_first and _pragma(path, "user_version") == causes
    assert _sha(path) == digest


@pytest.mark.parametrize("kind", ["old", "fresh"])
def test_processes_opening_a_db_at_once_all_succeed(tmp_path, kind):
    path = _box(tmp_path) / DB_NAME if kind == "old" else tmp_path / DB_NAME
    before = _dump(path) if kind == "old" else {"jobs": [], "events": [], "kv": []}
    want = "9" if kind == "old" else "0"
    start_at = time.time() + 1.0
    code = ("import sys, time; from orchestrator.agent.store import Store\n"
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
            "s = Store(sys.argv[1]); print(len(s.jobs())); s.close()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), repr(start_at)], cwd=str(REPO),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == want
    assert _pragma(path, "user_version") == [(LATEST,)]
    assert _dump(path) == before
    cols = [c[1] for c in _pragma(path, "table_info(jobs)")]
    assert cols.count("stop_cause") == 1


def test_failed_migration_rolls_back(tmp_path, monkeypatch):
    from orchestrator.agent import migrations

    path = _box(tmp_path) / DB_NAME
    before = _dump(path)
    broken = list(migrations.MIGRATIONS) + [(LATEST + 1, "broken", ["ALTER TABLE jobs ADD COLUMN x TEXT",
                                                                    "THIS IS NOT SQL"])]
    monkeypatch.setattr(migrations, "MIGRATIONS", broken)
    monkeypatch.setattr(migrations, "LATEST", LATEST + 1)
    with pytest.raises(sqlite3.Error):
        Store(str(path))
    assert _pragma(path, "user_version") == [(0,)]   # nothing of 1..N+1 stuck: one transaction
    cols = [c[1] for c in _pragma(path, "table_info(jobs)")]
    assert "stop_cause" not in cols and "x" not in cols
    assert _dump(path) == before
    assert not os.path.exists(str(path) + "-journal")


def test_older_agent_never_stops_a_newer_daemon(tmp_path):
    """``ensure`` from a build that cannot read the store refuses before replacing the daemon."""
    from orchestrator.agent import control

    state = tmp_path / "state"
    state.mkdir()
    pyz = str(REPO / "orchestrator" / "agent" / "__main__.py")
    # the newer daemon: it runs, holds the lock, and its store is one schema ahead of this agent
    first = control.ensure(str(state), pyz, "newer-build")
    assert first["action"] == "started"
    try:
        db = sqlite3.connect(str(state / DB_NAME), isolation_level=None)
        db.execute("PRAGMA user_version=%d" % (LATEST + 1))
        db.close()
        with pytest.raises(StoreTooNew):
            control.ensure(str(state), pyz, "older-build", timeout=5)
        info = control.running_daemon(str(state))
        assert info is not None and info["build"] == "newer-build" and info["pid"] == first["pid"]
    finally:
        os.kill(first["pid"], 15)
