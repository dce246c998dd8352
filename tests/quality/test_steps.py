"""One rule for a checkpoint's step: the resume gate (agent) and keep-latest-N (controller)
used to read ``model_step1200_bf16`` as 1200 and 16, ``epoch3-step1200.ckpt`` as 3 and 1200."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.agent.quality_hook import checkpoint_step as gate_step
from orchestrator.quality.lineparse import LineParser
from orchestrator.quality.steps import checkpoint_step, context_line, epoch_step, newest_step, record_step
from orchestrator.sync.keep import KeepPolicy, unit_step

NAMES = [
    ("epoch=2-step=300.ckpt", 300),          # Lightning: the step, never the epoch
    ("epoch=12-step=4500-val_loss=0.52.ckpt", 4500),
    ("step_000299.npz", 299),
    ("epoch3-step1200.ckpt", 1200),
    ("model_step1200_bf16", 1200),           # bf16 is a dtype
    ("model_step1200_fp16.safetensors", 1200),
    ("step1200-fp32", 1200),
    ("int8_step700", 700),
    ("sm80-iter_5000.pt", 5000),
    ("checkpoint-500", 500),
    ("checkpoint-500/", 500),
    ("step_1200", 1200),
    ("step=1200", 1200),
    ("step-000299", 299),
    ("global_step1200", 1200),
    ("global_step_1200", 1200),
    ("iter_5000", 5000),
    ("iteration-42.pt", 42),
    ("ckpt_1200.pt", 1200),
    ("1200.pt", 1200),
    ("model_1200", 1200),
    ("llama7b_800.pt", 800),                 # 7b is a size
    ("epoch_7.pt", 7),                       # epoch-only: the epoch as an ordering key
    ("epoch=7.ckpt", 7),
    ("epoch=3-val_loss=0.52.ckpt", 3),       # a metric's value is never a step
    ("best.pt", None),
    ("last.ckpt", None),
    ("final", None),
    ("model_bf16.pt", None),
]


@pytest.mark.parametrize("name,step", NAMES)
def test_checkpoint_step(name, step):
    assert checkpoint_step(name) == step


@pytest.mark.parametrize("name,step", NAMES)
def test_keep_and_resume_gate_agree(tmp_path, name, step):
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / name.rstrip("/")).mkdir()
    gate = gate_step({"checkpoints": str(d)})
    assert unit_step(name) == step
    assert gate == (None if step is None else float(step))


def test_newest_of_mixed_names_is_the_same_for_gate_and_keep(tmp_path):
    names = ["model_step1200_bf16", "model_step900_bf16", "epoch3-step1100.ckpt", "best.pt"]
    d = tmp_path / "ckpts"
    d.mkdir()
    for n in names:
        (d / n).mkdir()
    assert gate_step({"checkpoints": str(d)}) == 1200.0 == newest_step(names)
    now = time.time()
    files = [{"kind": "checkpoint", "unit": n, "path": "checkpoints/%s/x" % n, "mtime": now} for n in names]
    keep, gone, why = KeepPolicy(keep_latest=1).split(files, [])
    assert why == {"model_step1200_bf16": "latest"}
    assert {f["unit"] for f in gone} == {"model_step900_bf16", "epoch3-step1100.ckpt"}
    assert "best.pt" in {f["unit"] for f in keep}  # no step: always kept


@pytest.mark.parametrize("rec", [
    {"step": 10, "loss": 1.0},
    {"epoch": 2, "global_step": 300, "loss": 1.0},
    {"it": 5, "global_step": 400, "loss": 1.0},   # weak key replaced by a strong one
    {"step": 7, "iter": 9, "loss": 1.0},          # a strong key is not replaced
    {"_step": 3, "train/global_step": 24, "loss": 1.0},  # W&B's log counter gives way to the trainer's step
    {"train/global_step": 24, "_step": 3, "loss": 1.0},
    {"_step": 3, "loss": 1.0},
    {"epoch": 3, "loss": 1.0},
    {"epoch": 0.5, "step": 12, "loss": 1.0},
])
def test_record_step_matches_the_line_parser(rec):
    parsed = LineParser(strict=False).parse(json.dumps(rec))
    assert parsed is not None
    assert record_step(rec) == parsed[0]


def test_best_metric_uses_the_record_step(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text("\n".join(json.dumps(r) for r in [
        {"global_step": 100, "val_loss": 0.9}, {"global_step": 200, "val_loss": 0.4},
        {"global_step": 300, "val_loss": 0.7}]) + "\n")
    now = time.time()
    files = [{"kind": "checkpoint", "unit": "checkpoint-%d" % s, "mtime": now} for s in (100, 200, 300)]
    pol = KeepPolicy(keep_latest=1, best_key="val_loss", best_mode="min")
    _, gone, why = pol.split(files, [m])
    assert why == {"checkpoint-300": "latest", "checkpoint-200": "best val_loss"}
    assert [f["unit"] for f in gone] == ["checkpoint-100"]


@pytest.mark.parametrize("line,step", [
    ("| epoch   3 |   200/ 2983 batches | lr 20.00 | ms/batch 11.52 | loss  5.80 | ppl   330.30", 2 * 2983 + 200),
    ("| epoch   1 |  2800/ 2983 batches | lr 20.00 | ms/batch 11.52 | loss  5.80 | ppl   330.30", 2800),
    ("Epoch(train) [1][ 50/500]  lr: 2.0e-02  loss: 1.2", 50),
    ("Epoch [2][100/500]\tlr: 2.000e-02, loss: 0.8", 600),
    ("2023/04/01 12:00:00 - mmengine - INFO - Iter(train) [  50/90000]  lr: 2.0e-02  time: 0.5  loss: 2.1", 50),
])
def test_console_step_shapes(line, step):
    """The steps of console lines that are not "a number after a step key" (steps.py owns them)."""
    assert LineParser().parse(line)[0] == step


def test_keras_steps_come_from_the_epoch_header():
    p = LineParser()
    assert p.parse("Epoch 3/10") is None
    step, vals, planned = p.parse("20/50 [===========>..................] - ETA: 3s - loss: 0.4210 - accuracy: 0.81")
    assert step == epoch_step(3, 20, 50) == 120 and planned == 500
    assert vals == [("loss", 0.421), ("accuracy", 0.81)]
    step, vals, _ = p.parse("50/50 ━━━━━━━━━━━━━━━━━━━━ 2s 31ms/step - accuracy: 0.9 - loss: 0.3 - val_loss: 0.35")
    assert step == 150 and ("val_loss", 0.35) in vals and not any(k in ("s", "ms/step") for k, _ in vals)
    step, vals, _ = p.parse("517/518 [============================>.] - ETA: 0s - loss: 9.2551Epoch 00001: val_loss "
                            "improved from inf to 7.38003, saving model to ssd300_epoch-01_loss-9.2552.h5")
    assert step == 2 * 518 + 517 and vals == [("loss", 9.2551)]
    assert context_line("Epoch 0/0") and context_line("0/0 [==] - loss: 0") and not context_line("step 0 loss 0")
