"""Reconcile after an agent restart: a pid counts as alive only with the job's marker."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from orchestrator.agent import procs
from orchestrator.agent import states as S
from orchestrator.agent.runner import Runner, started_path
from orchestrator.agent.store import Store


def _runner(tmp_path, retries: int = 0):
    store = Store(str(tmp_path / "db"))
    run_dir = tmp_path / "runs" / "j1"
    run_dir.mkdir(parents=True)
    store.insert_jobs([{"id": "j1", "name": "j1", "command": "true", "retries": retries,
                        "run_dir": str(run_dir), "log": str(run_dir / "log.txt")}])
    return store, Runner(store, str(tmp_path), {"slots": 1}, [sys.executable, "-c", "pass"]), run_dir


def test_reused_pid_without_marker_is_not_adopted(tmp_path):
    store, runner, run_dir = _runner(tmp_path)
    stranger = subprocess.Popen(["sleep", "30"])          # alive, but not our job: a reused pid
    try:
        assert store.transition("j1", [S.QUEUED], S.RUNNING, attempt=1, pid=stranger.pid, boot_id=runner.boot)
        (run_dir / "started.1").write_text(str(stranger.pid))
        runner.reconcile()
        job = store.get_job("j1")
        assert job["state"] == S.FAILED and "interrupted" in job["reason"]
        assert stranger.poll() is None                   # and the stranger was left alone
    finally:
        stranger.kill()


def test_row_from_before_reboot_is_stale(tmp_path):
    store, runner, run_dir = _runner(tmp_path, retries=1)
    assert store.transition("j1", [S.QUEUED], S.RUNNING, attempt=1, pid=os.getpid(), boot_id="an-older-boot")
    (run_dir / "started.1").write_text("1")
    runner.reconcile()
    job = store.get_job("j1")
    assert job["state"] == S.QUEUED and job["attempt"] == 1   # interrupted: back in the queue, retry budget used


def test_marked_process_is_adopted_and_its_exit_code_recorded(tmp_path):
    store, runner, run_dir = _runner(tmp_path)
    assert store.transition("j1", [S.QUEUED], S.RUNNING, attempt=1, pid=None, boot_id=runner.boot)
    env = dict(os.environ, **{procs.MARKER: procs.token("j1", 1)})
    code = ("import sys,time; from orchestrator.agent import jobwrap; "
            "jobwrap.run(sys.argv[1], sys.argv[2], sys.argv[3], '', 'sleep 1; exit 4')")
    wrapper = subprocess.Popen([sys.executable, "-c", code, started_path(store.get_job("j1"), 1),
                                str(run_dir / "exit.1"), str(run_dir / "log.txt")], env=env, start_new_session=True)
    time.sleep(0.3)
    runner.reconcile()                                    # the pid was never stored: found by its marker
    assert runner.pids["j1"] == wrapper.pid
    assert store.get_job("j1")["pid"] == wrapper.pid
    wrapper.wait(10)
    runner.children.clear()
    deadline = time.time() + 5
    while store.get_job("j1")["state"] == S.RUNNING and time.time() < deadline:
        runner.step()
        time.sleep(0.1)
    job = store.get_job("j1")
    assert job["state"] == S.FAILED and job["exit_code"] == 4


def test_claimed_but_never_started_costs_no_retry(tmp_path):
    store, runner, _ = _runner(tmp_path)
    assert store.transition("j1", [S.QUEUED], S.RUNNING, attempt=1, pid=None, boot_id=runner.boot)
    runner.reconcile()                                    # agent died between the claim and the start
    job = store.get_job("j1")
    assert job["state"] == S.QUEUED and job["attempt"] == 0
