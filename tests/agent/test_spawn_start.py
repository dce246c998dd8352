"""The daemon's fork of a job wrapper (``agent/spawn``): the child is marked from its first
instant (no round trip with the daemon before it runs), the daemon's own /proc environ is put
back at once, and the child records its start before it runs the job."""

from __future__ import annotations

import os
import time

from orchestrator.agent import spawn


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
