"""Series by meaning and steps by shape (issue 11, items 5 and 6): the keys and console lines
real runs write, read from real files in tmp and judged through the real ``gpurun check``."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.quality.judge import judge
from orchestrator.quality.roles import role_of
from orchestrator.quality.series import Run
from orchestrator.quality.sources import Tracker


def _read(path) -> Run:
    tr = Tracker([str(path)])
    run = tr.update()
    assert not tr.problems, tr.problems
    return run


def _check(path) -> tuple:
    r = CliRunner().invoke(cli, ["check", str(path), "--json"], catch_exceptions=False)
    return r.exit_code, json.loads(r.output)


def _curve(n: int = 60, nan_from: int = 10 ** 9):
    return [2.0 / (1 + s / 20) if s < nan_from else math.nan for s in range(n)]


# --- the loss, lr, grad norm and eval series by meaning -----------------------------------------

@pytest.mark.parametrize("key", ["loss", "loss_total", "train/loss", "Loss", "train_loss_step", "total_loss",
                                 "lm_loss", "train/loss_total", "trainLoss"])
def test_any_loss_word_key_is_the_loss(tmp_path, key):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, key: v, "loss_scale": 65536.0}) + "\n"
                         for s, v in enumerate(_curve())))
    main = _read(p).main_loss()
    assert main is not None and len(main) == 60 and main.values[0] == 2.0, key
    assert main.name != "loss_scale"


def test_loss_scale_and_other_loss_stats_are_never_the_loss(tmp_path):
    for key in ("loss_scale", "loss_scaler", "nan_loss_count", "loss_weight", "best_val_loss", "max_loss"):
        assert role_of(key) is None, key
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss_scale": 2.0 ** (16 - s), "lr": 1e-3}) + "\n" for s in range(40)))
    code, out = _check(p)
    assert code == 10 and out["reason"] == "no loss series found yet" and out["points"] == 0


def test_loss_total_going_nan_stops_instead_of_waiting_for_a_loss(tmp_path):
    """The issue's run: NaN in `loss_total` read as WAIT "no loss series"."""
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss_total": v, "loss_cls": v / 3, "loss_scale": 1024.0}) + "\n"
                         for s, v in enumerate(_curve(60, nan_from=50))))
    code, out = _check(p)
    assert code == 11 and out["verdict"] == "STOP", out
    assert out["findings"][0]["code"] == "nonfinite_loss" and out["findings"][0]["step"] == 50


def test_exact_loss_wins_over_loss_by_meaning_and_components(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss_cls": 9.0, "loss_total": 5.0, "loss": 1.0}) + "\n"
                         for s in range(20)))
    run = _read(p)
    assert run.main_loss().name == "loss" and run.get("loss").values[0] == 1.0
    q = tmp_path / "c.jsonl"  # mmdet: components only, the total among them
    q.write_text("".join(json.dumps({"step": s, "loss_rpn_cls": 9.0, "loss_bbox": 7.0, "total_loss": 3.0}) + "\n"
                         for s in range(20)))
    assert _read(q).main_loss().name == "total_loss"


@pytest.mark.parametrize("key,role", [("learning_rate", "lr"), ("lr-AdamW", "lr"), ("optimizer/lr_group0", "lr"),
                                      ("train/grad_norm", "grad_norm"), ("grad_norm/total", "grad_norm"),
                                      ("eval_loss", "eval_loss"), ("val/loss", "val_loss"),
                                      ("val_bpb", "val_loss"), ("test/loss", "val_loss")])
def test_lr_grad_norm_and_eval_keys_by_meaning(tmp_path, key, role):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss": 1.0, key: 0.5 + s}) + "\n" for s in range(10)))
    s = _read(p).get(role)
    assert s is not None and list(s.values[:2]) == [0.5, 1.5], (key, role)


def test_val_bpb_alone_is_judged(tmp_path):
    """nanochat-style: only a validation bits-per-byte curve; it goes NaN -> STOP."""
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": 100 * s, "val_bpb": v}) + "\n" for s, v in enumerate(_curve(30, 25))))
    code, out = _check(p)
    assert code == 11 and out["findings"][0]["code"] == "nonfinite_loss"


# --- steps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["step", "global_step", "_step", "train/global_step", "iter"])
def test_step_keys(tmp_path, key):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"loss": 1.0 / (s + 1), key: 10 * s}) + "\n" for s in range(50)))
    assert list(_read(p).get("loss").steps[:3]) == [0.0, 10.0, 20.0]


@pytest.mark.parametrize("rows", [40, 3000])  # the per-line parser and the columnar fast path
def test_old_wandb_history_jsonl_steps(tmp_path, rows):
    """``wandb-history.jsonl`` (wandb < 0.10): ``_step`` is the step; an HF run's own
    ``train/global_step`` in the same row is the real one, wherever it sits in the row."""
    p = tmp_path / "wandb-history.jsonl"
    p.write_text("".join(json.dumps({"_step": s, "loss": 2.0 / (s + 1), "_runtime": 1.5 * s,
                                     "_timestamp": 1.7e9 + s}) + "\n" for s in range(rows)))
    loss = _read(p).get("loss")
    assert len(loss) == rows and list(loss.steps[:3]) == [0.0, 1.0, 2.0] and loss.steps[-1] == rows - 1
    q = tmp_path / "hf-wandb-history.jsonl"
    q.write_text("".join(json.dumps({"_step": s, "train/loss": 2.0 / (s + 1), "train/global_step": 8 * s,
                                     "train/epoch": s / 100}) + "\n" for s in range(rows)))
    loss = _read(q).get("loss")
    assert loss.name == "loss" and list(loss.steps[:3]) == [0.0, 8.0, 16.0] and loss.steps[-1] == 8 * (rows - 1)


def _word_lm(epochs: int, nan_epoch: int = 0, per_epoch: int = 2983) -> str:
    """PyTorch examples/word_language_model/main.py output, as it prints it."""
    out = ["Namespace(batch_size=20, bptt=35, clip=0.25, cuda=True, data='./data/wikitext-2', dropout=0.2, "
           "epochs=40, log_interval=200, lr=20, model='LSTM', nhid=200, nlayers=2, seed=1111, tied=False)\n"]
    for e in range(1, epochs + 1):
        for b in range(200, per_epoch + 1, 200):
            loss = float("nan") if nan_epoch and e >= nan_epoch else 6.5 - 0.1 * e - b / 1e5
            out.append("| epoch %3d | %5d/%5d batches | lr %02.2f | ms/batch %5.2f | loss %5.2f | ppl %8.2f\n"
                       % (e, b, per_epoch, 20, 11.52, loss, math.exp(loss) if loss == loss else loss))
        out.append("-" * 89 + "\n| end of epoch %3d | time: %5.2fs | valid loss %5.2f | valid ppl %8.2f\n"
                   % (e, 33.6, 5.9 - 0.1 * e, 300.0) + "-" * 89 + "\n")
    return "".join(out)


def test_word_language_model_log_global_steps(tmp_path):
    p = tmp_path / "train.log"
    p.write_text(_word_lm(3))
    run = _read(p)
    loss = run.get("loss")
    assert list(loss.steps[:2]) == [200.0, 400.0] and loss.steps[14] == 2983 + 200  # (E-1)*N + B
    assert loss.steps[-1] == 2 * 2983 + 2800 and not run.restarts
    assert list(run.get("val_loss").steps) == [2983.0, 2 * 2983.0, 3 * 2983.0]  # end of epoch E: E*N
    assert not {"bptt", "clip", "epochs", "dropout", "nhid"} & set(run.series)  # the Namespace line is config
    assert list(run.get("lr").steps[:1]) == [200.0]


def test_diverged_word_language_model_stops_at_its_global_step(tmp_path):
    p = tmp_path / "train.log"
    p.write_text(_word_lm(6, nan_epoch=6))
    code, out = _check(p)
    assert code == 11 and out["findings"][0]["code"] == "nonfinite_loss", out
    assert out["findings"][0]["step"] == 5 * 2983 + 200 and out["last_step"] == 6 * 2983


def test_config_dump_lines_are_not_series(tmp_path):
    p = tmp_path / "out.log"
    p.write_text("TrainingArguments(learning_rate=5e-05, eval_steps=500, max_steps=1000, output_dir='x')\n"
                 "lr=0.001, batch_size=32, optimizer='adamw', eval_interval=250\n"
                 + "".join("step %d loss %.3f lr 0.001\n" % (s, 2.0 / (s + 1)) for s in range(1, 21)))
    run = _read(p)
    assert set(run.series) == {"loss", "lr"} and run.first_step == 1 and len(run.get("lr")) == 20


def _keras(epochs: int, batches: int, keras3: bool = False, nan_epoch: int = 0) -> str:
    out = []
    for e in range(1, epochs + 1):
        out.append("Epoch %d/%d\n" % (e, epochs))
        for b in range(1, batches + 1):
            loss = float("nan") if nan_epoch and e >= nan_epoch else 1.0 / (e + b / batches)
            bar = "━" * 20 if keras3 else "[" + "=" * 29 + ">]"
            tail = " - val_loss: %.4f - val_accuracy: 0.6000" % (loss * 1.1) if b == batches else ""
            eta = "3s 10ms/step" if keras3 or b == batches else "- ETA: 1s"
            out.append("%d/%d %s %s - accuracy: 0.5000 - loss: %.4f%s\n" % (b, batches, bar, eta, loss, tail))
    return "".join(out)


@pytest.mark.parametrize("keras3", [False, True])
def test_keras_epoch_headers_give_global_steps(tmp_path, keras3):
    p = tmp_path / "fit.log"
    p.write_text(_keras(4, 50, keras3))
    run = _read(p)
    loss = run.get("loss")
    assert len(loss) == 200 and list(loss.steps[:2]) == [1.0, 2.0] and loss.steps[50] == 51  # (E-1)*N + B
    assert loss.steps[-1] == 200 and not run.restarts and run.planned_steps == 200
    assert list(run.get("val_loss").steps) == [50.0, 100.0, 150.0, 200.0]
    assert "s" not in run.series and "eta" not in run.series and "ms/step" not in run.series


def test_keras_nan_stops_through_the_cli(tmp_path):
    p = tmp_path / "fit.log"
    p.write_text(_keras(5, 40, nan_epoch=5))
    proc = subprocess.run(["gpurun", "check", str(p), "--json"], capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert proc.returncode == 11 and out["findings"][0]["step"] == 161 and out["last_step"] == 200


@pytest.mark.parametrize("make", [lambda: _word_lm(8), lambda: _keras(30, 300)], ids=["word_lm", "keras"])
def test_growing_console_log_reads_as_the_cold_file(tmp_path, make):
    """The agent reads a log as it grows, cut anywhere: steps that depend on earlier lines
    (a Keras header, the batches per epoch) must come out as in one cold read."""
    data = make().encode()
    assert len(data) > 3 * 4096  # the fast path and the ordered scan take part
    p = tmp_path / "grow.log"
    p.write_bytes(b"")
    tr = Tracker([str(p)])
    done = 0
    for k in range(1, 8):
        end = len(data) * k // 7 - (37 if k < 7 else 0)
        with open(p, "ab") as f:
            f.write(data[done:end])
        done = end
        tr.update()
    cold = _read(p)
    run = tr.run
    assert sorted(run.series) == sorted(cold.series) and run.records == cold.records
    for name, s in cold.series.items():
        assert list(run.series[name].steps) == list(s.steps) and list(run.series[name].values) == list(s.values), name
    assert judge(run)["verdict"] == judge(cold)["verdict"]


def test_caffe_glog_lines(tmp_path):
    """Caffe prints its metrics after a glog head and splits one iteration over several lines."""
    lines = []
    for it in range(0, 800, 20):
        loss = 6.9 - it / 1000
        t = "I0515 11:%02d:%02d.%06d 37636" % (it // 60 % 60, it % 60, 873651 + it)
        lines += ["%s solver.cpp:239] Iteration %d (1.02848 iter/s, 19.4461s/20 iters), loss = %g\n" % (t, it, loss),
                  "%s solver.cpp:258]     Train net output #0: loss = %g (* 1 = %g loss)\n" % (t, loss, loss),
                  "%s sgd_solver.cpp:112] Iteration %d, lr = 0.01\n" % (t, it)]
    p = tmp_path / "caffe.log"
    p.write_text("".join(lines))
    run = _read(p)
    assert not run.restarts and not {"i0515", "solver.cpp", "sgd_solver.cpp", "output"} & set(run.series)
    loss = run.get("loss")
    assert loss.steps[0] == 0 and loss.steps[-1] == 780 and set(loss.steps) == set(range(0, 800, 20))
    assert list(run.get("lr").steps[:2]) == [0.0, 20.0]


def test_lines_without_a_step_join_the_last_named_step(tmp_path):
    p = tmp_path / "out.log"
    p.write_text("".join("step %d loss %.3f\n" % (s, 3 - s / 100) for s in range(1, 101))
                 + "{'eval_loss': 2.5, 'epoch': 1.0}\n"
                 # an eval loop's bar, not the step
                 + " 100%|██████████| 25/25 [00:03<00:00,  7.1it/s]\n"
                 + "Validation Summary Epoch: [1]   Validation loss: 2.4    Average WER 30.1\n"
                 + "".join("step %d loss %.3f\n" % (s, 3 - s / 100) for s in range(101, 121)))
    run = _read(p)
    assert not run.restarts and len(run.get("loss")) == 120
    assert list(run.get("eval_loss").steps) == [100.0] and list(run.get("val_loss").steps) == [100.0]


def test_trainer_state_entries_without_a_step(tmp_path):
    """A ``predict_*`` entry has no step: it sits at the step before it, it is no restart."""
    hist = []
    for k in range(1, 11):
        hist.append({"step": 100 * k, "loss": 2.0 / k, "epoch": k / 10})
        hist.append({"step": 100 * k, "eval_loss": 2.1 / k, "epoch": k / 10})
        hist.append({"predict_loss": 2.2 / k, "predict_runtime": 30.0, "epoch": k / 10})
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps({"global_step": 1000, "log_history": hist}, indent=2))
    run = _read(p)
    assert not run.restarts and run.main_loss().name == "loss" and len(run.get("loss")) == 10
    assert list(run.series["predict_loss"].steps[:2]) == [100.0, 200.0]


def test_watch_progress_reads_the_format_by_content(tmp_path):
    """``gpurun watch`` and the watchdog (``progress.read_progress``) choose the reader as the
    judge does: a JSONL named ``.txt`` keeps its keys, a CSV named ``.log`` is left to the full
    readers (the job log is read instead), a Keras log gives global steps."""
    from orchestrator.quality.progress import read_progress
    j = tmp_path / "metrics.txt"
    j.write_text("".join(json.dumps({"global_step": 10 * s, "objective_total_loss": 1.0 / (s + 1)}) + "\n"
                         for s in range(30)))
    step, loss = read_progress(str(j), None)
    assert step == 290 and loss == pytest.approx(1 / 30)
    c = tmp_path / "metrics.log"
    c.write_text("step,loss\n" + "".join("%d,%f\n" % (s, 2.0) for s in range(10)))
    k = tmp_path / "stdout.log"
    k.write_text(_keras(3, 20))
    step, loss = read_progress(str(c), str(k))
    assert step == 60 and loss == pytest.approx(1.0 / 4)


def test_keras_verbose_2_summary_lines_take_their_epoch(tmp_path):
    """Keras 2 ``fit(verbose=2)``: an ``Epoch E/M`` header, then one `` - 2s - loss: ...`` line."""
    p = tmp_path / "fit.log"
    p.write_text("".join("Epoch %d/60\n - 2s - loss: %.4f - acc: 0.9000 - val_loss: %.4f - val_acc: 0.9100\n"
                         % (e, 1.0 / e, 1.1 / e) for e in range(1, 61)))
    run = _read(p)
    assert list(run.get("loss").steps[:3]) == [1.0, 2.0, 3.0] and run.get("loss").steps[-1] == 60
    assert len(run.get("val_loss")) == 60 and not run.restarts and "s" not in run.series


def test_roles_follow_series_that_appear_later():
    """``Run.get`` caches the role table until a series appears: a ``loss_total`` logged after
    the first check is found by the next one, and an exact ``loss`` then wins over it."""
    run = Run()
    run.add_record(1.0, [("lr", 1e-3)])
    assert run.get("loss") is None and run.main_loss() is None
    run.add_record(2.0, [("lr", 1e-3), ("loss_total", 2.5)])
    assert run.get("loss").name == "loss_total" and run.main_loss().name == "loss_total"
    run.add_record(3.0, [("loss", 2.4)])
    assert run.get("loss").name == "loss"
    assert run.upto(2.0).get("loss").name == "loss_total"  # the resume gate's cut: "loss" has no point yet


def test_a_loss_logged_once_an_epoch_gives_way_to_one_logged_every_batch(tmp_path):
    """An epoch's summary "Loss: 2.303" beside a "Cost" on every batch (a VGG stuck at ln 10): the
    trend is the dense series', and the run is judged stuck at chance from it."""
    p = tmp_path / "train.log"
    lines = ["Epoch: 001/010 | Batch %04d/0391 | Cost: %.4f" % (b, 2.3026 + 0.001 * (b % 3)) for b in range(0, 400, 50)]
    lines += ["Epoch: 001/010 | Train: 10.000% |  Loss: 2.303"]
    lines += ["Epoch: 002/010 | Batch %04d/0391 | Cost: %.4f" % (b, 2.3030) for b in range(0, 200, 50)]
    p.write_text("\n".join(lines) + "\n")
    run = _read(p)
    assert len(run.series["loss"]) == 1 and run.main_loss().name == "cost"
    v = judge(run, final=True)
    assert v["verdict"] == "STOP" and v["findings"][0]["code"] == "chance_stuck"


def test_a_loss_logged_three_times_keeps_its_name_and_an_indexed_key_never_takes_it():
    run = Run()
    for i in range(12):
        run.add_record(float(i), [("train_cost", 1.0 / (i + 1)), ("loss_of_epoch28-batch-", 50.0 * i)])
    run.add_record(12.0, [("loss", 0.9)])
    assert run.get("loss").name == "train_cost"  # once: the dense one's
    run.add_record(13.0, [("loss", 0.8)])
    run.add_record(14.0, [("loss", 0.7)])
    assert run.get("loss").name == "loss"  # three times: a series of its own
    only = Run()
    for i in range(12):
        only.add_record(float(i), [("loss_of_epoch28-batch-", 50.0 * i)])
    only.add_record(12.0, [("loss", 0.9)])
    assert only.get("loss").name == "loss"  # "epoch28-batch-": a line's index read as a key


@pytest.mark.parametrize("key, acc", [("acc", True), ("val_accuracy", True), ("Top1Acc", True), ("valacc", True),
                                      ("accuracy_top-1", True), ("grad_accum_steps", False), ("loss", False)])
def test_an_accuracy_is_known_by_its_words(key, acc):
    from orchestrator.quality.roles import is_accuracy

    assert is_accuracy(key) is acc
