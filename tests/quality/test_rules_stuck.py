"""Runs that learned nothing, read from what they log beside the loss (issue 11, misses of the
spent holdouts): a held-out metric identical on every eval from its first is a STOP (a fine-tune
that converged before its first eval keeps a high F1, and a metric at 0 from the start is a
detector's first epochs: neither is); an eval loss near ln K with an eval accuracy near 1/K is
chance (two witnesses, so a band wider than the loss alone gets); a loss of 1e20 and more that is
not falling is broken whatever it started at; an ended run whose last loss is exactly 0 straight
after a real one collapsed; Keras progress bars pasted without their "Epoch N/M" headers are one
epoch each. Runs built in memory with the real ``Run``, and files through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.quality import rules_eval as E
from orchestrator.quality import rules_level as L
from orchestrator.quality.judge import judge
from orchestrator.quality.series import Run


def run_of(rows, every=1):
    r = Run("mem")
    for i, row in enumerate(rows):
        r.add_record(i * every, list(row.items()))
    return r


def stops(v):
    return [f["code"] for f in v["findings"] if f["severity"] == "stop"]


def _cli(path, *extra):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "check", *extra, str(path)],
                          capture_output=True, text=True, timeout=60)


def test_a_metric_identical_on_every_eval_from_its_first_is_stuck():
    # a GAT on another dataset: val_acc 0.72414 on every epoch (the class prior), the loss drifts
    rows = [{"loss": 0.64 - 0.002 * e + 0.003 * (-1) ** e, "val_loss": 0.5 - 0.001 * e, "val_acc": 0.72414}
            for e in range(30)]
    run = run_of(rows)
    f = E.metric_stuck(run, {})
    assert f and f[0]["severity"] == "stop" and f[0]["evidence"]["series"] == "val_acc"
    assert f[0]["step"] == E.STUCK_EVALS - 1 and f[0]["evidence"]["since_first_eval"]
    assert E.metric_stuck(run.upto(E.STUCK_EVALS - 2), {}) == []  # 7 evals can repeat by chance
    assert "eval_frozen" in stops(judge(run, {}))


def test_a_metric_that_moved_once_at_zero_or_high_from_its_first_eval_is_not_stuck():
    base = [{"loss": 1.0 / (e + 1), "val_acc": 0.61} for e in range(12)]
    moved = [dict(r) for r in base]
    moved[1]["val_acc"] = 0.62  # a live model's second eval moved it: the rest may be a plateau
    assert E.metric_stuck(run_of(moved), {}) == []
    # a detector's first epochs print mAP 0 (metric_zero's silence, not this rule's)
    assert E.metric_stuck(run_of([{"loss": 2.0 - 0.1 * e, "val_map": 0.0} for e in range(12)]), {}) == []
    # a fine-tune converged before its first eval: F1 0.9712 on every eval of a small set, the
    # eval loss moving (LayoutLMv3 on SROIE in the dev corpus)
    high = run_of([{"loss": 0.0134 / (e + 1), "eval_loss": 0.0244 + 0.0007 * e, "eval_f1": 0.9712} for e in range(10)])
    assert E.metric_stuck(high, {}) == [] and judge(high, {})["verdict"] != "STOP"
    # a percent is read as a fraction: 97.12 % is as high as 0.9712
    assert E.metric_stuck(run_of([{"loss": 0.1, "val_acc": 97.12} for _ in range(10)]), {}) == []
    # one eval printed again is one eval, not eight
    one = Run("mem")
    for _ in range(10):
        one.add_record(5, [("loss", 0.5), ("val_acc", 0.4)])
    assert E.metric_stuck(one, {}) == []


def test_an_eval_loss_near_ln_k_beside_an_eval_accuracy_near_1_over_k_is_chance():
    # an LSTM on a 3-class task: val_loss 1.097-1.111 (ln 3 = 1.0986, up to 1.1% off: too far for
    # the loss alone), val_acc 0.31-0.35, the batch train loss around ln 3
    val = [1.097, 1.098, 1.099, 1.102, 1.099, 1.100, 1.107, 1.111, 1.106, 1.097]
    acc = [0.33, 0.31, 0.35, 0.34, 0.33, 0.32, 0.35, 0.31, 0.33, 0.34]
    rows = [{"loss": 1.10 + 0.02 * (-1) ** e, "val_loss": v, "val_acc": a} for e, (v, a) in enumerate(zip(val, acc))]
    v = judge(run_of(rows), {})
    assert v["verdict"] == "STOP" and v["findings"][0]["code"] == "chance_stuck"
    assert v["findings"][0]["evidence"]["K"] == 3
    # the same losses while the accuracy is far from 1/3: the second witness says no
    learned = [dict(r, val_acc=0.6) for r in rows]
    assert "chance_stuck" not in stops(judge(run_of(learned), {}))
    # an accuracy better on every eval: near 1/3 still, but learning
    rising = [dict(r, val_acc=0.30 + 0.01 * e) for e, r in enumerate(rows)]
    assert "chance_stuck" not in stops(judge(run_of(rising), {}))
    # a slow start on its way down through ln 3: each eval at the lowest yet
    down = [1.118 - 0.005 * e for e in range(10)]
    falling = [dict(r, val_loss=d) for r, d in zip(rows, down)]
    assert "chance_stuck" not in stops(judge(run_of(falling), {}))
    # the train loss learned (far below ln 3): not a dead model
    trained = [dict(r, loss=0.4) for r in rows]
    assert "chance_stuck" not in stops(judge(run_of(trained), {}))


def test_a_loss_past_1e20_not_falling_is_absurd_whatever_it_started_at():
    # DOPE: 3.03e31 at its first log, rising at every log
    rise = run_of([{"loss": 3.03e31 * (1 + 0.01 * e)} for e in range(15)])
    f = L.absurd_loss(rise, {})
    assert f and f[0]["severity"] == "stop" and f[0]["evidence"]["huge"]
    # a PINN whose first losses are 1e13-1e14 falls from there: an info, no STOP
    pinn = run_of([{"loss": 1.4e14 * 0.5 ** e} for e in range(15)])
    assert all(x["severity"] != "stop" for x in L.absurd_loss(pinn, {}))
    # a loss started at 1e25 and falling fast is not judged broken on its scale alone
    fall = run_of([{"loss": 1e25 * 0.3 ** e} for e in range(15)])
    assert all(not x["evidence"].get("huge") for x in L.absurd_loss(fall, {}))


def test_an_ended_run_whose_last_loss_is_zero_straight_after_a_real_one_collapsed(tmp_path):
    # an SFT paste: 1.0645, 1.157, 1.1938, then exactly 0.0 with the LR unchanged
    lines = ["{'loss': %s, 'learning_rate': 1.89e-05, 'epoch': %.2f}" % (v, 0.52 + 0.01 * i)
             for i, v in enumerate(["1.0645", "1.157", "1.1938", "0.0"])]
    p = tmp_path / "sft.log"
    p.write_text("\n".join(lines) + "\n")
    running = _cli(p)
    assert running.returncode == 10 and "STOP" not in running.stdout  # a running job may heal
    ended = _cli(p, "--final")
    assert ended.returncode == 11 and "loss_collapse" in ended.stdout and "ended_zero=True" in ended.stdout
    # a memorised loss printed to 2 decimals reaches 0.00 from 0.01: no collapse
    soft = run_of([{"loss": v} for v in [0.2, 0.1, 0.05, 0.03, 0.02, 0.01, 0.0]])
    assert "loss_collapse" not in stops(judge(soft, {}, final=True))
    # a GAN's hinge discriminator reads 0 by design
    gan = run_of([{"loss_d": d, "loss_g": 1.0} for d in [0.8, 0.5, 0.0]])
    assert "loss_collapse" not in stops(judge(gan, {}, final=True))


def test_keras_bars_pasted_without_epoch_headers_are_one_epoch_each(tmp_path):
    # a "network diverges" paste: five finished bars and a sixth one half-way, no "Epoch N/M" lines
    row = "370784/370784 [==============================] - 6700s - loss: %.4f - acc: %.4f - val_loss: %.4f - val_acc: %.4f"
    loss = [1.8887, 1.9328, 1.9986, 2.0482, 2.1057]
    rows = [row % (v, 0.42 - 0.02 * i, 1.88 + 0.05 * i, 0.41 - 0.01 * i) for i, v in enumerate(loss)]
    rows.append("137856/370784 [==========>...................] - ETA: 4147s - loss: 2.1578 - acc: 0.3390")
    p = tmp_path / "keras.log"
    p.write_text("\n".join(rows) + "\n")
    out = _cli(p, "--final", "--json")
    d = json.loads(out.stdout)
    assert d["points"] == 6 and d["last_step"] == 5 * 370784 + 137856
    assert d["verdict"] == "STOP"  # every epoch worse than the last: read as six points, it diverges
    # with its headers the same bars read the same steps
    with_headers = []
    for i, r in enumerate(rows):
        with_headers += ["Epoch %d/30" % (i + 1), r]
    h = tmp_path / "headers.log"
    h.write_text("\n".join(with_headers) + "\n")
    assert json.loads(_cli(h, "--final", "--json").stdout)["last_step"] == d["last_step"]
