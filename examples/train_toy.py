#!/usr/bin/env python3
"""A small but real training loop for trying gpurun without a GPU (numpy only).

It fits a two-layer MLP to a synthetic regression task with SGD + momentum and a warmup/cosine
learning-rate schedule, logs one JSON line per step to ``$GPURUN_RUN_DIR/metrics.jsonl``
(step, loss, lr, grad_norm, throughput), writes checkpoints atomically (temp file, fsync,
rename) and resumes from the newest one. Too high a learning rate makes it genuinely diverge
(the loss grows to inf and NaN), which is what gpurun's quality check is there to catch.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import time

import numpy as np


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--step-time", type=float, default=0.005, help="seconds to sleep per step (simulated work)")
    p.add_argument("--run-dir", default=os.environ.get("GPURUN_RUN_DIR", "runs/toy"))
    return p.parse_args()


def lr_at(step: int, a: argparse.Namespace) -> float:
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    frac = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def save_checkpoint(ckpt_dir: str, step: int, params: dict) -> str:
    os.makedirs(ckpt_dir, exist_ok=True)
    final = os.path.join(ckpt_dir, "step_%06d.npz" % step)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, step=np.array(step), **params)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def latest_checkpoint(ckpt_dir: str) -> str | None:
    found = sorted(glob.glob(os.path.join(ckpt_dir, "step_*.npz")))
    return found[-1] if found else None


def main() -> int:
    a = parse()
    rng = np.random.default_rng(a.seed)
    d_in = 16
    true_w = rng.normal(size=(d_in, 1))
    params = {
        "w1": rng.normal(scale=1 / math.sqrt(d_in), size=(d_in, a.hidden)),
        "b1": np.zeros(a.hidden),
        "w2": rng.normal(scale=1 / math.sqrt(a.hidden), size=(a.hidden, 1)),
        "b2": np.zeros(1),
    }
    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    ckpt_dir = os.path.join(a.run_dir, "checkpoints")
    start = 0
    ck = latest_checkpoint(ckpt_dir)
    if ck:
        with np.load(ck) as z:
            start = int(z["step"]) + 1
            params = {k: z[k] for k in params}
        print("resumed from %s at step %d" % (ck, start), flush=True)
    os.makedirs(a.run_dir, exist_ok=True)
    metrics = open(os.path.join(a.run_dir, "metrics.jsonl"), "a")
    np.seterr(all="ignore")  # divergence must show up as inf/nan in the metrics, not as a crash
    if start >= a.steps:
        # a finished run started again (`gpurun queue retry` of a succeeded job): its newest
        # checkpoint is the last step, so there is nothing left to train
        print("done: already trained to step %d of %d; nothing to do" % (start, a.steps), flush=True)
        metrics.close()
        return 0
    for step in range(start, a.steps):
        t0 = time.perf_counter()
        x = rng.normal(size=(a.batch, d_in))
        y = np.tanh(x @ true_w) + 0.05 * rng.normal(size=(a.batch, 1))
        h = np.maximum(0, x @ params["w1"] + params["b1"])
        pred = h @ params["w2"] + params["b2"]
        err = pred - y
        loss = float(np.mean(err ** 2))
        g_pred = 2 * err / a.batch
        grads = {"w2": h.T @ g_pred, "b2": g_pred.sum(0)}
        g_h = (g_pred @ params["w2"].T) * (h > 0)
        grads["w1"] = x.T @ g_h
        grads["b1"] = g_h.sum(0)
        gnorm = float(math.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
        lr = lr_at(step, a)
        for k in params:
            velocity[k] = 0.9 * velocity[k] + grads[k]
            params[k] = params[k] - lr * velocity[k]
        if a.step_time:
            time.sleep(a.step_time)
        dt = time.perf_counter() - t0
        rec = {"step": step, "loss": loss, "lr": lr, "grad_norm": gnorm, "throughput": a.batch / dt}
        metrics.write(json.dumps(rec) + "\n")
        metrics.flush()
        if step % 25 == 0:
            print("step %d loss %.5g lr %.3g grad_norm %.3g" % (step, loss, lr, gnorm), flush=True)
        if (step + 1) % a.ckpt_every == 0 or step == a.steps - 1:
            save_checkpoint(ckpt_dir, step, params)
    metrics.close()
    print("done: %d steps, final loss %.5g" % (a.steps, loss), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
