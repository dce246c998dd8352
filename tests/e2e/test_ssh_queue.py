"""The queue over a real SSH link: jobs survive a cut connection and a dead sshd, status
shows the truth afterwards, and an interrupted submit retried adds each job once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under
from rigs.sshd import _comm, _descendants

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

NAME = "it's a $(touch PWNED) `job` ; &"


@pytest.fixture
def box(ssh_host):
    from orchestrator.transport.ssh import SSHTransport

    with SSHTransport(ssh_host) as t:
        t.run(f"mkdir -p {ssh_host['workdir']} {ssh_host['state_dir']}")
    yield ssh_host
    kill_agents_under(Path(ssh_host["state_dir"]).parent)


def status(host: str) -> list[dict]:
    res = gpurun("queue", "status", "--host", host, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["jobs"]


def test_jobs_survive_cut_link_and_dead_sshd(box, sshd, tmp_path):
    work = Path(box["workdir"])
    q = tmp_path / "q.txt"
    q.write_text("".join(
        f'[name="{NAME} {i}" gpus=0] sleep 4 && printf %s "{i} $GPURUN_JOB_ID" > "out {i}.txt"\n'
        for i in range(3)))
    res = gpurun("queue", "submit", str(q), "--host", "box", "--slots", "3", "--cwd", str(work),
                 "--json")
    assert res.returncode == 0, res.stderr
    deadline = time.time() + 30
    while not all(j["state"] == "running" for j in status("box")):
        assert time.time() < deadline, status("box")
        time.sleep(0.3)
    sshd.kill_connections()
    sshd.stop()  # the box's sshd dies while the jobs run
    down = gpurun("queue", "status", "--host", "box", timeout=60)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert down.stderr.startswith("gpurun: error: cannot reach box")
    # the jobs finish while the box's sshd is down (their last act is writing their output)
    deadline = time.time() + 30
    while not all((work / f"out {i}.txt").exists() for i in range(3)):
        assert time.time() < deadline, sorted(p.name for p in work.iterdir())
        time.sleep(0.1)
    sshd.start()
    jobs = status("box")
    while any(j["state"] == "running" for j in jobs) and time.time() < deadline:  # the exit being recorded
        time.sleep(0.2)
        jobs = status("box")
    assert sorted(j["name"] for j in jobs) == [f"{NAME} {i}" for i in range(3)]
    assert {j["state"] for j in jobs} == {"succeeded"}
    for j in jobs:
        i = j["name"].rsplit(" ", 1)[1]
        assert (work / f"out {i}.txt").read_text() == f"{i} {j['id']}"
    assert not list(work.rglob("PWNED")) and not (Path.home() / "PWNED").exists()


def _agent_verb_running(rig) -> bool:
    return any(_comm(p).startswith("python") for p in _descendants(rig.proc.pid))


def test_interrupted_submit_retried_adds_each_job_once(box, sshd, tmp_path):
    import subprocess
    import sys

    n = 1500
    q = tmp_path / "many.txt"
    q.write_text("".join(f"[name=j{i} gpus=0] true\n" for i in range(n)))
    assert gpurun("queue", "status", "--host", "box").returncode == 0  # agent shipped + ensured
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "queue", "submit", str(q),
                             "--host", "box", "--json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not _agent_verb_running(sshd) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    cut = sshd.kill_connections()
    out, err = proc.communicate(timeout=60)
    assert cut, "the submit finished before its connection could be cut"
    assert proc.returncode == 1, (out, err)
    failure = json.loads(out)["error"]  # --json: the failure is a JSON document on stdout
    assert failure["code"] == "transport" and failure["message"].startswith("box: connection lost"), failure
    assert "Traceback" not in err
    res = gpurun("queue", "submit", str(q), "--host", "box", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    jobs = status("box")
    names = [j["name"] for j in jobs]
    assert len(names) == n and len(set(names)) == n
