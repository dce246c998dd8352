"""Speed and score of the training-quality check (issue 7).

    python bench/bench_quality.py [--quick] [--no-tb-compare] [--keep DIR]

Measures: cold check (read + judge) of a 1M-line JSONL file and a 1M-line mixed text log,
an incremental check after 1,000 appended lines, a ~500 MB TensorBoard file (time + peak
RSS, in a child process) next to TensorBoard's EventAccumulator when it is importable, and
the checker's score on the real curves and the seeded synthetic set. --quick shrinks sizes 10x.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from orchestrator.quality.judge import judge  # noqa: E402
from orchestrator.quality.sources import Tracker  # noqa: E402
from orchestrator.quality import tfevents as T  # noqa: E402


def gen_jsonl(path: str, n: int) -> None:
    rng = random.Random(1)
    with open(path, "w") as f:
        for i in range(n):
            f.write('{"step": %d, "loss": %.6f, "lr": %.3e, "grad_norm": %.4f, "tokens_per_s": %.1f}\n'
                    % (i, 2 + 8 * (i + 100) ** -0.4 * math.exp(rng.gauss(0, 0.03)), 3e-4, 1 + rng.random(),
                       50000 + rng.random() * 100))


def gen_text(path: str, n: int, mixed: bool = True) -> None:
    """mixed: nanoGPT iter lines, HF dict lines, tqdm bars, Megatron lines and noise interleaved
    (a worst case: no real script prints all of these); else one script's log: 98% iter lines,
    1% eval lines, 1% noise."""
    rng = random.Random(2)
    with open(path, "w") as f:
        for i in range(n):
            loss = 2 + 8 * (i + 100) ** -0.4 * math.exp(rng.gauss(0, 0.03))
            k = i % 10 if mixed else (0 if i % 100 > 1 else 9 if i % 100 else -1)
            if k == -1:
                f.write("step %d: train loss %.4f, val loss %.4f\n" % (i, loss, loss * 1.02))
                continue
            if k < 5:
                f.write("iter %d: loss %.4f, time %.2fms, mfu 41.2%%\n" % (i, loss, 100 + rng.random()))
            elif k < 7:
                f.write("{'loss': %.4f, 'grad_norm': %.3f, 'learning_rate': %.6e, 'epoch': %.2f}\n"
                        % (loss, 1 + rng.random(), 3e-4, i / 1e5))
            elif k < 8:
                f.write(" 24%%|##4       | %d/%d [3:15:13<10:06:35,  4.59s/it]\n" % (i, n))
            elif k < 9:
                f.write(" iteration %8d/ %d | elapsed time per iteration (ms): 573.8 | learning rate: 5.948E-05 |"
                        " lm loss: %.6E | loss scale: 65536.0 | grad norm: 1.234 |\n" % (i, n, loss))
            else:
                f.write("2024-01-01 12:00:00 INFO saving shard %d of the dataset cache\n" % i)


def gen_tfevents(path: str, target_mb: int) -> None:
    """3 scalars per step plus one 30 KB image-like record every 300 steps, up to target_mb."""
    rng = random.Random(3)
    image = b"\x08\x64\x10\x64\x18\x03" + T._ld(4, os.urandom(30000))  # Summary.Image, 30 KB "PNG"
    img = T.encode_record(b"\x09" + b"\x00" * 8 + b"\x10\x01" + T._ld(5, T._ld(1, T._ld(1, b"samples") + T._ld(4, image))))
    with open(path, "wb") as f:
        f.write(T.encode_record(T.encode_event(0, 1.7e9, [], file_version="brain.Event:2")))
        step = 0
        while f.tell() < target_mb * 1_000_000:
            buf = []
            for _ in range(3000):
                step += 1
                loss = 2 + 8 * (step + 100) ** -0.4 * math.exp(rng.gauss(0, 0.03))
                for tag, v in (("train/loss", loss), ("train/lr", 3e-4), ("train/grad_norm", 1.0)):
                    buf.append(T.encode_record(T.encode_event(step, 1.7e9 + step, [(tag, v)])))
                if step % 300 == 0:
                    buf.append(img)
            f.write(b"".join(buf))


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def cold_check(path: str):
    def go():
        tr = Tracker([path])
        run = tr.update()
        return tr, run, judge(run, {})
    return timed(go)


def child_tb(path: str, which: str) -> dict:
    """Run one TB reader in a fresh process so its peak RSS is its own."""
    code = r"""
import json, resource, sys, time
sys.path.insert(0, %r)
t = time.perf_counter()
if %r == "gpurun":
    from orchestrator.quality.sources import Tracker
    from orchestrator.quality.judge import judge
    run = Tracker([%r]).update(); v = judge(run, {}); n = len(run.get("loss"))
else:
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(%r, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.IMAGES: 0})
    acc.Reload(); n = len(acc.Scalars("train/loss"))
s = time.perf_counter() - t
# VmHWM: this process's own peak (ru_maxrss would carry the parent's peak across fork+exec)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")]
rss = int(hwm[0].split()[1]) / 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": s, "rss_mb": rss, "points": n}))
""" % (ROOT, which, path, path)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "exit %d" % p.returncode}
    return json.loads(p.stdout.strip().splitlines()[-1])


def score_real() -> dict:
    from quality.conftest import CURVES, labelled
    if not (CURVES / "labels.json").is_file():
        return {"skipped": "no shared/curves"}
    res = {"NOT_STOP": [0, 0], "STOP": [0, 0], "latency_steps": [], "ambiguous": {}}
    for it in labelled(CURVES):
        run = Tracker([str(CURVES / it["file"])]).update()
        main = run.main_loss()
        seq, first = "", None
        for k in range(1, 21):
            step = main.steps[max(0, len(main) * k // 20 - 1)]
            v = judge(run.upto(step), {})
            seq += v["verdict"][0]
            if v["verdict"] == "STOP" and first is None:
                first = step
        exp = it["expected_final"]
        if exp == "AMBIGUOUS":
            res["ambiguous"][it["file"]] = seq
            continue
        ok = ("S" not in seq) if exp == "NOT_STOP" else (first is not None and first >= it["onset"])
        res[exp][0] += ok
        res[exp][1] += 1
        if exp == "STOP" and first is not None:
            res["latency_steps"].append([it["file"], first - it["onset"], seq.index("S") + 1])
    return res


def score_synthetic(seeds: int) -> dict:
    from quality.synth import CLASSES, FORMATS, LACKS, NEEDS, make_curve, write
    from quality.test_synthetic import score
    tmp = tempfile.mkdtemp(prefix="gpurun-synth-")
    per = {}
    lat = []
    for cls in CLASSES:
        ok = tot = 0
        for seed in range(seeds):
            c = make_curve(cls, 100 + seed)
            for fmt in FORMATS:
                r = score(c, write(c, fmt, os.path.join(tmp, cls, str(seed), fmt)))
                good = ("S" in r["seq"]) == (c["expect"] == "STOP")
                if c["expect"] == "STOP" and r["first_stop"] is not None:
                    good = good and r["first_stop"] >= 0.9 * c["onset"]
                    lat.append(r["first_stop"] - c["onset"])
                need = NEEDS.get(cls)
                if c["finding"] and not (need and need in LACKS.get(fmt, ())):
                    good = good and c["finding"] in r["codes"]
                ok += good
                tot += 1
        per[cls] = [ok, tot]
    lat.sort()
    return {"per_class": per, "latency_steps_median": lat[len(lat) // 2] if lat else None,
            "latency_steps_p90": lat[int(len(lat) * 0.9)] if lat else None, "formats": list(FORMATS)}


def append_jsonl(path: str, a: int, b: int) -> None:
    """Append the steady records of steps [a, b) (the incremental check's new lines)."""
    with open(path, "a") as f:
        for i in range(a, b):
            f.write('{"step": %d, "loss": 2.1, "lr": 3e-4, "grad_norm": 1.1, "tokens_per_s": 50000}\n' % i)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-tb-compare", action="store_true")
    ap.add_argument("--keep", help="directory for the generated files (reused when present)")
    a = ap.parse_args()
    scale = 10 if a.quick else 1
    d = a.keep or tempfile.mkdtemp(prefix="gpurun-bench-")
    os.makedirs(d, exist_ok=True)
    n = 1_000_000 // scale
    out = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "lines": n}

    jl = os.path.join(d, "metrics_%d.jsonl" % n)
    if not os.path.exists(jl):
        gen_jsonl(jl, n)
    s, (tr, run, v) = cold_check(jl)
    out["jsonl_cold_s"] = round(s, 3)
    out["jsonl_mb"] = round(os.path.getsize(jl) / 1e6, 1)
    append_jsonl(jl, n, n + 1000)  # incremental: 1,000 new lines, then read + judge
    inc = []
    for rep in range(5):
        t = time.perf_counter()
        run = tr.update()
        judge(run, {})
        inc.append(time.perf_counter() - t)
        append_jsonl(jl, n + 1000 * (rep + 1), n + 1000 * (rep + 2))
    out["incremental_1000_lines_ms"] = round(sorted(inc)[len(inc) // 2] * 1000, 2)
    os.remove(jl)  # it grew; regenerate next time

    tl = os.path.join(d, "train_%d.log" % n)
    if not os.path.exists(tl):
        gen_text(tl, n)
    s, (_, run, v) = cold_check(tl)
    out["text_cold_s"] = round(s, 3)
    out["text_mb"] = round(os.path.getsize(tl) / 1e6, 1)
    out["text_loss_points"] = len(run.get("loss"))
    th = os.path.join(d, "train_single_%d.log" % n)
    if not os.path.exists(th):
        gen_text(th, n, mixed=False)
    s, (_, run, v) = cold_check(th)
    out["text_single_script_cold_s"] = round(s, 3)
    out["text_single_script_mb"] = round(os.path.getsize(th) / 1e6, 1)

    tb = os.path.join(d, "events.out.tfevents.%d.bench" % (500 // scale))
    if not os.path.exists(tb):
        t = time.perf_counter()
        gen_tfevents(tb, 500 // scale)
        out["tb_generate_s"] = round(time.perf_counter() - t, 1)
    out["tb_mb"] = round(os.path.getsize(tb) / 1e6, 1)
    out["tb_gpurun"] = child_tb(tb, "gpurun")
    if not a.no_tb_compare:
        try:
            import tensorboard  # noqa: F401
            out["tb_event_accumulator"] = child_tb(tb, "tensorboard")
        except ImportError:
            out["tb_event_accumulator"] = "skipped: tensorboard not installed"

    out["score_real"] = score_real()
    out["score_synthetic"] = score_synthetic(2 if a.quick else 5)
    out["bench_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
