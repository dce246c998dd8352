"""Readers: real binary formats written by our own writers, cut mid-record, rotated, rewritten."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest

from orchestrator.quality import tfevents as T
from orchestrator.quality.lineparse import LineParser
from orchestrator.quality.series import Run
from orchestrator.quality.sources import Tracker, discover, sniff
from orchestrator.quality.wandb_reader import BLOCK, WandbFileSource, WandbWriter


def test_crc32c_known_vector():
    assert T.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert T.masked_crc(b"") == ((0 >> 15 | 0 << 17) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("tensor", [False, True])
def test_tfevents_roundtrip_and_incremental(tmp_path, tensor):
    p = str(tmp_path / "events.out.tfevents.1.h.1.0")
    T.write_scalars(p, [(s, [("train/loss", 10.0 / s), ("lr", 1e-3)]) for s in range(1, 101)], tensor_style=tensor)
    src = T.TfEventsSource(p, verify="length")
    run = Run()
    src.poll(run)
    loss = run.get("loss")
    assert len(loss) == 100 and loss.steps[0] == 1 and abs(loss.values[-1] - 0.1) < 1e-6
    # a record cut mid-write is left for later, then picked up from its start
    rec = T.encode_record(T.encode_event(101, 1.0, [("train/loss", float("nan"))], tensor))
    with open(p, "ab") as f:
        f.write(rec[:10])
    src.poll(run)
    assert len(run.get("loss")) == 100
    with open(p, "ab") as f:
        f.write(rec[10:])
    src.poll(run)
    assert len(run.get("loss")) == 101 and math.isnan(run.get("loss").values[-1])


def test_tfevents_skips_big_records_and_detects_corruption(tmp_path):
    p = str(tmp_path / "events.out.tfevents.2.h.1.0")
    T.write_scalars(p, [(1, [("loss", 2.0)])])
    with open(p, "ab") as f:
        f.write(T.encode_record(b"\x09" + b"\x00" * 8 + b"\x2a" + T._vint(300000) + b"\x00" * 300000))
    T.write_scalars(p, [(2, [("loss", 1.5)])], append=True)
    run = Run()
    src = T.TfEventsSource(p)
    src.poll(run)
    assert list(run.get("loss").values) == [2.0, 1.5] and src.skipped == 1
    bad = str(tmp_path / "events.out.tfevents.3.h.1.0")
    with open(p, "rb") as f:
        data = bytearray(f.read())
    data[8] ^= 0xFF  # break the first length CRC
    with open(bad, "wb") as f:
        f.write(bytes(data))
    tr = Tracker([bad])
    tr.update()
    assert not tr.readable() and "corrupt" in tr.problems[0]


def test_tfevents_dir_with_restart_file(tmp_path):
    T.write_scalars(str(tmp_path / "events.out.tfevents.1.h.1.0"), [(s, [("loss", 5.0)]) for s in range(1, 51)])
    T.write_scalars(str(tmp_path / "events.out.tfevents.2.h.2.0"), [(s, [("loss", 4.0)]) for s in range(30, 61)])
    run = Tracker.for_target(str(tmp_path)).update()
    loss = run.get("loss")
    assert run.restarts == [30.0] and loss.steps[-1] == 60 and len(loss) == 29 + 31


def test_wandb_records_across_blocks_and_partial_tail(tmp_path):
    p = str(tmp_path / "run-x.wandb")
    w = WandbWriter(p)
    w.run_record(resumed=True)
    for s in range(2000):  # ~100 KB: records span several 32 KiB blocks
        w.history(s, {"train/loss": 3.0 - s / 1000, "note_" + "x" * (s % 50): s})
    w.close()
    assert os.path.getsize(p) > 3 * BLOCK
    run = Run()
    src = WandbFileSource(p)
    src.poll(run)
    assert len(run.get("loss")) == 2000 and run.meta["resumed"] and src.corrupt == 0
    w = WandbWriter(p, append=True)
    w.history(2000, {"train/loss": float("nan")})
    w.close()
    with open(p, "rb+") as f:  # the writer is mid-record: drop the last 3 bytes for now
        f.seek(0, 2)
        size = f.tell()
        f.seek(size - 3)
        tail = f.read()
        f.truncate(size - 3)
    src.poll(run)
    assert len(run.get("loss")) == 2000
    with open(p, "ab") as f:
        f.write(tail)
    src.poll(run)
    assert len(run.get("loss")) == 2001 and math.isnan(run.get("loss").values[-1])


def test_wandb_bad_header_is_unreadable(tmp_path):
    p = tmp_path / "run-y.wandb"
    p.write_bytes(b"garbage!" * 10)
    tr = Tracker([str(p)])
    tr.update()
    assert tr.problems and "W&B" in tr.problems[0]


def test_csv_header_rewrite_resets(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("epoch,step,train_loss_step\n0,1,5.0\n0,2,4.0\n")
    tr = Tracker([str(p)])
    assert len(tr.update().get("loss")) == 2
    p.write_text("epoch,step,train_loss_step,val_loss\n0,1,5.0,\n0,2,4.0,\n0,2,,4.5\n0,3,3.9,\n")
    run = tr.update()
    assert len(run.get("loss")) == 3 and len(run.get("val_loss")) == 1


def test_log_rotation_and_partial_line(tmp_path):
    p = tmp_path / "train.log"
    p.write_text("step 1 loss 5.0\nstep 2 loss 4.")
    tr = Tracker([str(p)])
    run = tr.update()
    assert list(run.get("loss").values) == [5.0]
    with open(p, "a") as f:
        f.write("5\n")
    assert list(tr.update().get("loss").values) == [5.0, 4.5]
    os.remove(p)
    p.write_text("step 1 loss 9.0\n")  # a new file under the same name
    assert list(tr.update().get("loss").values) == [9.0]


@pytest.mark.parametrize("line,step,expect", [
    ("iter 2920: loss 3.9883, time 1099.34ms, mfu 15.34%", 2920, {"loss": 3.9883, "step_time": 1099.34}),
    ("step:5/20344 train_loss:9.4450 train_time:88738ms step_avg:nanms", 5, {"loss": 9.445, "train_time": 88738}),
    ("s:3 trl:10.7157 lr:0.000003 norm:13.12", 3, {"loss": 10.7157, "lr": 3e-6, "grad_norm": 13.12}),
    ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 9.77e-06, 'epoch': 0.53}", None, {"loss": 0.0, "lr": 9.77e-6}),
    (" iteration    17062/  159576 | lm loss: 4.374E+00 | loss scale: 32768.0 | grad norm: 87994.1 |", 17062,
     {"loss": 4.374, "loss_scale": 32768.0, "grad_norm": 87994.1}),
    ("Iter 75: Train loss 3.316, Learning Rate 7.000e-05, It/sec 0.933, Tokens/sec 366.098", 75,
     {"loss": 3.316, "lr": 7e-5, "throughput": 366.098}),
    ("10/30 22:18:02 - mmengine - INFO - Epoch(train) [2][20/735]  lr: 1.9e-04  loss: 2.7522  grad_norm: 3.06", 755,
     {"loss": 2.7522, "grad_norm": 3.06}),
    ("epoch: 3451 loss: nan", 3451, {}),
])
def test_line_dialects(line, step, expect):
    rec = LineParser().parse(line)
    assert rec is not None
    got_step, vals, _ = rec
    d = dict(vals)
    assert got_step == step
    for k, v in expect.items():
        assert d[k] == pytest.approx(v)
    if "nan" in line.split("loss")[-1][:8]:
        assert math.isnan(d["loss"])


def test_user_regex_and_tqdm_noise(tmp_path):
    p = tmp_path / "out.log"
    p.write_text(" 10%|#  | 5/50 [00:01<00:09]\r{'loss': 2.0}\nepoch 1 batch 7 -> 1.25\n")
    run = Tracker([str(p)], user_regex=r"batch (?P<step>\d+) -> (?P<loss>\S+)").update()
    assert list(run.get("loss").values) == [1.25] and run.get("loss").steps[0] == 7
    run = Tracker([str(p)]).update()
    assert run.get("loss").steps[0] == 5 and run.planned_steps == 50


def test_sniff_and_discover(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 1.0}]}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": NaN}\n')
    (tmp_path / "log.txt").write_text("step 1 loss 1\n")
    assert [os.path.basename(p) for p in discover(str(tmp_path))] == ["metrics.jsonl", "trainer_state.json", "log.txt"]
    assert sniff(str(tmp_path / "trainer_state.json")).kind == "trainer_state"
    assert sniff(str(tmp_path / "metrics.jsonl")).kind == "jsonl"
    run = Tracker.for_target(str(tmp_path)).update()
    assert math.isnan(run.get("loss").values[0])


def test_fallback_when_declared_source_unreadable(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("".join("step %d loss %f\n" % (i, 5 - i / 100) for i in range(50)))
    tr = Tracker([str(tmp_path / "missing.jsonl"), str(log)])
    run = tr.update()
    assert tr.active == str(log) and len(run.get("loss")) == 50
    assert tr.problems == [str(tmp_path / "missing.jsonl") + ": not found"]
    assert struct.calcsize("<IHB") == 7


def test_lightning_checkpoint_lines(tmp_path):
    # ModelCheckpoint(verbose=True) prints the monitored metric quoted, at a global step; a long
    # log goes through the shape scanner, which must leave these lines to the line parser
    p = tmp_path / "train.log"
    lines = ["Epoch %d, global step %d: 'val_loss' reached %.5f (best %.5f), saving model to "
             "'checkpoints/epoch=%d-step=%d.ckpt' as top 1" % (e, 10 * (e + 1), 1.0 / (e + 1), 1.0 / (e + 1), e,
                                                                10 * (e + 1)) for e in range(300)]
    p.write_text("\n".join(lines) + "\nEpoch 300, global step 3010: 'val_loss' reached nan (best 0.00333)\n")
    s = Tracker([str(p)]).update().series["val_loss"]
    assert len(s) == 301 and list(s.steps[:2]) == [10.0, 20.0] and s.values[1] == 0.5
    assert s.steps[-1] == 3010.0 and math.isnan(s.values[-1])


def test_nan_or_inf_glued_to_letters_is_no_number(tmp_path):
    # logging's "root INFO:" is no infinite series "root"; "step_avg:nanms" is no NaN: the same
    # answer from the tokenizer (the first lines) and the fast path (the shape learnt from them)
    a, b = tmp_path / "ocr.log", tmp_path / "gpt.log"
    a.write_text("".join("[2021/09/08 13:16:19] root INFO: epoch: [6/6], iter: %d, lr: 0.000001, loss: %.6f\n"
                         % (10 * i, 1.0 / i) for i in range(1, 201)))
    b.write_text("".join("step:%d/400 train_loss:%.4f train_time:%dms step_avg:%s\n" % (
        i, 2.0 / i, 80 * i, "nanms" if i < 4 else "%.2fms" % (80.0 + i % 3)) for i in range(1, 201)))
    run = Tracker([str(a)]).update()
    assert "root" not in run.series and len(run.get("loss")) == 200
    run = Tracker([str(b)]).update()
    assert len(run.series["step_avg"]) == 197 and all(math.isfinite(v) for v in run.series["step_avg"].values)
