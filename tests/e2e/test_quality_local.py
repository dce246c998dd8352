"""End to end on ``local``: the example trainer's diverging run is caught by the periodic
check; killed, its retry is refused by the resume gate with evidence; healthy runs are untouched."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, job_events, wait_terminal

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("numpy")




def test_diverging_run_caught_then_refused_on_resume(home, tmp_path):
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True)
    (prof / "local.yaml").write_text("quality:\n  action: alert\n  intervals_s: [2, 2, 3, 4]\n  scan_s: 0.5\n")
    py = sys.executable
    toy = ROOT / "examples/train_toy.py"
    q = tmp_path / "q.txt"
    q.write_text(
        f"[name=healthy] {py} {toy} --lr 0.05 --steps 300 --step-time 0.01\n"
        f"[name=diverge] {py} {toy} --lr 3.0 --steps 5000 --step-time 0.01 --ckpt-every 20\n")
    assert gpurun("queue", "submit", str(q), "--slots", "2").returncode == 0
    deadline = time.time() + 45
    caught = []
    while time.time() < deadline and not caught:
        time.sleep(0.3)
        caught = [e for e in job_events("diverge") if e["kind"] == "quality" and e["severity"] == "error"]
    assert caught, "the periodic check must flag the diverging run while it runs"
    assert "STOP" in json.dumps(caught[0]) or "nonfinite" in json.dumps(caught[0])

    assert gpurun("queue", "cancel", "diverge").returncode == 0
    st = wait_terminal(timeout=60)
    jobs = {j["name"]: j for j in st["jobs"]}
    assert jobs["healthy"]["state"] == "succeeded"
    assert jobs["diverge"]["state"] == "cancelled"
    assert not [e for e in job_events("healthy") if e["kind"] == "quality" and e["severity"] == "error"]

    # the retry verb asks the resume gate before it answers: refused, exit 3, nothing changed
    refused = gpurun("queue", "retry", "diverge")
    assert refused.returncode == 3, refused.stderr
    assert "quality gate" in refused.stderr and "--force" in refused.stderr
    d = [j for j in wait_terminal(timeout=60)["jobs"] if j["name"] == "diverge"][0]
    assert d["state"] == "cancelled", d
    ev = [e for e in job_events("diverge") if e["kind"] == "gate"]
    assert ev and ev[-1]["data"]["evidence"] and os.path.exists(ev[-1]["data"]["evidence"])
    evidence = json.loads(Path(ev[-1]["data"]["evidence"]).read_text())
    assert evidence.get("verdict") == "STOP"

    # --force overrides the gate, and says so in the job's history
    assert gpurun("queue", "retry", "diverge", "--force").returncode == 0
    deadline = time.time() + 15
    while not any("overridden with --force" in e["message"] for e in job_events("diverge")):
        assert time.time() < deadline, job_events("diverge")
        time.sleep(0.2)
    gpurun("queue", "cancel", "diverge")
    wait_terminal(timeout=60)
