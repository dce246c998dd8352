"""The in-allocation wrapper (``agent/slurmjob``) as its own process, fed a spec.json and the
environment Slurm gives it: its files, a TERM at the time limit, the resume gate on a requeue
(``SLURM_RESTART_COUNT``), a missing secret. Real subprocesses and signals; Slurm itself is in
``test_backend.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent.slurm import write_json


def spec(tmp_path: Path, command: str, **kw) -> Path:
    run_dir = tmp_path / "runs" / "j1"
    run_dir.mkdir(parents=True, exist_ok=True)
    s = {"id": "j1", "name": "j1", "command": command, "cwd": str(tmp_path), "env": {"MINE": "x"},
         "run_dir": str(run_dir), "log": str(run_dir / "log.txt"), "metrics": None, "checkpoints": None,
         "secrets": [], "timeout_s": None, "attempt_base": 0, "force_resume": False,
         "config": {"quality": {"action": "stop"}, "kill_grace_s": 2}}
    s.update(kw)
    write_json(str(run_dir / "spec.json"), s)
    return run_dir


def wrapper(tmp_path: Path, restart: int = 0) -> subprocess.Popen:
    env = dict(os.environ, SLURM_JOB_ID="77", SLURMD_NODENAME="n1")
    if restart:
        env["SLURM_RESTART_COUNT"] = str(restart)
    return subprocess.Popen([sys.executable, "-m", "orchestrator.agent", "slurmjob", "--state-dir", str(tmp_path),
                             "--job", "j1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / name).read_text())


def test_a_run_leaves_started_log_and_exit(tmp_path: Path) -> None:
    run_dir = spec(tmp_path, 'echo "$MINE $GPURUN_ATTEMPT $GPURUN_JOB_ID"; exit 5')
    p = wrapper(tmp_path)
    assert p.wait(30) == 5, p.stderr.read()
    started = read(run_dir, "started.1")
    assert (started["node"], started["slurm_job_id"], started["attempt"]) == ("n1", "77", 1)
    assert read(run_dir, "exit.1")["code"] == 5 and read(run_dir, "exit.1")["stop_cause"] is None
    assert "x 1 j1\n" in (run_dir / "log.txt").read_text()


def test_term_at_the_time_limit_is_a_timeout(tmp_path: Path) -> None:
    run_dir = spec(tmp_path, "echo up; sleep 60", timeout_s=1)
    p = wrapper(tmp_path)
    deadline = time.monotonic() + 20
    while "up" not in ((run_dir / "log.txt").read_text() if (run_dir / "log.txt").exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.2)
    p.send_signal(signal.SIGTERM)  # what Slurm sends at --time
    p.wait(30)
    ex = read(run_dir, "exit.1")
    assert (ex["code"], ex["signal"], ex["stop_cause"]) == (-15, 15, "timeout")


def test_requeue_of_a_stopped_run_is_refused_before_the_command(tmp_path: Path) -> None:
    run_dir = spec(tmp_path, "echo ran >> %s" % (tmp_path / "starts.txt"))
    write_json(str(run_dir / "quality.json"), {"verdict": "STOP", "reason": "nonfinite_loss at step 31",
                                               "attempt": 1, "evidence": None})
    p = wrapper(tmp_path, restart=1)  # scontrol requeue: attempt 2
    assert p.wait(60) == 0, p.stderr.read()
    assert "nonfinite_loss" in read(run_dir, "gate.2")["why"]
    assert read(run_dir, "exit.2")["stop_cause"] == "quality"
    assert not (tmp_path / "starts.txt").exists()
    # a user's `retry --force` (a new sbatch, restart 0) is not refused
    spec(tmp_path, "echo ran >> %s" % (tmp_path / "starts.txt"), attempt_base=2, force_resume=True)
    assert wrapper(tmp_path).wait(60) == 0
    assert (tmp_path / "starts.txt").read_text() == "ran\n" and read(run_dir, "exit.3")["code"] == 0


def test_a_missing_secret_fails_without_running(tmp_path: Path) -> None:
    run_dir = spec(tmp_path, "touch %s" % (tmp_path / "ran"), secrets=["HF_TOKEN"])
    assert wrapper(tmp_path).wait(30) == 0
    assert "HF_TOKEN" in read(run_dir, "exit.1")["error"] and not (tmp_path / "ran").exists()
