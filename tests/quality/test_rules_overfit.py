"""Held-out judgement against what a held-out metric says: overfitting (the eval loss far above its
best while the train loss falls and no metric improves) is a STOP; the eval-loss trap (the loss
rises, accuracy improves), a near-zero eval loss and a noisy eval are not; a NaN loss beside an
accuracy that keeps improving is a WAIT; a GAN's losses may rise. Runs built in memory with the
real ``Run``; the overfit case also through the real CLI on a Keras CSVLogger file."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

from orchestrator.quality import rules_level as L
from orchestrator.quality import rules_overfit as OV
from orchestrator.quality.judge import judge
from orchestrator.quality.series import Run
from quality.synth import run_of, stop_codes as stops

# a Keras classifier (epochs 0-24): the val loss bottoms at epoch 3 and doubles, val accuracy flat
VAL = [1.284, 0.953, 0.795, 0.787, 0.833, 0.896, 0.966, 1.041, 1.070, 1.171, 1.227, 1.295, 1.269,
       1.362, 1.437, 1.449, 1.428, 1.500, 1.550, 1.585, 1.610, 1.656, 1.630, 1.655, 1.747]
TRAIN = [1.336 * 0.85 ** e for e in range(25)]
VACC = [0.435, 0.625, 0.692, 0.703, 0.700, 0.700, 0.692, 0.680, 0.697, 0.700, 0.677, 0.689, 0.706,
        0.692, 0.666, 0.689, 0.689, 0.692, 0.692, 0.686, 0.680, 0.692, 0.686, 0.683, 0.674]


def test_a_val_loss_at_1_5x_its_best_for_5_evals_while_train_falls_is_overfitting():
    run = run_of([{"loss": t, "val_loss": v, "val_accuracy": a} for t, v, a in zip(TRAIN, VAL, VACC)])
    f = OV.overfit(run, {})
    assert f and f[0]["severity"] == "stop" and f[0]["evidence"]["best_step"] == 3
    assert f[0]["step"] == 10  # the first eval of the streak at x1.5 (1.227 >= 1.18)
    assert OV.overfit(run.upto(12), {}) == []  # 3 evals at x1.5 are not yet 5


def test_a_milder_rise_that_lasts_a_quarter_of_the_evals_is_overfitting_and_a_bump_is_not():
    # a bigram LSTM (blind holdout 63, spent): val perplexity 2.98 at its first eval, then 4.4 for
    # the rest of the run while the train loss falls: its loss (ln ppl) x1.35, under x1.5, but held
    rng = random.Random(3)
    val = [2.98] + [4.40 + rng.uniform(-0.02, 0.02) for _ in range(40)]
    rows = [{"loss": 3.3 - 0.02 * e, "validation_set_perplexity": v} for e, v in enumerate(val)]
    f = OV.overfit(run_of(rows), {})
    assert f and f[0]["severity"] == "stop" and f[0]["evidence"]["evals"] == 10
    # twin: a healthy run's eval loss falls, bumps x1.4 for 6 evals of 60, and comes back down
    val = [2.0 * 0.97 ** e for e in range(60)]
    bumped = val[:50] + [val[49] * 1.4] * 6
    rows = [{"loss": 2.0 * 0.96 ** e, "val_loss": v} for e, v in enumerate(bumped)]
    assert OV.overfit(run_of(rows), {}) == []


def test_a_best_eval_logged_before_the_first_train_log_is_compared_with_that_log():
    # a TFT (blind holdout 67, spent): its best val loss at step 29, its train loss logged from
    # step 49 on. No train loss "at the best" made the rule silent while val rose x2.6.
    run = Run()
    run.add_record(29.0, [("val_loss", 1.62), ("val_SMAPE", 0.74)])
    for e in range(1, 12):
        run.add_record(50.0 * e - 1, [("loss", 2.0 - 0.04 * e)])
        run.add_record(50.0 * e + 29, [("val_loss", 1.62 * (1 + 0.3 * e)), ("val_SMAPE", 0.74 + 0.02 * e)])
    f = OV.overfit(run, {})
    assert f and f[0]["evidence"]["best_step"] == 29


def test_an_improving_metric_is_the_eval_loss_trap_not_overfitting():
    acc = [0.43 + 0.02 * e for e in range(25)]  # accuracy keeps improving as the loss rises
    run = run_of([{"loss": t, "val_loss": v, "val_accuracy": a} for t, v, a in zip(TRAIN, VAL, acc)])
    assert OV.overfit(run, {}) == []
    wer = [0.9 - 0.02 * e for e in range(25)]  # lower is better, and it got lower
    run = run_of([{"loss": t, "eval_loss": v, "eval_wer": w} for t, v, w in zip(TRAIN, VAL, wer)])
    assert OV.overfit(run, {}) == []


def test_a_rising_train_loss_or_a_near_zero_eval_loss_is_not_overfitting():
    up = [0.5 + 0.01 * e for e in range(25)]  # eval_diverged's case: both losses rise
    assert OV.overfit(run_of([{"loss": t, "val_loss": v} for t, v in zip(up, VAL)]), {}) == []
    tiny = [3e-5] * 10 + [6e-5, 1e-4, 8e-5, 9e-5, 1e-4]  # a perfect model's eval loss, one printed digit
    assert OV.overfit(run_of([{"loss": 0.01 / (e + 1), "val_loss": v} for e, v in enumerate(tiny)]), {}) == []


def test_a_noisy_eval_loss_is_not_diverged_when_its_rise_is_within_its_noise():
    rng = random.Random(3)
    # a val MSE falling with +-25% from one eval to the next, then 5 evals at 1.3x its best
    val = [9000.0 * 0.97 ** e * math.exp(rng.gauss(0, 0.25)) for e in range(40)]
    val += [1.3 * min(val)] * 5
    train = [1000.0] * 30 + [1300.0] * 15  # the train loss rose x1.3 too
    run = run_of([{"loss": t, "val_loss": v} for t, v in zip(train, val)])
    assert L.eval_diverged(run, {}) == []
    smooth = [9000.0 * 0.97 ** e for e in range(40)] + [1.3 * 9000.0 * 0.97 ** 39] * 5
    assert L.eval_diverged(run_of([{"loss": t, "val_loss": v} for t, v in zip(train, smooth)]), {})


def test_a_noisy_per_batch_train_loss_has_not_risen_when_its_rise_is_within_its_noise():
    # a train loss logged per batch at a flat level with +-40% from batch to batch (ResNet's
    # 0.05-0.12): the least of many medians of a few batches is a lucky streak, not the level the
    # run reached, so an eval loss 15% over its best for 5 evals is no "worse on every count"
    rng = random.Random(5)
    rows = []
    for i in range(600):
        row = {"loss": 0.08 * math.exp(rng.gauss(0, 0.4))}
        if i % 20 == 19:
            row["val_loss"] = 0.20 if i < 500 else 0.23
        rows.append(row)
    assert L.eval_diverged(run_of(rows), {}) == []
    for row in rows[450:]:  # the same run whose train loss level then rose x1.8: diverged
        row["loss"] *= 1.8
    assert L.eval_diverged(run_of(rows), {})


def test_a_nan_train_loss_while_dev_accuracy_keeps_improving_is_a_wait():
    nan = float("nan")
    rows = [{"loss": nan, "dev_acc": a} for a in (0.306, 0.268, 0.366, 0.428, 0.498)]
    v = judge(run_of(rows, every=200), final=True)
    assert "nonfinite_loss" not in stops(v)
    assert next(f for f in v["findings"] if f["code"] == "nonfinite_loss")["evidence"]["metric_improving"] == "dev_acc"
    frozen = [{"loss": nan, "dev_acc": 0.25} for _ in range(5)]  # NaN weights: one constant answer
    assert "nonfinite_loss" in stops(judge(run_of(frozen, every=200)))


def test_a_gan_loss_that_climbs_is_not_a_divergence():
    rows = [{"d_adv_loss": 0.39 + (0.0 if e < 30 else 0.3), "f_adv_loss": 1.3 - 0.005 * e} for e in range(75)]
    v = judge(run_of(rows))
    assert not set(stops(v)) & {"divergence", "divergence_best", "level_shift", "spike_unrecovered"}
    assert any(f["evidence"].get("gan") for f in v["findings"])


def test_the_cli_stops_an_overfitting_keras_run(tmp_path):
    p = tmp_path / "training_log.csv"
    p.write_text("epoch,accuracy,loss,val_accuracy,val_loss\n" + "".join(
        "%d,%.4f,%.4f,%.4f,%.4f\n" % (e, 0.35 + 0.025 * e, t, a, v) for e, (t, v, a) in enumerate(zip(TRAIN, VAL, VACC))))
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "check", str(p), "--final", "--json"],
                         capture_output=True, text=True, timeout=60)
    v = json.loads(out.stdout)
    assert out.returncode == 11 and v["findings"][0]["code"] == "overfit", out.stdout + out.stderr


def test_a_metric_collapse_on_two_evals_stops_and_one_eval_waits_unless_the_run_ended():
    # YOLOv7 #741: mAP 0.95 -> exactly 0 at epoch 4 (P and R too), then 0.0075 at epoch 5
    rows = [{"loss": 0.05, "metrics/mAP_0.5": m, "metrics/recall": r, "metrics/precision": p}
            for m, r, p in ((0.954, 0.91, 0.94), (0.958, 0.92, 0.95), (0.949, 0.90, 0.94), (0.943, 0.89, 0.94),
                            (0.0, 0.0, 0.0), (0.0075, 0.0045, 0.5057))]
    one = run_of(rows[:5])
    assert "metric_zero" not in stops(judge(one)) and "metric_zero" in stops(judge(one, final=True))
    assert "metric_zero" in stops(judge(run_of(rows)))  # under 1% of its best is still next to nothing
    back = rows[:5] + [{"loss": 0.05, "metrics/mAP_0.5": 0.5, "metrics/recall": 0.5, "metrics/precision": 0.6}]
    assert "metric_zero" not in stops(judge(run_of(back)))


def test_a_metric_at_zero_after_one_lucky_first_eval_is_no_collapse():
    # YOLOv8l (blind holdout 18, spent): recall 0.48 on its first eval, 0 on the next two, then the
    # detector learns to 0.99. A level seen on one eval is a single noisy point, not a level held.
    evals = [(0.08, 0.48, 0.07), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]
    rows = [{"loss": 1.0 - 0.01 * i, "metrics/precision": p, "metrics/recall": r, "metrics/mAP_0.5": m}
            for i, (p, r, m) in enumerate(evals)]
    assert "metric_zero" not in stops(judge(run_of(rows)))
    held = [(0.3, 0.48, 0.2)] * 2 + evals[1:]  # held on two evals, then 0 on two: a collapse
    rows = [dict(r, **{"metrics/precision": p, "metrics/recall": rc, "metrics/mAP_0.5": m})
            for r, (p, rc, m) in zip(rows + rows[-1:], held)]
    assert "metric_zero" in stops(judge(run_of(rows)))


def test_a_test_loss_logged_per_batch_is_judged_one_eval_per_step():
    # a d2l ResNet (blind holdout 67, spent): the test loss logged per batch, 20 batches at each of
    # 10 steps, the batches 0.15-0.38 while the mean holds; its luckiest batch was no best
    rng = random.Random(7)
    run = Run()
    for e in range(10):
        step = 117.0 * (e + 1)
        for b in range(20):
            run.add_record(step - 20 + b, [("loss", 2.0 * 0.8 ** e + 0.01 * b)])
        for b in range(20):
            run.add_point(step, "val_loss", (0.15 if (e, b) == (6, 3) else rng.uniform(0.22, 0.38)))
    assert OV.overfit(run, {}) == []
    # twin: the per-step means doubling while the train loss falls is overfitting still
    for e in range(10, 16):
        step = 117.0 * (e + 1)
        run.add_record(step - 1, [("loss", 2.0 * 0.8 ** e)])
        for b in range(20):
            run.add_point(step, "val_loss", rng.uniform(0.6, 0.7))
    f = OV.overfit(run, {})
    assert f and f[0]["severity"] == "stop" and f[0]["evidence"]["best"] > 0.2


def test_a_metric_constant_on_every_eval_holds_no_veto():
    # YOLO11-cls on 3 classes (blind holdout 26, spent): top-5 accuracy is 1.0 on every eval, so it
    # "held" and vetoed the overfit of a val loss at 4x its best with top-1 below its first eval
    rows = [{"loss": t, "val_loss": v, "val_accuracy": a, "val_acc_top5": 1.0} for t, v, a in zip(TRAIN, VAL, VACC)]
    f = OV.overfit(run_of(rows), {})
    assert f and f[0]["severity"] == "stop"
    # a metric that moves and held is still the eval-loss trap
    rows = [dict(r, val_acc_top5=0.9 + 0.004 * i) for i, r in enumerate(rows)]
    assert OV.overfit(run_of(rows), {}) == []


def test_a_metric_s_direction_is_known_by_its_words():
    # MAPE and SMAPE are errors (a forecaster's, pytorch-forecasting's val_SMAPE), not an mAP: read
    # as better higher, a SMAPE 0.74 -> 0.99 "improved" and vetoed a TFT's overfit
    for name in ("val_loss", "val_MAPE", "val_SMAPE", "val_MAE", "eval_wer", "val_ppl"):
        assert L.metric_sign(name) == 1.0, name
    for name in ("val_mAP", "metrics/mAP50(B)", "val_accuracy", "eval_f1", "test_bleu"):
        assert L.metric_sign(name) == -1.0, name
    assert L.metric_sign("loss") == 0.0 and L.metric_sign("eval_runtime") == 0.0  # train side; no metric


def _twice_logged(first: float, second: float) -> Run:
    """An eval loss every 98 steps, bottoming at the 5th eval; a train loss logged at 500 and 1000."""
    run = Run()
    for e, v in enumerate([1.51, 1.26, 1.03, 0.87, 0.82, 0.95, 1.0, 1.05, 1.1, 1.15]):
        if 98.0 * (e + 1) > 500 and not run.get("loss"):
            run.add_record(500.0, [("loss", first)])
        run.add_record(98.0 * (e + 1), [("eval_loss", v)])
    run.add_record(1000.0, [("loss", second)])
    run.add_record(1078.0, [("eval_loss", 1.2)])
    return run


def test_a_train_loss_logged_twice_has_risen_only_when_its_last_log_is_over_its_best():
    # a BERT classifier (blind holdout 41, spent): the eval loss climbs from epoch 5 while the train
    # loss, logged every 500 steps, reads 0.935 then 0.0765. The median of those two sat 1.2x over
    # the best, which is the last log itself: no rise, so not every count got worse
    assert L.eval_diverged(_twice_logged(0.935, 0.0765), {}) == []
    # twin: the second log over the first (0.34 -> 0.81, a Lightning run's late divergence) is one
    assert L.eval_diverged(_twice_logged(0.34, 0.81), {})


# a CNN on CIFAR-10 (holdout 54, spent): the val loss bottoms at epoch 7, then rises on every eval
CLIMB_VAL = [2.1, 1.8, 1.6, 1.5, 1.42, 1.35, 1.30, 1.2842, 1.4685, 1.5289, 1.6374, 1.7924, 1.8288]


def _climb_run(val, **more):
    return run_of([{"loss": 2.0 * 0.85 ** e, "val_loss": v, **{k: x[e] for k, x in more.items()}}
                   for e, v in enumerate(val)])


def test_an_eval_loss_that_rose_on_each_of_its_last_five_evals_to_1_4x_its_best_is_overfitting():
    f = OV.overfit(_climb_run(CLIMB_VAL), {})
    assert f and f[0]["severity"] == "stop" and f[0]["evidence"]["climbing"] is True
    assert f[0]["evidence"]["best"] == 1.2842 and f[0]["evidence"]["ratio"] < 1.5  # under both older bars


def test_a_climb_with_a_dip_a_climb_to_1_3x_and_a_climb_the_accuracy_outlived_are_not():
    dipped = CLIMB_VAL[:10] + [1.50] + CLIMB_VAL[11:]  # four rises, a fall, then two
    assert OV.overfit(_climb_run(dipped), {}) == []
    mild = CLIMB_VAL[:8] + [1.30, 1.33, 1.38, 1.45, 1.66]  # x1.29 at the end: a drift, under x1.4
    assert OV.overfit(_climb_run(mild), {}) == []
    acc = [0.3 + 0.03 * e for e in range(len(CLIMB_VAL))]  # the accuracy improved on every eval
    assert OV.overfit(_climb_run(CLIMB_VAL, val_accuracy=acc), {}) == []


# a Keras LSTM on AG News, five epochs (holdout 63, spent): val loss up on every eval after the first
SHORT_ROWS = [{"loss": t, "val_loss": v, "val_accuracy": a} for t, v, a in zip(
    [0.3305, 0.1862, 0.1214, 0.0792, 0.0506], [0.2703, 0.3008, 0.3692, 0.4574, 0.5542],
    [0.9075, 0.9062, 0.9030, 0.8990, 0.8955])]


def test_an_ended_short_log_whose_eval_loss_rose_on_every_eval_since_its_best_is_overfitting():
    f = OV.overfit(run_of(SHORT_ROWS), {"final": True})
    assert f and f[0]["evidence"]["short"] is True and f[0]["evidence"]["also_worse"] == ["val_accuracy"]
    assert f[0]["step"] == 1 and f[0]["evidence"]["best_step"] == 0
    assert judge(run_of(SHORT_ROWS), final=True)["verdict"] == "STOP"


def test_a_short_climb_while_running_without_a_metric_with_a_metric_held_or_with_a_dip_is_not():
    assert OV.overfit(run_of(SHORT_ROWS), {}) == []  # a running job's first evals may still turn
    bare = [{k: v for k, v in r.items() if k != "val_accuracy"} for r in SHORT_ROWS]
    assert OV.overfit(run_of(bare), {"final": True}) == []  # no metric: a loss alone is no witness
    held = [dict(r, val_accuracy=0.9075) for r in SHORT_ROWS[:1]] + [dict(r, val_accuracy=0.91) for r in SHORT_ROWS[1:]]
    assert OV.overfit(run_of(held), {"final": True}) == []
    dip = SHORT_ROWS[:3] + [dict(SHORT_ROWS[3], val_loss=0.35)] + SHORT_ROWS[4:]
    assert OV.overfit(run_of(dip), {"final": True}) == []
