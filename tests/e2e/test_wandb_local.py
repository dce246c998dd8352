"""Done-when of issue 12 (W&B part), end to end on ``local``: queue jobs that log through the real
``wandb`` package in offline mode are found (the runner's ``WANDB_DIR``, and a user's own
``WANDB_DIR`` with an older run beside it) and judged by the periodic check and by
``gpurun check --job``; the diverging one is stopped, its STOP carrying the run's directory."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from rigs.agents import gpurun, job_events, wait_terminal

pytest.importorskip("wandb", reason="the optional wandb package (gpurun[wandb]) is not installed")
FIX = Path(__file__).resolve().parents[1] / "quality" / "fixtures" / "wandb"

TRAIN = '''
import math, sys, time, wandb
kind, n, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
run = wandb.init(project="gpurun-e2e", mode="offline")
for s in range(n):
    loss = 2.0 / (1 + s / 20) + 0.02 * math.sin(s)
    if kind == "diverge" and s >= 60:
        loss = float("nan")
    wandb.log({"loss": loss}, step=s)
    time.sleep(pause)
run.finish()
'''




def test_wandb_offline_jobs_found_judged_and_diverging_one_stopped(home, tmp_path):
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True)
    (prof / "local.yaml").write_text("quality:\n  action: stop\n  intervals_s: [2, 2, 3, 4]\n  scan_s: 0.5\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train_wb.py").write_text(TRAIN)
    # an older run in the user's W&B dir: NaN, so taking it by mistake would STOP the healthy job
    stale = proj / "wandb" / "offline-run-20200101_000000-stale001"
    stale.mkdir(parents=True)
    with gzip.open(FIX / "nan.wandb.gz", "rb") as f, open(stale / "run-stale001.wandb", "wb") as g:
        shutil.copyfileobj(f, g)
    py = sys.executable
    q = tmp_path / "q.txt"
    q.write_text(
        f"[name=healthy cwd={proj} env.WANDB_MODE=offline env.WANDB_SILENT=true env.WANDB_DIR={proj}] "
        f"{py} train_wb.py healthy 150 0\n"
        f"[name=diverge cwd={proj} env.WANDB_MODE=offline env.WANDB_SILENT=true] {py} train_wb.py diverge 900 0.03\n")
    sub = gpurun("queue", "submit", str(q), "--slots", "2")
    assert sub.returncode == 0, sub.stderr

    st = wait_terminal(timeout=90)
    jobs = {j["name"]: j for j in st["jobs"]}
    assert jobs["diverge"]["state"] == "quality_stopped", jobs["diverge"]
    assert jobs["healthy"]["state"] == "succeeded", jobs["healthy"]

    stop = [e for e in job_events("diverge") if e["kind"] == "quality" and e["severity"] == "error"]
    assert stop, job_events("diverge")
    url = stop[0]["data"]["url"]
    run_dir = Path(jobs["diverge"]["run_dir"]) if jobs["diverge"].get("run_dir") else None
    assert "/runs/" in url and "/wandb/offline-run-" in url, url  # the runner's WANDB_DIR: the run dir
    assert run_dir is None or url.startswith(str(run_dir))
    evidence = json.loads(Path(stop[0]["data"]["evidence"]).read_text())
    assert evidence["verdict"] == "STOP" and evidence["url"] == url
    assert len(list((proj / "wandb").glob("offline-run-*"))) == 2  # the stale run and healthy's; diverge's is not here

    chk = gpurun("check", "--job", "diverge", "--json")
    assert chk.returncode == 11, chk.stdout + chk.stderr
    out = json.loads(chk.stdout)
    assert out["verdict"] == "STOP" and out["url"] == url and out["format"] == "wandb"

    chk = gpurun("check", "--job", "healthy", "--json")
    out = json.loads(chk.stdout)
    assert out["verdict"] != "STOP", out
    assert out["format"] == "wandb" and out["points"] == 150
    assert out["url"].startswith(str(proj / "wandb" / "offline-run-")) and "stale001" not in out["url"]
    human = gpurun("check", "--job", "diverge")
    assert "run: " + url in human.stdout
