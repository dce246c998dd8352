"""A loss named by its formula (issue 11, from the blind rounds' "no loss series" misses): a
super-resolution log's "[L1: 5.96]", MXNet's "Train-SmoothL1=nan", a regression's "mse: 0.31".
The log names no loss, so the formula's name is the loss: read, judged by the rules that need no
role (non-finite, x100, frozen), never by a trend alone (it may be a metric beside an objective
the log never prints), and never the loss when a key named loss exists or is declared."""

from __future__ import annotations

import pytest

from orchestrator.quality.judge import judge
from orchestrator.quality.roles import is_objective, objective_words, role_of
from orchestrator.quality.sources import Tracker


def _run(tmp_path, lines, name="train.log"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return Tracker([str(p)]).update()


@pytest.mark.parametrize("key,role", [("mse", "loss"), ("train_rmse", "loss"), ("l1", "loss"),
                                      ("train-smoothl1", "loss"), ("val_mae", "val_loss"), ("test_rmse", "val_loss")])
def test_a_formula_name_plays_a_loss_role_behind_every_loss_word(key, role):
    r = role_of(key)
    assert r is not None and r[0] == role and is_objective(key)
    assert role_of("loss_total")[1] < r[1] and role_of("train_loss_l1")[1] < r[1]  # a loss word wins
    assert not is_objective("train_loss_l1")


@pytest.mark.parametrize("key", ["cell1", "level1", "l1_weight", "mse_coef", "lambda_l1", "conv1"])
def test_no_objective_in_a_name_that_only_contains_one(key):
    assert role_of(key) is None or not is_objective(key)
    if key in ("cell1", "level1", "conv1"):
        assert not objective_words(key)


def test_a_linear_error_is_judged_before_a_squared_one():
    # ratio thresholds read a squared error's ratio squared: the rmse is the loss when both exist
    assert role_of("train_rmse")[1] < role_of("train_mse")[1]


def test_a_sr_log_blowing_up_in_l1_is_stopped(tmp_path):
    # EDSR's console: "[done/total]\t[L1: value]\ttimes"; the L1 jumps 500x and stays there (the
    # check on the second log after the jump: the one a running job gets)
    vals = [6.0, 6.1, 5.98, 5.97, 6.0, 6.06, 2948.0, 3150.1]
    lines = ["[Epoch 26]\tLearning rate: 1.00e-4"]
    lines += ["[%d/16000]\t[L1: %.4f]\t65.8+0.1s" % (1600 * (i + 1), v) for i, v in enumerate(vals)]
    run = _run(tmp_path, lines)
    assert run.main_loss() is not None and run.main_loss().name == "l1"
    out = judge(run)
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "loss_explosion"


def test_mxnet_smoothl1_nan_is_a_nonfinite_loss(tmp_path):
    lines = []
    for b in (20, 40, 60):
        lines += ["Epoch[0] Batch [%d]\tSpeed: 27.98 samples/sec\tTrain-Acc=0.55" % b,
                  "Epoch[0] Batch [%d]\tSpeed: 27.98 samples/sec\tTrain-SmoothL1=nan" % b]
    out = judge(_run(tmp_path, lines))
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "nonfinite_loss"


def test_a_metric_line_named_only_by_formulas_is_read(tmp_path):
    # PyNET's print: no "loss" anywhere, the mse is what it minimises; frozen to 4 digits for 9 epochs
    lines = ["Epoch 0, mse: 0.7751, psnr: 11.9902, vgg: 0.5996"]
    lines += ["Epoch %d, mse: 0.6079, psnr: 6.6111, vgg: 0.5348" % e for e in range(1, 10)]
    run = _run(tmp_path, lines)
    assert list(run.get("loss").values[-2:]) == [0.6079, 0.6079]
    out = judge(run, final=True)
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "frozen"


def test_a_loss_key_beside_the_formula_stays_the_loss(tmp_path):
    lines = ["step %d loss %.4f mse %.4f" % (s, 2.0 / s, 1.0 / s) for s in range(1, 30)]
    run = _run(tmp_path, lines)
    assert run.get("loss").name == "loss"


def test_a_declared_loss_column_outranks_a_formula_before_its_first_value(tmp_path):
    # Lightning's metrics.csv: train_loss is written at the epoch's end, train_MAE_step on every
    # step before it; the header names both from its first line
    rows = ["epoch,step,train_MAE_step,train_loss"]
    rows += ["0,%d,%.4f," % (s, 500.0 / s) for s in range(4, 200, 5)]
    run = _run(tmp_path, rows, "metrics.csv")
    assert run.series["train_mae_step"] and run.get("loss") is None
    rows.append("0,199,,3.5")
    run = _run(tmp_path, rows, "metrics.csv")
    assert run.get("loss").name == "loss" and list(run.get("loss").values) == [3.5]


@pytest.mark.parametrize("key,stops", [("train_mse", False), ("train_loss", True)])
def test_a_trend_alone_stops_only_a_loss_named_loss(tmp_path, key, stops):
    # the same steady tripling over 60 epochs: STOP on a "loss", a WAIT on a formula-named series
    rows = ["epoch,%s" % key] + ["%d,%.6f" % (e, 0.1 * (1.0 + 2.0 * e / 59.0)) for e in range(60)]
    out = judge(_run(tmp_path, rows, "history.csv"))
    assert (out["verdict"] == "STOP") is stops
    if not stops:
        assert out["verdict"] == "WAIT"
        assert any(f["evidence"].get("inferred_objective") for f in out["findings"])

