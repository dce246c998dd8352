"""What blind round 9 taught (issue 11): a frozen validation loss beside an accuracy that keeps
learning is the loss's artifact; a slow learning-rate ramp is no warmup; a loss of 0.5 or more
that reads exactly 0 twice has collapsed; a dict pasted through a CJK input method
(``'eval_loss'： 0.69，``) is still a dict. Each case is replayed on every prefix, the last one
as an ended run, and each has a twin that must still STOP (or be read), so a veto that
swallowed everything would fail here."""

from __future__ import annotations

import json
import math

from orchestrator.quality.judge import judge
from orchestrator.quality.sources import Tracker
from quality.prefixes import verdicts, write_log


def _stops(seen) -> list:
    return [r for v, r in seen if v == "STOP"]


def _classify_csv(tmp_path, acc, name="results.csv"):
    """A YOLO classify run's results.csv: the train loss falls, ``val/loss`` sits at one
    5-digit value from epoch 10, the top-1 accuracy is ``acc(epoch)``."""
    rows = ["epoch,train/loss,metrics/accuracy_top1,metrics/accuracy_top5,val/loss,lr/pg0"]
    for e in range(1, 31):
        val = 2.8442 if e >= 10 else 2.8492 - 0.0005 * e
        rows.append("%d,%.5f,%.5f,1,%.4f,%.6f" % (e, 0.97 * e ** -0.9, acc(e), val, 0.0033 * min(e, 3) / 3))
    return write_log(tmp_path, rows, name)


def test_a_frozen_val_loss_beside_an_accuracy_that_learned_is_an_artifact(tmp_path):
    # top-1 accuracy 0.9983 -> 1.0 by epoch 10 (and moving until then): the model changes, the
    # validator's loss does not; nothing to stop
    rising = _classify_csv(tmp_path, lambda e: min(1.0, 0.9983 + 0.0002 * e))
    assert _stops(verdicts(rising, first=2)) == []
    # twins: the accuracy frozen too, at 0.61 (a stale model), or perfect from its first eval (a
    # validation set of one class): the eval loss frozen while the train loss moves still STOPs
    stale = _classify_csv(tmp_path, lambda e: 0.55 + 0.01 * min(e, 6), "stale.csv")
    assert any("eval_frozen" in r for r in _stops(verdicts(stale, first=2)))
    one_class = _classify_csv(tmp_path, lambda e: 1.0, "one_class.csv")
    assert any("eval_frozen" in r for r in _stops(verdicts(one_class, first=2)))


def _mmdet(tmp_path, lrs, losses, name="bevfusion.log"):
    lines = ["2025/04/09 13:05:16 - mmengine - INFO - Epoch(train)  [5][%d/7724]  lr: %.4e  eta: 1 day, 0:44:11  "
             "time: 0.7527  data_time: 0.0105  memory: 9194  grad_norm: 3.5217  loss: %.4f  loss_heatmap: 1.2069"
             % (4600 + 50 * i, lr, v) for i, (lr, v) in enumerate(zip(lrs, losses))]
    return write_log(tmp_path, lines, name)


def test_a_short_log_jump_beside_a_slow_lr_ramp_is_the_runs_own(tmp_path):
    # BEVFusion-like: 4 logs at 3.1-3.6, then 8.2-8.7 on 5 logs while a one-cycle LR climbs 6%
    losses = [3.1877, 3.1419, 3.2789, 3.5941, 8.5249, 8.6812, 8.3375, 8.2282, 8.4260]
    slow = [6.5426e-4 * (1 + 0.0075 * i) for i in range(9)]
    assert any("level_shift" in r for r in _stops(verdicts(_mmdet(tmp_path, slow, losses), first=2)))
    # the twin: the LR doubles across the jump (a warmup's end, a restart): the loss rose on purpose
    warm = [6.5e-4 if i < 4 else 1.3e-3 for i in range(9)]
    assert _stops(verdicts(_mmdet(tmp_path, warm, losses, "warm.log"), first=2)) == []


def test_a_loss_of_two_that_reads_zero_twice_has_collapsed(tmp_path):
    # an LLaVA fine-tune's first logs: 1.9166, then 0.0 and 0.0 while its LR still warms up
    lines = ["{'loss': %s, 'learning_rate': %.4e, 'epoch': 0.0}" % (v, 2.09e-8 * (i + 1))
             for i, v in enumerate(["1.9166", "0.0", "0.0"])]
    seen = verdicts(write_log(tmp_path, lines), first=3)
    assert seen[-1][0] == "STOP" and "loss_collapse" in seen[-1][1]
    running = judge(Tracker([str(write_log(tmp_path, lines, "running.log"))]).update())
    assert running["verdict"] == "STOP", running["reason"]          # no need to wait for the end
    # the twin: from 0.02 (a memorised loss near the print's resolution) two zeros are a warn
    low = ["{'loss': %s, 'learning_rate': 1e-05, 'epoch': 0.%d}" % (v, i) for i, v in
           enumerate(["0.0312", "0.0204", "0.0", "0.0"])]
    assert judge(Tracker([str(write_log(tmp_path, low, "low.log"))]).update())["verdict"] != "STOP"
    # nor a per-sample loss at 0 on the samples it got right, its running mean moving beside it
    snn = ["Iter: %d [0], loss: %s, acc: %s, avg_loss: %.6f, avg_acc: %.2f%%" % (2000 * (i + 1), v, a, m, 28.2 + 3 * i)
           for i, (v, a, m) in enumerate([("99177.390625", "0.00%", 85936.8), ("20514.828125", "0.00%", 81864.1),
                                          ("0.000000", "1.00%", 81793.2), ("0.000000", "1.00%", 79121.6)])]
    assert judge(Tracker([str(write_log(tmp_path, snn, "snn.log"))]).update())["verdict"] != "STOP"


def test_a_dict_pasted_with_full_width_colons_and_commas_is_read(tmp_path):
    # DNABERT-2's eval dicts as a Chinese thread shows them: "'eval_loss'： 0.6967583894729614， ..."
    vals = [0.6967583894729614, 0.6942448019981384, 0.6936447620391846, 0.6934958696365356]
    lines = ["{'eval_loss'\uff1a %r\uff0c 'eval_accuracy'\uff1a %r\uff0c 'epoch'\uff1a %.1f}" % (v, 0.5025, 0.3 * (i + 1))
             for i, v in enumerate(vals)]
    run = Tracker([str(write_log(tmp_path, lines))]).update()
    ev = run.get("eval_loss")
    assert ev is not None and [round(v, 6) for v in ev.values] == [round(v, 6) for v in vals]
    assert [round(v, 4) for v in run.get("eval_accuracy").values] == [0.5025] * 4
    # and the same lines with ASCII punctuation read the same
    ascii_run = Tracker([str(write_log(tmp_path, [ln.replace("\uff1a", ":").replace("\uff0c", ",") for ln in lines],
                                    "ascii.log"))]).update()
    assert ascii_run.get("eval_loss").values == ev.values
    assert json.dumps(sorted(run.series)) == json.dumps(sorted(ascii_run.series))
    assert all(math.isfinite(v) for v in ev.values)
