"""The ordered multi-shape scan gives exactly what the per-line loop gives, on hostile mixed logs."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.quality import lineparse, linescan, readers_text
from orchestrator.quality.sources import Tracker


def _write_mixed(path, seed: int, n: int = 6000, term: str = "\n") -> None:
    rng = random.Random(seed)
    step = 0
    with open(path, "w", newline="") as f:
        for i in range(n):
            if rng.random() < 0.002:
                step = max(0, step - rng.randint(1, 200))  # a resumed run rewinds
            step += 1
            loss = 2 + rng.random()
            k = rng.randrange(11)
            if k < 4:
                f.write("iter %d: loss %.4f, time %.2fms, mfu 41.2%%%s" % (step, loss, 100 + rng.random(), term))
            elif k < 6:  # HF dict lines: no step; an integer epoch stands in for one
                f.write("{'loss': %.4f, 'grad_norm': %s, 'learning_rate': %.3e, 'epoch': %s}%s"
                        % (loss, rng.choice(["1.5", "nan", "inf"]), 3e-4, rng.choice(["0.01", "1.25"]), term))
            elif k < 7:
                f.write(" 24%%|##4       | %d/%d [3:15:13<10:06:35,  4.59s/it]%s" % (step, 9999, term))
            elif k < 8:
                f.write(" iteration %8d/ %d | lm loss: %.6E | loss scale: 65536.0 |%s" % (step, 9999, loss, term))
            elif k < 9:
                f.write("[%d][%d/100] loss: %.3f%s" % (1 + step // 100, step % 100, loss, term))
            elif k < 10:
                f.write(term)
            else:
                f.write("2024-01-01 12:00:00 INFO saving shard %d of the cache%s" % (i, term))


def _snapshot(path):
    tr = Tracker([str(path)])
    run = tr.update()
    series = {k: (list(s.steps), [repr(v) for v in s.values]) for k, s in run.series.items()}
    return series, run.restarts, run.planned_steps, run.first_step, run.last_step, run.records


def _per_line(monkeypatch, path):
    def decline(self, text, run, src):
        raise ValueError("use the per-line loop")
    with monkeypatch.context() as m:
        m.setattr(linescan.OrderedScan, "scan", decline)
        return _snapshot(path)


@pytest.mark.parametrize("seed,term,chunk", [(1, "\n", 8 << 20), (2, "\r\n", 8 << 20), (3, "\n", 9000),
                                             (4, "\r", 9000), (5, "\n", 5000)])
def test_scan_matches_per_line_loop(tmp_path, monkeypatch, seed, term, chunk):
    p = tmp_path / "train.log"
    _write_mixed(p, seed, term=term)
    monkeypatch.setattr(readers_text, "CHUNK", chunk)
    fast = _snapshot(p)
    slow = _per_line(monkeypatch, p)
    assert fast == slow
    series = fast[0]
    assert len(series["loss"][0]) > 1000 and "grad_norm" in series and "loss_scale" in series
    assert any(v == "nan" for v in series["grad_norm"][1])


def test_scan_order_of_stepless_lines_and_bars(tmp_path):
    p = tmp_path / "hf.log"
    lines = []
    for s in range(1, 400):
        lines.append(" 50%%|#####     | %d/800 [00:01<00:01,  9.1it/s]" % s)
        if s % 2 == 0:
            lines.append("{'loss': %.3f, 'learning_rate': 1e-4, 'epoch': 0.5}" % (3 - s / 400))
    p.write_text("\n".join(lines) + "\n")
    run = Tracker([str(p)]).update()
    loss = run.get("loss")
    assert list(loss.steps) == [float(s) for s in range(2, 400, 2)]  # each takes the bar before it
    assert run.planned_steps == 800 and not run.restarts


def test_integer_epoch_is_the_step_of_stepless_lines(tmp_path, monkeypatch):
    p = tmp_path / "keras.log"
    p.write_text("".join("{'loss': %.4f, 'val_loss': %.4f, 'epoch': %d}\n" % (2 - e / 1e3, 2.1, e)
                         for e in range(1, 3001)))
    fast = _snapshot(p)
    assert fast == _per_line(monkeypatch, p)
    assert fast[0]["loss"][0] == [float(e) for e in range(1, 3001)]


def test_bad_token_in_dominant_shape_leaves_run_consistent(tmp_path, monkeypatch):
    p = tmp_path / "odd.log"
    rows = ["step %d loss %.3f" % (s, 3 - s / 1e4) for s in range(5000)]
    rows[2500] = "step 2500 loss 1.2.3"  # the shape regex takes it, float() does not
    p.write_text("\n".join(rows) + "\n")
    fast = _snapshot(p)
    assert fast == _per_line(monkeypatch, p)
    steps, values = fast[0]["loss"]
    assert len(steps) == len(values) and 4998 <= len(steps) <= 5000
    assert all(not math.isnan(float(v)) for v in values)


@pytest.mark.parametrize("line, fast", [
    # the PyTorch word-LM example's line opens with "|" but is no table row: the scan takes it
    ("| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 45.23 | loss  7.63 | ppl  2066.35", True),
    # a markdown table's row and a YOLO results.txt row: parse() knows them by their header/places
    ("| 0.7098        | 1.0   | 685  | 0.6945          | 0.5      |", False),
    ("      0/19     11.8G   0.03585   0.01954   0.01185   0.06724       132       640    0.9422    0.9098"
     "    0.9539    0.7285   0.02124  0.009931  0.006945", False),
    # an overflow note: parse() reads it by its words
    ("[2022-01-19 13:09:13,305] [INFO] [stage_1_and_2.py:1644:step] [deepscale] OVERFLOW! Rank 0 Skipping "
     "step. Attempted loss scale: 1048576.0, reducing to 524288.0", False),
])
def test_which_shapes_the_scan_takes(line, fast):
    from orchestrator.quality.linekeys import NUM_SPLIT
    parts = NUM_SPLIT(" ".join(line.split()) if "  " in line else line)
    assert (linescan.plan_of(tuple(parts[0::2]), lineparse.LineParser()) is not None) == fast


def test_pycocotools_summaries_read_alike_line_by_line_and_in_a_large_chunk(tmp_path):
    # 40 evals of 12 summary lines each, after an mmdet train line: the all-area AP lines are the eval
    coco = (" Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = %.3f\n"
            " Average Precision  (AP) @[ IoU=0.50      | area=   all | maxDets=100 ] = %.3f\n"
            " Average Precision  (AP) @[ IoU=0.50:0.95 | area= small | maxDets=100 ] = -1.000\n"
            " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 0.500\n")
    text = "".join("Epoch [%d][100/100]\tlr: 1.000e-02, loss: %.4f\n" % (e, 2.0 / e) + coco % (0.3 + e / 200, 0.5)
                   for e in range(1, 41))
    p = tmp_path / "train.log"
    p.write_text(text)
    big = Tracker([str(p)]).update()  # > 4 KiB: the ordered scan
    assert len(big.series["AP"]) == 40 and big.series["AP50"].values[-1] == 0.5
    assert list(big.series["AP"].steps) == list(big.series["loss"].steps)
    small = tmp_path / "short.log"
    small.write_text(text[:600])
    assert Tracker([str(small)]).update().series["AP"].values[0] == 0.305
    # then the detector predicts nothing: AP and AP50 both 0 at one eval after 0.5 (a WAIT while
    # the run goes on, a STOP when it ended there), and again at the next eval (a STOP)
    with open(p, "a") as f:
        f.write("Epoch [41][100/100]\tlr: 1.000e-02, loss: 0.0480\n" + coco % (0.0, 0.0))
    from orchestrator.quality.judge import judge
    v = judge(Tracker([str(p)]).update(), {})
    assert v["verdict"] == "WAIT" and v["findings"][0]["code"] == "metric_zero"
    assert judge(Tracker([str(p)]).update(), {}, final=True)["verdict"] == "STOP"
    with open(p, "a") as f:
        f.write("Epoch [42][100/100]\tlr: 1.000e-02, loss: 0.0470\n" + coco % (0.0, 0.0))
    v = judge(Tracker([str(p)]).update(), {})
    assert v["verdict"] == "STOP" and v["findings"][0]["code"] == "metric_zero"
