"""Transients that are not failures (issue 11, from blind round 8's false STOPs): the total loss
jumping where the objective gains a term, a bump of a few logs that has already come back, and
a per-sample loss of 0 beside a running mean's accuracy. Each case is replayed on every prefix,
ended or not, and each has a twin that must still STOP, so a veto that swallowed everything
would fail here."""

from __future__ import annotations

import math

from orchestrator.quality.judge import judge
from orchestrator.quality.sources import Tracker
from quality.prefixes import verdicts, write_log


def _curve(n: int, start: float = 300.0) -> list:
    return [start * (i + 1) ** -0.5 * (1 + 0.02 * math.sin(3 * i)) for i in range(n)]


def test_a_jump_where_new_loss_terms_first_appear_is_a_new_objective(tmp_path):
    # a recommender's total: 9 epochs alone, then a transfer term switched on (2870 at first),
    # the total x28 and back within 6 epochs, falling on; a careful engineer sees a new sum
    base = _curve(9)
    terms = [2870.0, 1395.0, 560.0, 223.0, 98.0, 49.0, 27.0, 15.0] + [9.0 * 0.97 ** i for i in range(30)]
    lines = ["INFO:__main__:Epoch: %04d avg_loss_tgt: %.3f time: 9.2s" % (e, v) for e, v in enumerate(base)]
    for k, t in enumerate(terms):
        origin = 110.0 * (k + 10) ** -0.15
        lines.append("INFO:__main__:Epoch: %04d avg_loss_tgt: %.3f origin_loss_tgt: %.3f trans_loss_tgt: %.3f "
                     "time: 12.1s" % (9 + k, origin + t, origin, t))
    path = write_log(tmp_path, lines)
    seen = verdicts(path)
    assert all(v != "STOP" for v, _ in seen), [r for v, r in seen if v == "STOP"]
    # the twin: the same jump with no term appearing beside it is a loss that blew up and stays
    twin = ["INFO:__main__:Epoch: %04d avg_loss_tgt: %.3f time: 9.2s" % (e, v)
            for e, v in enumerate(base + [3000.0 + 10 * i for i in range(12)])]
    assert any(v == "STOP" for v, _ in verdicts(write_log(tmp_path, twin, "twin.log")))


def test_a_bump_of_a_few_logs_that_came_back_is_not_a_divergence(tmp_path):
    # 48 epochs falling gently, a 3-epoch bump to 3.5x, then back at the level before it
    vals = [60.0 * (1 - 0.004 * i) * (1 + 0.01 * math.sin(5 * i)) for i in range(48)]
    vals += [111.6, 177.3, 85.5, 56.1, 55.8, 55.2, 55.0]
    path = write_log(tmp_path, ["epoch %d loss %.3f" % (i, v) for i, v in enumerate(vals)])
    seen = verdicts(path, first=40)
    assert all(v != "STOP" for v, _ in seen), [r for v, r in seen if v == "STOP"]
    # the twin: the bump stays up, the loss diverging now
    twin = vals[:51] + [190.0, 260.0, 300.0, 340.0]
    out = verdicts(write_log(tmp_path, ["epoch %d loss %.3f" % (i, v) for i, v in enumerate(twin)], "twin.log"),
                    first=40)
    assert any(v == "STOP" for v, _ in out)


def test_a_per_sample_zero_beside_a_running_accuracy_is_no_masked_loss(tmp_path):
    # a classifier trained one sample at a time: its printed loss is that one sample's (0 when
    # right), its running accuracy counts every sample so far; they are not the same batch
    vals = [(99177.4, 28.2), (20514.8, 34.17), (0.0, 37.23), (0.0, 40.06)]
    lines = ["Iter: %d [0], loss: %.6f, acc: %.2f%%, avg_loss: %.6f, avg_acc: %.2f%%"
             % (2000 * (i + 1), v, 0.0 if v else 1.0, 86000 - 1800 * i, a) for i, (v, a) in enumerate(vals)]
    assert judge(Tracker([str(write_log(tmp_path, lines))]).update())["verdict"] != "STOP"
    # the twin: the accuracy of the same batch at 40% beside a loss of 0 is a loss masked away
    twin = ["Iter: %d [0], loss: %.6f, acc: %.2f%%" % (2000 * (i + 1), v, a) for i, (v, a) in enumerate(vals)]
    out = judge(Tracker([str(write_log(tmp_path, twin, "twin.log"))]).update())
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "loss_collapse"


def _deepspeed(tmp_path, skipped, name):
    lines = []
    for i in range(100):
        lines.append("Epoch 0, Loss: %.6f, Positive Score: 0.01, Negative Score: 0.02" % (0.69 + 0.05 * math.sin(i)))
        if (i + 1) % 10 == 0:
            st = i + 1
            lines.append("[2025-04-09 01:39:21,827] [INFO] [logging.py:96:log_dist] [Rank 0] step=%d, skipped=%d, "
                         "lr=[1e-05, 1e-05], mom=[(0.9, 0.99), (0.9, 0.99)]" % (st, skipped(st)))
    return Tracker([str(write_log(tmp_path, lines, name))]).update()


def test_deepspeed_skipping_every_step_stops_and_its_calibration_does_not(tmp_path):
    # fp16 overflow on every step: "step=100, skipped=100", no weight ever updated
    out = judge(_deepspeed(tmp_path, lambda st: st, "all.log"))
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "loss_scale_floor"
    assert out["findings"][0]["evidence"]["steps_skipped"] == 100
    # the first overflows calibrating the scale: a dozen skipped, then none
    assert judge(_deepspeed(tmp_path, lambda st: min(st, 12), "calib.log"))["verdict"] != "STOP"
    # every step skipped, but only 30 steps in: the scale may still be coming down from 2^16
    path = tmp_path / "all.log"
    lines = path.read_text().splitlines()
    cut = lines[:lines.index(next(ln for ln in lines if "step=30," in ln)) + 1]
    assert judge(Tracker([str(write_log(tmp_path, cut, "early.log"))]).update())["verdict"] != "STOP"


def _regression(tmp_path, train, name):
    """A regression run's metrics.jsonl: a per-step train loss, and every 20 steps an eval loss
    that has risen from its best over the last 5 evals (and an eval RMSE with it)."""
    rows = []
    for i, v in enumerate(train):
        rows.append('{"step": %d, "loss": %.6f}' % (i, v))
        if i % 20 == 19:
            e = i // 20
            ev = 0.02 * (1 - 0.1 * e) if e < 10 else 0.012 * (1 + 0.2 * (e - 9))
            rows.append('{"step": %d, "val_loss": %.6f, "val_rmse": %.6f}' % (i, ev, math.sqrt(ev)))
    return write_log(tmp_path, rows, name)


def test_a_tiny_noisy_train_loss_over_its_luckiest_batch_is_no_rise(tmp_path):
    # a 0.01 RMSE loss, per step, noisy by +-30%: its last logs are often 1.2x its lowest batch,
    # its level (medians of 5 logs) is flat; the eval loss creeps up for 5 evals (overfitting)
    noisy = [0.01 * (1 + 0.3 * math.sin(7.3 * i) * math.cos(2.1 * i)) for i in range(300)]
    seen = verdicts(_regression(tmp_path, noisy, "noisy.jsonl"), first=40)
    assert not any("eval_diverged" in r for v, r in seen if v == "STOP"), seen
    # the twin: the train loss's level rises x2 over the same evals, with every eval worse
    rising = noisy[:200] + [v * 2.0 for v in noisy[200:]]
    out = judge(Tracker([str(_regression(tmp_path, rising, "rising.jsonl"))]).update())
    assert any(f["code"] == "eval_diverged" and f["severity"] == "stop" for f in out["findings"]), out["reason"]
