"""Replay every real labelled curve as a growing file, reading it incrementally like the agent.

NOT_STOP files must never STOP on any prefix; STOP files must STOP by the end and not before
their onset; the detection latency is printed (run with -s) and checked against a bound.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.quality.judge import judge
from orchestrator.quality.sources import Tracker
from quality.conftest import CURVES, labelled

ITEMS = labelled(CURVES) if (CURVES / "labels.json").is_file() else []
CUTS = 20


def _replay(src: Path, dst: Path):
    """Yield (run, problems) after each of ~CUTS growing prefixes written to ``dst``."""
    if src.suffix == ".json":  # trainer_state.json is rewritten whole at each save
        doc = json.loads(src.read_text())
        hist = doc["log_history"]
        tr = None
        for k in range(1, CUTS + 1):
            part = dict(doc, log_history=hist[:max(1, len(hist) * k // CUTS)])
            dst.write_text(json.dumps(part))
            tr = tr or Tracker([str(dst)])
            tr.source and setattr(tr.source, "sig", (-1.0, -1))  # same-second rewrites: force a re-read
            yield tr.update(), tr.problems
        return
    data = src.read_bytes()
    dst.write_bytes(b"")
    tr = Tracker([str(dst)])
    done = 0
    for k in range(1, CUTS + 1):
        end = len(data) * k // CUTS
        with open(dst, "ab") as f:
            f.write(data[done:end])  # cut anywhere, even mid-line: the reader must wait for the rest
        done = end
        yield tr.update(), tr.problems


@pytest.mark.parametrize("item", ITEMS, ids=[i["file"].split("/")[-1][:40] for i in ITEMS])
def test_replay_real_curve(item, curves, tmp_path):
    src = curves / item["file"]
    dst = tmp_path / src.name
    verdicts, first_stop = [], None
    for run, problems in _replay(src, dst):
        v = judge(run, {}, problems)
        verdicts.append(v["verdict"][0])
        if v["verdict"] == "STOP" and first_stop is None:
            first_stop = (run.last_step, v["findings"])
    seq = "".join(verdicts)
    # the incremental reader saw exactly what a cold read sees
    cold = Tracker([str(src)]).update() if src.suffix != ".json" else None
    if cold is not None:
        assert run.records == cold.records
    exp = item["expected_final"]
    if exp == "NOT_STOP":
        assert "S" not in seq, "false STOP on %s: %s %s" % (item["file"], seq, first_stop)
    elif exp == "STOP":
        assert first_stop is not None, "missed STOP on %s: %s" % (item["file"], seq)
        stop_step = first_stop[0]
        assert stop_step >= item["onset"], "STOP before onset on %s" % item["file"]
        checks = seq.index("S") + 1
        print("\n%s: STOP at step %s, onset %s, latency %s steps, first STOP on check %d/%d"
              % (item["file"], stop_step, item["onset"], stop_step - item["onset"], checks, len(seq)))
        assert stop_step - item["onset"] <= max(500, 0.1 * run.last_step)
    else:
        print("\n%s (ambiguous): %s" % (item["file"], seq))
    assert set(seq) <= {"S", "C", "W"}


def test_corpus_has_all_labels(curves):
    exp = {i["expected_final"] for i in labelled(curves)}
    assert {"STOP", "NOT_STOP"} <= exp
    assert len(ITEMS) >= 20


def test_hf_primary_metric_trap(curves):
    p = str(curves / "real" / "hf_whisper_small_hi_evalloss_trap_trainer_state.json")
    tr = Tracker([p])
    run = tr.update()
    no_primary = judge(run, {})
    assert no_primary["verdict"] == "WAIT"
    assert [f for f in no_primary["findings"] if f["code"] == "eval_regression"][0]["severity"] == "warn"
    wer = judge(run, {"primary": ("eval_wer", "min")})
    assert wer["verdict"] == "CONTINUE"
    loss = judge(run, {"primary": ("eval_loss", "min")})
    assert loss["verdict"] == "STOP" and loss["findings"][0]["code"] == "eval_regression"


def test_copy_of_corpus_run_dir_is_discovered(curves, tmp_path):
    shutil.copy(curves / "real" / "pl_pinn_em_v14_nan_metrics.csv", tmp_path / "metrics.csv")
    (tmp_path / "log.txt").write_text("nothing useful\n")
    tr = Tracker.for_target(str(tmp_path))
    v = judge(tr.update(), {})
    assert tr.active.endswith("metrics.csv")
    assert v["verdict"] == "STOP" and v["findings"][0]["step"] == 218
