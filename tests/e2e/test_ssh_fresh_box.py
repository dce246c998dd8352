"""A fresh SSH box, never set up and never pushed to, runs a queue: the agent makes gpurun's own
directories (the host's workdir, its state and run dirs), and a job whose own ``cwd=`` is
missing fails with that path as its reason instead of exit 127."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@pytest.fixture
def fresh(ssh_host):
    assert not Path(ssh_host["workdir"]).exists() and not Path(ssh_host["state_dir"]).exists()
    yield ssh_host
    kill_agents_under(Path(ssh_host["state_dir"]).parent)


def test_fresh_box_runs_a_queue_without_setup_or_push(fresh, tmp_path):
    work = Path(fresh["workdir"])
    missing = work.parent / "no such dir"
    q = tmp_path / "q.txt"
    q.write_text(f'[name=plain gpus=0] pwd > here.txt && echo ran\n'
                 f'[name=lost gpus=0 cwd="{missing}"] echo never\n')
    res = gpurun("queue", "submit", str(q), "--host", "box", "--wait", "--json", timeout=120)
    assert res.returncode == 1, res.stderr  # one job failed
    jobs = {j["name"]: j for j in json.loads(res.stdout)["jobs"]}

    plain = jobs["plain"]
    assert (plain["state"], plain["exit_code"]) == ("succeeded", 0), plain
    assert (work / "here.txt").read_text().strip() == str(work)
    assert Path(plain["run_dir"]).is_dir()

    lost = jobs["lost"]
    assert lost["state"] == "failed" and lost["exit_code"] is None, lost
    assert lost["reason"] == f"working directory {missing} does not exist"
    assert not missing.exists()  # a user's cwd= is never created behind their back
    log = gpurun("queue", "logs", "lost", "--host", "box")
    assert log.returncode == 0 and f"not started: working directory {missing} does not exist" in log.stdout
