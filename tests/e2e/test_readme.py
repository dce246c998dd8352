"""The README's front door stays true: its first command (after the install) runs the example
queue to the end on ``local``, and every command it lists exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rigs.agents import gpurun

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
pytest.importorskip("numpy")



def test_first_command_runs_the_example_queue(example_run):
    block = re.search(r"```bash\n(pip install [^\n]+)\n```", README).group(1)
    assert block.startswith('pip install -e ".[examples]" && ')
    rest = block.split(" && ", 1)[1]          # the install itself is what CI just did
    assert "; ".join(example_run["commands"]) == rest   # the run (e2e/conftest.py) ran exactly these
    last = example_run["steps"][-1]                   # bash's exit code: its last command's
    assert last.returncode == 0, last.stderr
    out = "".join(r.stdout + r.stderr for r in example_run["steps"])
    st = json.loads(gpurun("queue", "status", "--json").stdout)
    states = {j["name"]: (j["state"], j["exit_code"]) for j in st["jobs"]}
    diverged = states.pop("toy-diverge-lr3")
    assert len(states) == 3 and all(v == ("succeeded", 0) for v in states.values()), states
    # the README's promise: the diverging run is judged STOP and stopped while it runs
    assert diverged[0] == "quality_stopped", diverged
    judged = {j["name"]: (j.get("quality") or {}).get("verdict") for j in st["jobs"]}
    assert judged["toy-diverge-lr3"] == "STOP" and "STOP" not in [judged[n] for n in states], judged
    assert "judged STOP" in out
    chk = gpurun("check", "--job", "toy-diverge-lr3", "--json")
    assert chk.returncode == 11 and json.loads(chk.stdout)["verdict"] == "STOP"
    ok = gpurun("check", "--job", "toy-lr0.05-seed0", "--json")
    assert json.loads(ok.stdout)["verdict"] in ("CONTINUE", "WAIT")


def test_every_listed_command_exists():
    listed = set(re.findall(r"^\| `gpurun ([a-z]+)", README, re.M))
    assert {"queue", "host", "check", "pull", "down", "up", "recover"} <= listed
    for cmd in sorted(listed):
        res = gpurun(cmd, "--help")
        assert res.returncode == 0, f"gpurun {cmd} --help: {res.stderr}"


def test_test_command_is_what_ci_runs():
    assert "bash scripts/test.sh" in README
    assert "scripts/test.sh" in (ROOT / ".ci/run").read_text()
