"""Seeded generator of labelled training curves, written in every format the checker reads.

Curves are built in log space (power-law decay + heavy-tailed AR(1) noise) and carry their
ground truth: ``expect`` ("STOP" | "NOT_STOP"), ``onset`` step, and ``finding`` (a code the
checker must report for classes that are signals rather than stops).
"""

from __future__ import annotations

import json
import math
import os
import random
from typing import Dict, List, Optional, Tuple

from orchestrator.quality.series import Run
from orchestrator.quality.tfevents import write_scalars
from orchestrator.quality.wandb_reader import WandbWriter

CLASSES = ("healthy", "benign_spike", "divergence", "nan", "plateau", "lr_bug", "throughput_drop", "resumed")
FORMATS = ("jsonl", "csv", "hf_log", "trainer_state", "nanogpt_log", "tfevents", "tfevents_tensor", "wandb")
EXPECT = {"healthy": "NOT_STOP", "benign_spike": "NOT_STOP", "divergence": "STOP", "nan": "STOP",
          "plateau": "STOP", "lr_bug": "NOT_STOP", "throughput_drop": "NOT_STOP", "resumed": "NOT_STOP"}
FINDING = {"lr_bug": "lr_flat", "throughput_drop": "throughput_drop"}
# the series a format cannot carry: a signal class is only scored where its series exists
LACKS = {"nanogpt_log": {"lr", "grad_norm"}, "hf_log": {"throughput"}, "trainer_state": {"throughput"}}
NEEDS = {"lr_bug": "lr", "throughput_drop": "throughput"}

Row = Tuple[int, Dict[str, float]]


def _noise(rng: random.Random, n: int, sigma: float, phi: float) -> List[float]:
    out, e = [], 0.0
    for _ in range(n):
        # Student-t(4)-like heavy tails: a normal over the root of a scaled chi-square
        chi = sum(rng.gauss(0, 1) ** 2 for _ in range(4)) / 4
        innov = rng.gauss(0, 1) / math.sqrt(max(chi, 1e-3)) / math.sqrt(2.0)
        e = phi * e + math.sqrt(1 - phi * phi) * innov
        out.append(sigma * e)
    return out


def make_curve(cls: str, seed: int, n_logs: int = 400, every: int = 10) -> dict:
    """One labelled curve: {"cls", "rows": [(step, {key: value})], "expect", "onset", ...}."""
    rng = random.Random("%s-%d" % (cls, seed))
    alpha, linf = rng.uniform(0.3, 0.8), rng.uniform(0.5, 3.0)
    l0 = rng.uniform(max(linf * 1.5, 2.0), 12.0)
    t0 = rng.uniform(20, 200)
    amp = (l0 - linf) * t0 ** alpha
    noise = _noise(rng, n_logs, rng.uniform(0.005, 0.05), rng.uniform(0.0, 0.6))
    peak, warm = 3e-4 * rng.uniform(0.3, 3), 0.05 * n_logs * every
    total = n_logs * every
    onset: Optional[int] = None
    rows: List[Row] = []
    spike_at = int(n_logs * rng.uniform(0.3, 0.8))
    div_at = int(n_logs * rng.uniform(0.45, 0.7))
    nan_at = int(n_logs * rng.uniform(0.3, 0.9))
    drop_at = int(n_logs * rng.uniform(0.5, 0.8))
    doubling = rng.uniform(5, 25)  # logs
    for i in range(n_logs):
        step = (i + 1) * every
        base = linf + amp * (step + t0) ** (-alpha)
        if cls == "plateau":
            base = l0
        u = math.log(base) + noise[i]
        if cls == "benign_spike" and spike_at <= i < spike_at + rng.choice((1, 1, 2, 3)):
            u += math.log(rng.uniform(2, 50))
        if cls == "divergence" and i >= div_at:
            u += math.log(2) * (i - div_at) / doubling
        lr = peak * min(1.0, step / warm) * (0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))
        if cls == "lr_bug":
            lr = peak
        loss = math.exp(u)
        if cls == "nan" and i >= nan_at:
            loss = float("nan")
        tput = 50000 * (1 + 0.02 * rng.gauss(0, 1))
        if cls == "throughput_drop" and i >= drop_at:
            tput *= rng.uniform(0.3, 0.6)
        rows.append((step, {"loss": loss, "lr": lr, "grad_norm": 1.0 + 0.1 * abs(rng.gauss(0, 1)),
                            "tokens_per_s": tput}))
    if cls == "divergence":
        onset = (div_at + int(math.ceil(doubling * math.log2(1.5))) + 1) * every  # 1.5x its pre-onset level
    elif cls == "nan":
        onset = (nan_at + 1) * every
    elif cls == "plateau":  # no learning is unambiguous after min(3000 steps, 10% of the run)
        onset = min(3000, total // 10)
    if cls == "resumed":  # crash at 75%, restart from the checkpoint at 50%: the steps rewind
        cut, back = int(n_logs * 0.75), int(n_logs * 0.5)
        rows = rows[:cut] + rows[back:]
    return {"cls": cls, "seed": seed, "rows": rows, "expect": EXPECT[cls], "onset": onset,
            "finding": FINDING.get(cls), "lr_schedule": "cosine" if cls == "lr_bug" else None}


def _fmt(v: float) -> str:
    return "nan" if v != v else repr(v)


def write(curve: dict, fmt: str, d: str) -> str:
    """Write ``curve`` in ``fmt`` under ``d``; returns the path to check."""
    os.makedirs(d, exist_ok=True)
    rows: List[Row] = curve["rows"]
    if fmt == "jsonl":
        p = os.path.join(d, "metrics.jsonl")
        with open(p, "w") as f:
            for step, v in rows:
                f.write(json.dumps(dict(step=step, **v)) + "\n")
    elif fmt == "csv":
        p = os.path.join(d, "metrics.csv")
        with open(p, "w") as f:
            f.write("epoch,step,train_loss_step,lr-AdamW,throughput,grad_norm\n")
            for step, v in rows:
                f.write("0,%d,%s,%s,%s,%s\n" % (step, _fmt(v["loss"]), v["lr"], v["tokens_per_s"], v["grad_norm"]))
    elif fmt == "hf_log":
        p = os.path.join(d, "log.txt")
        with open(p, "w") as f:
            for i, (step, v) in enumerate(rows):
                f.write(" %d%%|##   | %d/%d [01:02<03:04,  1.5it/s]\r" % (i % 100, step, rows[-1][0]))
                f.write("{'loss': %s, 'grad_norm': %s, 'learning_rate': %s, 'epoch': %.2f}\n"
                        % (_fmt(v["loss"]), v["grad_norm"], v["lr"], step / 1000.0))
    elif fmt == "trainer_state":
        p = os.path.join(d, "trainer_state.json")
        hist = [{"step": s, "epoch": s / 1000.0, "loss": v["loss"], "learning_rate": v["lr"],
                 "grad_norm": v["grad_norm"]} for s, v in rows]
        with open(p, "w") as f:
            json.dump({"global_step": rows[-1][0], "max_steps": 0, "log_history": hist}, f)
    elif fmt == "nanogpt_log":
        p = os.path.join(d, "train.log")
        with open(p, "w") as f:
            for step, v in rows:
                f.write("iter %d: loss %s, time %.2fms, mfu 40.1%%\n" % (step, _fmt(v["loss"]), 4e6 / v["tokens_per_s"]))
    elif fmt in ("tfevents", "tfevents_tensor"):
        p = os.path.join(d, "events.out.tfevents.1700000000.host.1.0")
        write_scalars(p, [(s, [("train/loss", v["loss"]), ("train/learning_rate", v["lr"]),
                               ("train/grad_norm", v["grad_norm"]), ("tokens_per_s", v["tokens_per_s"])])
                          for s, v in rows], tensor_style=fmt == "tfevents_tensor")
    elif fmt == "wandb":
        p = os.path.join(d, "run-abc123.wandb")
        w = WandbWriter(p)
        w.run_record()
        for step, v in rows:
            w.history(step, {"train/loss": v["loss"], "lr": v["lr"], "grad_norm": v["grad_norm"],
                             "tokens_per_s": v["tokens_per_s"]})
        w.close()
    else:
        raise ValueError(fmt)
    return p


CASE_FORMATS = ("jsonl", "trainer_state", "csv", "console")


def write_rows(rows: List[Row], fmt: str, d: str, planned: Optional[int] = None) -> str:
    """Write sparse rows {loss, lr, eval_loss} (any subset per row) in one of ``CASE_FORMATS``:
    JSONL, HF ``trainer_state.json`` (evals as their own entries), Lightning ``metrics.csv``
    (sparse columns) or a console log (``step N/M | key value`` lines)."""
    os.makedirs(d, exist_ok=True)
    planned = planned or rows[-1][0]
    keys = ("loss", "lr", "eval_loss")
    if fmt == "jsonl":
        p = os.path.join(d, "metrics.jsonl")
        with open(p, "w") as f:  # evals on their own line, as trainers log them
            for step, v in rows:
                train = {k: v[k] for k in ("loss", "lr") if k in v}
                if train:
                    f.write(json.dumps(dict(step=step, **train)) + "\n")
                if "eval_loss" in v:
                    f.write(json.dumps({"step": step, "eval_loss": v["eval_loss"]}) + "\n")
    elif fmt == "trainer_state":
        p = os.path.join(d, "trainer_state.json")
        hist = []
        for step, v in rows:
            train = {("learning_rate" if k == "lr" else k): v[k] for k in ("loss", "lr") if k in v}
            if train:
                hist.append(dict(train, step=step, epoch=step / 1000.0))
            if "eval_loss" in v:
                hist.append({"eval_loss": v["eval_loss"], "step": step, "epoch": step / 1000.0})
        with open(p, "w") as f:
            json.dump({"global_step": rows[-1][0], "max_steps": planned, "log_history": hist}, f)
    elif fmt == "csv":
        p = os.path.join(d, "metrics.csv")
        with open(p, "w") as f:
            f.write("epoch,step,train_loss_step,lr-AdamW,val_loss\n")
            for step, v in rows:
                f.write("0,%d,%s\n" % (step, ",".join(_fmt(v[k]) if k in v else "" for k in keys)))
    elif fmt == "console":
        p = os.path.join(d, "train.log")
        with open(p, "w") as f:
            for step, v in rows:
                if "loss" in v:
                    f.write("step %d/%d | loss %s | lr %s\n" % (step, planned, _fmt(v["loss"]), _fmt(v.get("lr", 0.0))))
                if "eval_loss" in v:
                    f.write("step %d/%d | val_loss %s\n" % (step, planned, _fmt(v["eval_loss"])))
    else:
        raise ValueError(fmt)
    return p


CASES = ("absurd_frozen", "absurd_from_start", "nan_mid", "tiny_noisy_eval_improving", "jump_and_stay",
         "steady_triple", "lr_zero_mid", "flat_from_start", "converged_finetune")


def make_case(name: str, seed: int = 0) -> dict:
    """One of the curves users reported the checker got wrong (issue 11), every 10 steps:
    {"rows", "expect" (STOP | NOT_STOP | WAIT), "start" (row where it goes bad), "onset" (row where
    it is unambiguous: x1.5 for a slow climb; latency is counted from there)}."""
    rng = random.Random("case-%s-%d" % (name, seed))
    sizes = {"absurd_frozen": 150, "absurd_from_start": 60, "flat_from_start": 150, "converged_finetune": 800}
    n = sizes.get(name, 400)
    eps = _noise(rng, n, 0.35 if name == "tiny_noisy_eval_improving" else 0.01 if name in (
        "flat_from_start", "converged_finetune") else rng.uniform(0.01, 0.04), 0.0 if name in (
        "tiny_noisy_eval_improving", "converged_finetune") else rng.uniform(0.0, 0.5))
    l0, linf = rng.uniform(4.0, 8.0), rng.uniform(1.0, 2.5)
    jump = rng.uniform(3.0, 6.0)
    rows: List[Row] = []
    onset, expect, start = None, "STOP", None
    for i in range(n):
        step = (i + 1) * 10
        base = linf + (l0 - linf) * (1 + i / 20.0) ** -0.7
        lr = 3e-4 * min(1.0, (i + 1) / 20.0) * 0.5 * (1 + math.cos(math.pi * i / n))
        v: Dict[str, float] = {}
        if name == "absurd_frozen":
            onset = 100
            loss = 3.8e25 if i >= onset else base * math.exp(eps[i])
        elif name == "absurd_from_start":
            onset, loss = 0, 3.8e25
        elif name == "nan_mid":
            onset = 200
            loss = float("nan") if i >= onset else base * math.exp(eps[i])
        elif name == "tiny_noisy_eval_improving":  # 1.0 -> 0.05 by row 150, flat, 0.05 -> 0.09 from row 300
            expect = "NOT_STOP"
            level = 0.05 * 20 ** max(0.0, 1 - i / 150.0) * (0.09 / 0.05) ** min(1.0, max(0.0, (i - 300) / 80.0))
            loss = level * math.exp(eps[i])
            if i % 20 == 19:
                v["eval_loss"] = 0.8 - 0.2 * i / n
        elif name == "jump_and_stay":  # x3-6 at row 200, then flat at the new level
            onset = 200
            loss = (base if i < onset else jump * (linf + (l0 - linf) * (1 + onset / 20.0) ** -0.7)) * math.exp(eps[i])
        elif name == "steady_triple":  # x3 over 200 logged points from row 200
            loss = base * 3 ** max(0.0, (i - 200) / 200.0) * math.exp(eps[i])
            start, onset = 200, 200 + int(math.ceil(200 * math.log(1.5) / math.log(3)))  # x1.5: unambiguous
        elif name == "lr_zero_mid":  # LR 0 from row 200; the loss stops moving
            onset = 200
            if i >= onset:
                lr = 0.0
            loss = linf + (l0 - linf) * (1 + min(i, onset) / 20.0) ** -0.7
            loss *= math.exp(eps[i])
        elif name == "flat_from_start":
            expect, loss = "WAIT", 3.7 * math.exp(eps[i])
        elif name == "converged_finetune":  # low, flat, creeping down 2% over the run
            expect, loss = "NOT_STOP", 0.35 * (1 - 0.02 * i / n) * math.exp(eps[i])
        else:
            raise ValueError(name)
        v.update(loss=loss, lr=lr)
        rows.append((step, v))
    return {"name": name, "rows": rows, "expect": expect, "onset": onset,
            "start": start if name == "steady_triple" else onset}


def run_of(rows: List[Dict[str, float]], every: int = 1) -> Run:
    """A real ``Run`` of one record per row, at steps 0, every, 2 * every, ..."""
    r = Run("mem")
    for i, row in enumerate(rows):
        r.add_record(i * every, list(row.items()))
    return r


def stop_codes(v: dict) -> List[str]:
    """The codes of a verdict's STOP findings, in the judge's order."""
    return [str(f["code"]) for f in v["findings"] if f["severity"] == "stop"]
