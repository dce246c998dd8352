"""Shapes a console paste takes that a trainer's own file does not (issue 11, from the "no loss
series" misses of the spent holdouts): a tqdm bar with the next print glued to it, a markdown
table copied from a rendered page (no outer pipes, "--" rules), a rendered fastai table whose
"train_loss" lost its underscore, and "loss at step N: X". Each is read line by line (a short
paste) and, where a log could be long, through the columnar paths too (past their 4 KiB)."""

from __future__ import annotations

import math

import pytest

from orchestrator.quality.judge import judge
from orchestrator.quality.sources import Tracker


def _run(tmp_path, lines, name="train.log"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return Tracker([str(p)]).update()


@pytest.mark.parametrize("epochs", [6, 300])
def test_a_print_glued_to_a_tqdm_bar_is_a_line_of_its_own(tmp_path, epochs):
    # deep_avsr: the bar is drawn without a newline, the epoch's print lands right after "it/s]"
    lines = ["Train:   0%%|          | 0/512 [00:00<?, ?it/s]Step: %d || Tr.Loss: %.6f  Val.Loss: %.6f || "
             "Tr.CER: 0.500  Val.CER: 0.600" % (e, 3.0 / e, 3.2 / e) for e in range(1, epochs + 1)]
    run = _run(tmp_path, lines)
    loss, val = run.get("loss"), run.get("val_loss")
    assert loss is not None and val is not None
    assert list(loss.steps) == [float(e) for e in range(1, epochs + 1)]
    assert loss.values[0] == 3.0 and val.values[-1] == float("%.6f" % (3.2 / epochs))


def test_a_bar_followed_by_its_newline_is_unchanged(tmp_path):
    lines = ["Epoch 1:  50%|#####     | 5/10 [00:01<00:01,  4.00it/s, loss=0.5]",
             "Epoch 1: 100%|##########| 10/10 [00:02<00:00,  4.00it/s, loss=0.4]"]
    run = _run(tmp_path, lines)
    assert list(run.series["loss"].values) == [0.5, 0.4]


def test_a_markdown_table_without_outer_pipes_is_read(tmp_path):
    # GitHub's copy of a rendered table: a header, a rule of "--" cells, then one row per epoch
    lines = ["Training log:", "epoch | train loss | train acc | val loss | val acc", "-- | -- | -- | -- | --"]
    lines += ["%d | %.8f | %.8f | %.8f | 0.57318449" % (e, 0.7 - 0.001 * e, 0.51, 0.67) for e in range(5, 105, 5)]
    run = _run(tmp_path, lines)
    assert list(run.series["loss"].steps) == [float(e) for e in range(5, 105, 5)]
    assert len(run.series["val_loss"]) == 20 and set(run.series["val_acc"].values) == {0.57318449}
    out = judge(run)
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "eval_frozen"


def test_pipes_between_keyed_values_stay_a_plain_line(tmp_path):
    # "epoch 3 | loss 0.5 | acc 0.8": keyed values with pipes between them, not a table's row
    lines = ["step | loss | acc"] + ["epoch %d | loss %.3f | acc %.3f" % (e, 1.0 / e, 0.5 + 0.01 * e)
                                     for e in range(1, 9)]
    run = _run(tmp_path, lines)
    assert list(run.series["loss"].steps) == [float(e) for e in range(1, 9)]
    assert run.series["acc"].values[-1] == 0.58


def test_a_rule_needs_its_header_before_it(tmp_path):
    lines = ["-- | -- | --", "1 | 0.5 | 0.6", "epoch 1 loss 0.9", "epoch 2 loss 0.8"]
    run = _run(tmp_path, lines)
    assert list(run.series["loss"].values) == [0.9, 0.8]


def test_a_rendered_fastai_table_with_split_names_is_read(tmp_path):
    # fastai prints "train_loss"; a copy of its rendered table shows "train loss"
    lines = ["epoch train loss valid loss accuracy_thresh f2_opt",
             "0 nan nan 0.997788 0.000000"]
    run = _run(tmp_path, lines)
    assert math.isnan(run.series["loss"].values[0]) and math.isnan(run.series["val_loss"].values[0])
    assert run.series["accuracy_thresh"].values[0] == 0.997788
    out = judge(run, final=True)
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "nonfinite_loss"


def test_a_header_of_one_word_names_is_unchanged(tmp_path):
    lines = ["epoch train_loss valid_loss accuracy time"] + \
            ["%d %.4f %.4f %.4f 00:05" % (e, 1.0 / (e + 1), 1.1 / (e + 1), 0.5 + 0.01 * e) for e in range(4)]
    run = _run(tmp_path, lines)
    assert len(run.series["loss"]) == 4 and len(run.series["val_loss"]) == 4


@pytest.mark.parametrize("sep", [":", " :", " =", " is"])
def test_loss_at_step_n_colon_value(tmp_path, sep):
    # a custom loop's "Training loss at step 0: 1.64": the number after "step" is the step
    lines = ["Training loss at step %d%s %.6f, accuracy: %.4f" % (s, sep, 2.0 - 0.001 * s, 0.05)
             for s in range(0, 400, 100)]
    run = _run(tmp_path, lines)
    assert list(run.series["loss"].steps) == [0.0, 100.0, 200.0, 300.0]
    assert run.series["loss"].values[0] == 2.0


@pytest.mark.parametrize("epochs", [3, 300])
def test_an_eval_loops_bar_is_not_a_restart(tmp_path, epochs):
    # pointnet2: a train bar to 410, its print, an eval bar to 103, its print. The eval bar's lower
    # count read as a restart dropped every train point before it, epoch after epoch
    lines = []
    for e in range(1, epochs + 1):
        lines += ["Epoch %d (%d/%d):" % (e, e, epochs),
                  "100%%|##########| 410/410 [01:18<00:00,  5.24it/s]",
                  "Train Instance Accuracy: %.6f" % (0.5 + e / 1000.0),
                  "100%%|##########| 103/103 [00:14<00:00,  7.28it/s]",
                  "Test Instance Accuracy: %.6f" % (0.4 + e / 1000.0)]
    run = _run(tmp_path, lines)
    assert run.restarts == []
    assert len(run.series["train_instance_accuracy"]) == epochs
    assert len(run.series["test_instance_accuracy"]) == epochs
    assert run.series["train_instance_accuracy"].values[-1] == 0.5 + epochs / 1000.0


def test_a_lower_count_of_the_same_bar_is_still_a_restart(tmp_path):
    lines = ["100%|##########| 410/410 [01:18<00:00,  5.24it/s]", "train loss: 0.9",
             " 50%|#####     | 205/410 [00:39<00:39,  5.24it/s]", "train loss: 0.95"]
    run = _run(tmp_path, lines)
    assert run.restarts == [205.0]
    assert list(run.series["loss"].steps) == [205.0]


def test_a_second_runs_bar_that_has_just_begun_is_a_restart(tmp_path):
    # two fine-tunes in one log: the first's bar ran to 6957, the second's starts at 0/2260 (another
    # total, below the last step): a new run, not an eval loop, so the old timeline is dropped
    lines = ["100%%|##########| %d/6957 [00:10<00:00, 9.00it/s]\n{'loss': %.4f, 'epoch': %.2f}"
             % (s, 1.0 / (1 + s / 100.0), s / 2319.0) for s in range(500, 7000, 500)]
    lines += ["  0%|          | 0/2260 [00:00<?, ?it/s]You're using a fast tokenizer.",
              "{'eval_loss': 0.137, 'eval_f1': 0.9598, 'epoch': 1.0}"]
    run = _run(tmp_path, lines)
    assert run.restarts
    assert "loss" not in run.series or len(run.series["loss"]) == 0
    assert run.series["eval_loss"].values[-1] == 0.137


@pytest.mark.parametrize("epochs", [1, 5])  # 5 epochs: 475 lines, past the columnar readers' 4 KiB
def test_the_pytorch_mnist_examples_sample_count_is_the_step_within_its_epoch(tmp_path, epochs):
    # "Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.563": read by its epoch alone, every batch of an
    # epoch sat on one step, so no rule could see a trend or a streak within it
    lines = []
    for e in range(1, epochs + 1):
        lines += ["Train Epoch: %d [%d/60000 (%d%%)]\tLoss: %.6f" % (e, b, 100 * b // 60000, 2.0 / (1 + e + b / 6e4))
                  for b in range(0, 60000, 640)]
        lines += ["", "Test set: Average loss: 0.%04d, Accuracy: 9%d00/10000 (9%d%%)" % (1000 // e, e, e), ""]
    loss = _run(tmp_path, lines).series["loss"]
    assert len(loss) == 94 * epochs
    assert len(set(loss.steps)) >= 94 * epochs - epochs  # an epoch's first batch may share its step
    assert list(loss.steps) == sorted(loss.steps) and loss.steps[1] == 640.0
