"""``gpurun agent status`` and ``gpurun agent stop`` through the real CLI, and the local agent
exiting on its own after ``agent.idle_exit_minutes`` (the next command starts a new one, and a
command arriving while an idle daemon exits is never left with no daemon)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, status_json



def agent_status() -> dict:
    res = gpurun("agent", "status", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _alive(pid: int) -> bool:
    """Running (a zombie whose parent has not reaped it yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _until(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while True:
        val = pred()
        if val:
            return val
        assert time.time() < deadline, what
        time.sleep(0.2)


def test_status_and_stop_through_the_cli(home: Path, tmp_path: Path):
    st = agent_status()
    assert st["running"] is False and st["pid"] is None  # looking does not start one
    assert st["jobs"] == {"queued": 0, "running": 0} and st["state_dir"].startswith(str(home))
    assert "not running" in gpurun("agent", "status").stdout

    q = tmp_path / "q.txt"
    q.write_text("[name=long] sleep 60\n[name=later] true\n")
    assert gpurun("queue", "submit", str(q)).returncode == 0
    st = _until(lambda: (lambda s: s if s["jobs"]["running"] == 1 else None)(agent_status()), 30, "job never ran")
    assert st["running"] is True and _alive(st["pid"]) and st["build"] and st["uptime_s"] >= 0
    assert st["jobs"] == {"queued": 1, "running": 1} and st["idle_exit_minutes"] == 30
    human = gpurun("agent", "status").stdout
    assert f"pid {st['pid']}" in human and "1 queued, 1 running" in human and st["state_dir"] in human
    # the local daemon's own cost, read on this machine by psutil
    assert st["process"]["rss_bytes"] > 1 << 20 and st["process"]["threads"] >= 1
    assert "MB resident" in human and "% CPU" in human
    assert gpurun("agent", "status", "-H", "local", "--json").returncode == 0

    refused = gpurun("agent", "stop")  # no TTY here: refuses rather than leave jobs unwatched
    assert refused.returncode == 2 and "1 job(s) running on local (long)" in refused.stderr
    assert "--yes" in refused.stderr and _alive(st["pid"])

    stop = gpurun("agent", "stop", "--yes")
    assert stop.returncode == 0, stop.stderr
    assert f"stopped the agent on local (pid {st['pid']})" in stop.stderr
    assert "keep running detached" in stop.stderr and "1 queued job(s) wait" in stop.stderr
    _until(lambda: not _alive(st["pid"]), 5, "the daemon let go of its lock but lives on")
    after = agent_status()
    assert after["running"] is False and after["jobs"] == {"queued": 1, "running": 1}
    job_pid = int(next((home / ".local/share").rglob("started.1")).read_text())
    assert _alive(job_pid)  # detached: the job outlived its agent

    again = gpurun("agent", "stop", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["stopped"] is False

    # any other command starts a new daemon, which re-adopts the running job
    jobs = {j["name"]: j for j in status_json()["jobs"]}
    assert jobs["long"]["state"] == "running"
    new = agent_status()
    assert new["running"] and new["pid"] != st["pid"]
    assert gpurun("queue", "cancel", "long").returncode == 0


def _tiny_idle(home: Path, minutes: float) -> None:
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True, exist_ok=True)
    (prof / "local.yaml").write_text(f"agent:\n  idle_exit_minutes: {minutes}\n")


def test_idle_local_agent_exits_and_the_next_command_starts_it(home: Path, tmp_path: Path):
    _tiny_idle(home, 0.05)  # 3 s
    q = tmp_path / "q.txt"
    q.write_text("[name=quick] sleep 4\n")
    assert gpurun("queue", "submit", str(q), "--wait").returncode == 0
    first = agent_status()
    assert first["running"] and first["idle_exit_minutes"] == pytest.approx(0.05)
    # the running job kept it alive; once idle it goes within the limit plus a tick
    _until(lambda: not agent_status()["running"], 20, "idle agent did not exit")
    _until(lambda: not _alive(first["pid"]), 5, "the idle daemon let go of its lock but lives on")
    evs = json.loads(gpurun("queue", "events", "--json").stdout)["events"]
    assert any(e["kind"] == "agent_stop" and e["data"].get("cause") == "idle" for e in evs)
    assert status_json()["jobs"][0]["state"] == "succeeded"  # the next command starts it again
    assert agent_status()["running"]


def _ended_at() -> float:
    """When the local agent settled its last job, read from its store without a verb (a verb
    would start a daemon or count as activity)."""
    from orchestrator import paths

    db = sqlite3.connect("file:%s?mode=ro" % (paths.local_state_dir("local") / "gpurun.db"), uri=True)
    try:
        return float(db.execute("SELECT max(ended_at) FROM jobs").fetchone()[0])
    finally:
        db.close()


def test_a_command_during_an_idle_exit_always_finds_a_daemon(home: Path, tmp_path: Path):
    _tiny_idle(home, 0.03)  # 1.8 s after the job's end (or the last command) the daemon decides to exit
    for i in range(6):
        q = tmp_path / f"q{i}.txt"
        q.write_text(f"[name=j{i}] true\n")
        assert gpurun("queue", "submit", str(q)).returncode == 0
        # agent_info neither starts a daemon nor counts as activity: a job left queued with no
        # daemon (ensure answered "running" for one on its way out) would stay queued here
        _until(lambda: agent_status()["jobs"] == {"queued": 0, "running": 0}, 15,
               f"job j{i} left queued with no daemon: {agent_status()}")
        # the next submit's ensure lands before, at and after that decision (the job's end +
        # 1.8 s): its CLI starts from 1.2 s before it to 0.3 s after, and takes a while to ensure
        time.sleep(max(0.0, _ended_at() + 1.8 - 1.2 + 0.3 * i - time.time()))
