"""Issue 15 item 3: ``queue status`` as a table asks the agent for the table's columns only, and
draws the table without rich. Real CLI, real local agent, real SQLite store: the table view must
carry the same values as the whole wire job, render the same bytes, and weigh far less."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.agent.store import TABLE_COLS, Store
from rigs.agents import gpurun, status_json


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    for k in ("TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR", "COLUMNS", "LINES", "TERM", "GPURUN_HOST"):
        env.pop(k, None)
    env.update(extra)
    return env


@pytest.fixture
def backlog(home: Path, tmp_path: Path) -> Path:
    """``local`` with one running job, then 60 rows as a long day leaves them: queued, failed with
    a class and a verdict, succeeded but judged STOP, on GPUs; long paths and env like real jobs.
    The running job holds the host's one slot, so the daemon starts none of the queued rows
    between two reads (it did under load, and a read saw one row fewer queued)."""
    q = tmp_path / "q.txt"
    q.write_text("[name=first] sleep 300\n")
    assert gpurun("queue", "submit", str(q)).returncode == 0
    deadline = time.time() + 30
    while status_json()["jobs"][0]["state"] != "running":
        assert time.time() < deadline, "the first job did not start"
        time.sleep(0.2)
    from orchestrator import paths
    db = paths.local_state_dir("local") / "gpurun.db"
    store = Store(str(db))
    runs = tmp_path / ("very/long/run/dir/" * 4)
    store.insert_jobs([{"id": "b%05d" % i, "name": "sweep-%d" % i, "command": "python train.py --seed %d" % i,
                        "env": {"WANDB_MODE": "offline"}, "cwd": str(tmp_path), "gpus": 2,
                        "run_dir": str(runs / str(i)), "log": str(runs / str(i) / "log.txt")} for i in range(60)])
    t = time.time()
    stop = {"verdict": "STOP", "reason": "nonfinite_loss at step 5", "rule": "nonfinite_loss", "final": True}
    store.db.execute("UPDATE jobs SET state='failed', exit_code=1, attempt=1, started_at=?, ended_at=?, reason='exit 1',"
                     " failure_class='cuda_oom', failure_hint='lower the batch', gpu_ids='[0, 1]', quality=?"
                     " WHERE seq % 3 = 0", (t - 90, t - 30, json.dumps({"verdict": "CONTINUE", "final": True})))
    store.db.execute("UPDATE jobs SET state='succeeded', exit_code=0, attempt=2, started_at=?, ended_at=?, gpu_ids='[3]',"
                     " quality=? WHERE seq % 3 = 1 AND seq > 1", (t - 4000, t - 10, json.dumps(stop)))
    store.close()
    return db


def _render(jobs: list, tty: bool, monkeypatch) -> str:
    from orchestrator.cli.render import print_job_table
    monkeypatch.setenv("TTY_COMPATIBLE", "1" if tty else "0")
    monkeypatch.setenv("COLUMNS", "100")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_job_table("local", jobs, 1)
    return buf.getvalue()


def test_table_view_carries_the_table_columns_with_the_same_values(backlog, monkeypatch):
    from orchestrator.core.session import open_session
    with open_session("local") as s:
        full = s.status()["jobs"]
        table = s.status(table=True)["jobs"]
    assert len(full) == len(table) == 61
    assert all(tuple(r) == TABLE_COLS for r in table)
    assert table == [{k: j[k] for k in TABLE_COLS} for j in full]    # same values, decoded alike
    assert {r["state"] for r in table} == {"running", "queued", "failed", "succeeded"}
    assert any(r["quality"] and r["quality"]["verdict"] == "STOP" for r in table)
    # a fifth or so of the bytes: no paths, command, env, hints
    assert len(json.dumps(table)) < 0.4 * len(json.dumps(full)), (len(json.dumps(table)), len(json.dumps(full)))
    # the table drawn from either is the same, on a terminal and piped (an older agent sends whole jobs)
    for tty in (True, False):
        drawn = _render(table, tty, monkeypatch)
        assert drawn == _render(full, tty, monkeypatch)
        assert "quality STOP (final): nonfinite_loss at step 5" in drawn and "exit 1 [cuda_oom]" in drawn


def test_status_on_a_terminal_draws_without_importing_rich(backlog):
    res = gpurun("queue", "status", env=_env(TTY_COMPATIBLE="1", COLUMNS="100", PYTHONPROFILEIMPORTTIME="1"))
    assert res.returncode == 0, res.stderr
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in res.stderr.splitlines() if ln.startswith("import time:")}
    assert "orchestrator.cli.render" in imported and not {m for m in imported if m.split(".")[0] == "rich"}
    lines = res.stdout.splitlines()
    assert lines[0] == "\x1b[1mqueue on local: 20 failed, 20 queued, 1 running, 20 succeeded; 20 judged STOP\x1b[0m"
    assert "\x1b[32msucceeded\x1b[0m" in res.stdout and "\x1b[1;31mSTOP    \x1b[0m" in res.stdout  # CONTINUE sets the width
    assert all(len(ln) <= 100 + 40 for ln in lines)                  # fitted (colour codes aside)


@pytest.mark.parametrize("env", [
    {}, {"TTY_COMPATIBLE": "1"}, {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, {"FORCE_COLOR": "1", "COLUMNS": "70"},
    {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1", "NO_COLOR": "1", "COLUMNS": "300"},
    {"TTY_COMPATIBLE": "1", "TERM": "dumb", "COLUMNS": "120"}, {"TTY_COMPATIBLE": "1", "TERM": "dumb", "COLUMNS": "120", "LINES": "9"},
    {"TTY_COMPATIBLE": "1", "TERM": "unknown"}, {"TTY_COMPATIBLE": "1", "COLUMNS": "x1"}, {"TTY_COMPATIBLE": "1", "NO_COLOR": ""},
])
def test_terminal_decides_as_rich_does(env, monkeypatch):
    from rich.console import Console

    from orchestrator.cli.render import terminal
    for k in ("TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR", "COLUMNS", "LINES", "TERM"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "stdout", io.StringIO())                # not a terminal by isatty
    con = Console(highlight=False)
    styles = bool(con.is_terminal and con.color_system)
    assert terminal() == (con.width, styles, styles and not con.no_color)


def test_header_wraps_at_a_narrow_terminal(monkeypatch):
    """A CPU host's slot note plus several states made the header wider than 80 columns: it now
    wraps like the table fits, every line within the width, nothing dropped."""
    import re
    from orchestrator.cli.render import job_header, print_job_table
    jobs = [{"id": "j%d" % i, "seq": i + 1, "name": "n%d" % i, "state": st, "gpus": 0, "attempt": 1, "exit_code": None,
             "quality": {"verdict": "STOP"} if st == "quality_stopped" else None}
            for i, st in enumerate(("quality_stopped", "succeeded", "succeeded", "failed", "running", "queued"))]
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "60")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_job_table("local", jobs, 1)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()).splitlines()
    assert all(len(ln) <= 60 for ln in lines), lines
    head = job_header("local", jobs, 1)
    assert len(head) > 60 and " ".join(ln.strip() for ln in lines[:2]) == head
