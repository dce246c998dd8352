"""The start path between two jobs (issue 15, the gap). The daemon's fork of a job wrapper
(``agent/spawn``): the child is marked from its first instant (no round trip with the daemon
before it runs), the daemon's own /proc environ is put back at once, and the child records its
start before it runs the job. The runner starts the next job as soon as the last one's process
ends, while that one's wrapper still writes its exit code durably, and settles it after."""

from __future__ import annotations

import os
import sys
import time

from orchestrator.agent import jobwrap, spawn
from orchestrator.agent import states as S
from orchestrator.agent.runner import Runner, exit_path
from orchestrator.agent.store import Store


def test_the_forked_wrapper_is_born_marked_and_records_its_own_start(tmp_path):
    go, ran = tmp_path / "go", tmp_path / "ran"
    env = dict(os.environ, GPURUN_JOB_TOKEN="jx:1", GPURUN_RUN_DIR=str(tmp_path), GPURUN_JOB_ID="jx",
               GPURUN_ATTEMPT="1", GPURUN_ENV_FILE="", SEEN="yes")
    args = [str(tmp_path / "started.1"), str(tmp_path / "exit.1"), str(tmp_path / "log.txt"), str(tmp_path),
            f'while [ ! -e {go} ]; do sleep 0.02; done; echo "$SEEN $GPURUN_JOB_TOKEN" > {ran}; exit 5']
    own = open("/proc/self/environ", "rb").read()
    child = spawn.start(args, env, "GPURUN_JOB_TOKEN")
    assert child is not None
    # read at once, before the child may have run a line of its own: the marker is there
    environ = open(f"/proc/{child.pid}/environ", "rb").read().split(b"\0")
    assert b"GPURUN_JOB_TOKEN=jx:1" in environ and f"GPURUN_RUN_DIR={tmp_path}".encode() in environ
    assert open("/proc/self/environ", "rb").read() == own  # the daemon's block is its own again
    deadline = time.time() + 10
    while not (tmp_path / "started.1").exists() and time.time() < deadline:
        time.sleep(0.01)
    assert int((tmp_path / "started.1").read_text()) == child.pid
    assert os.getsid(child.pid) == child.pid
    assert open(f"/proc/{child.pid}/cmdline", "rb").read().startswith(b"gpurun-jobwrap\0")
    go.write_text("")
    while child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert child.returncode == 0
    assert ran.read_text() == "yes jx:1\n" and (tmp_path / "exit.1").read_text() == "5\n"


def test_the_next_job_starts_while_the_last_wrapper_still_writes_its_code(tmp_path, monkeypatch):
    real = jobwrap.write_durably

    def slow(path: str, code: int, sync: bool = True) -> None:  # the wrappers are forks of this process
        if path.endswith(os.path.join("a", "exit.1")):
            time.sleep(1.0)
        real(path, code, sync)
    monkeypatch.setattr(jobwrap, "write_durably", slow)
    store = Store(str(tmp_path / "gpurun.db"))
    tag = "gap-%d" % os.getpid()
    store.insert_jobs([{"id": "%s-%s" % (tag, n), "name": "%s-%s" % (tag, n), "command": cmd,
                        "run_dir": str(tmp_path / n), "log": str(tmp_path / n / "log.txt")}
                       for n, cmd in (("a", "true"), ("b", "sleep 0.2"))])
    a, b = (store.get_job("%s-%s" % (tag, n)) for n in "ab")
    runner = Runner(store, str(tmp_path), {"slots": 1, "gpus": []}, [sys.executable, "-m", "orchestrator.agent"])
    deadline = time.time() + 10
    while store.get_job(b["id"])["state"] == S.QUEUED and time.time() < deadline:
        runner.step()
        time.sleep(0.02)
    assert store.get_job(b["id"])["state"] == S.RUNNING
    assert store.get_job(a["id"])["state"] == S.RUNNING and not os.path.exists(exit_path(a, 1))  # still writing
    while not all(S.is_terminal(store.get_job(j["id"])["state"]) for j in (a, b)) and time.time() < deadline:
        runner.step()
        time.sleep(0.02)
    assert [(store.get_job(j["id"])["state"], store.get_job(j["id"])["exit_code"]) for j in (a, b)] == \
        [(S.SUCCEEDED, 0), (S.SUCCEEDED, 0)]
