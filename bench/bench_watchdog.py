"""Watchdog overhead: 8 fake GPUs (fake NVML file), 8 running sleeping jobs that each hold a
stand-in GPU device fd and write a log, a real SQLite store, the real ``watchdog_hook.tick``.

Reports CPU seconds per tick (process CPU time, notifier thread included), the extrapolated
share of one core at the default 60 s interval (target < 1 %), and the max RSS of the process
running the ticks (target <= 60 MB). Run: python bench/bench_watchdog.py [--ticks N].
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpurun-bench-wd-"))
    gpus = [{"index": i, "uuid": "GPU-%d" % i, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:%02X:00.0" % i,
             "minor": i, "mem_total_mib": 81559, "mem_used_mib": 60000, "util_pct": 95, "temp_c": 70,
             "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "power_w": 650, "power_limit_w": 700,
             "throttle": ["sw_power_cap"], "ecc_volatile_uncorrected": 0, "xid": [], "processes": []}
            for i in range(args.gpus)]
    (work / "nvml.json").write_text(json.dumps({"driver": "550.54.15", "gpus": gpus}))
    dev = work / "dev"
    dev.mkdir()
    for i in range(args.gpus):
        (dev / ("nvidia%d" % i)).write_text("")
    os.environ["GPURUN_FAKE_NVML"] = str(work / "nvml.json")
    os.environ["GPURUN_FAKE_DEVICE_GLOB"] = str(dev / "nvidia*")

    from orchestrator.agent import watchdog_hook
    from orchestrator.agent.store import Store

    state = work / "state"
    state.mkdir()
    store = Store(str(state / "agent.db"))
    procs = []
    try:
        for i in range(args.gpus):
            jid = "job%d" % i
            run = state / "runs" / jid
            run.mkdir(parents=True)
            log = run / "log.txt"
            metrics = run / "metrics.jsonl"
            env = dict(os.environ, GPURUN_JOB_ID=jid, GPURUN_JOB_TOKEN="%s:1" % jid)
            # a job that logs a step every second, holding its GPU device open
            script = ('exec 3<"$1"; n=0; while :; do n=$((n+1)); echo "step $n loss=0.5" >> "$2"; '
                      'echo "{\\"step\\": $n, \\"loss\\": 0.5}" >> "$3"; sleep 1; done')
            p = subprocess.Popen(["/bin/sh", "-c", script, "sh", str(dev / ("nvidia%d" % i)), str(log), str(metrics)],
                                 env=env, start_new_session=True)
            procs.append(p)
            store.insert_jobs([{"id": jid, "name": jid, "command": "train", "gpus": 1, "run_dir": str(run),
                                "log": str(log), "metrics": str(metrics)}])
            store.transition(jid, ["queued"], "running", pid=p.pid, gpu_ids=[i], attempt=1,
                             started_at=time.time())
        ctx = SimpleNamespace(state_dir=str(state), store=store, runner=None,
                              config={"host": "bench", "expect_gpus": args.gpus})
        time.sleep(1.5)
        watchdog_hook.tick(ctx)  # warm-up: imports, probe open, first state
        cpu, wall = [], []
        for _ in range(args.ticks):
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            watchdog_hook.tick(ctx)
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            cpu.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
            wall.append(t1 - t0)
            time.sleep(0.05)
        findings = store.kv_get(watchdog_hook.FINDINGS_KEY)["findings"]
        mean_cpu = statistics.mean(cpu)
        n_procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
        print(json.dumps({
            "gpus": args.gpus, "running_jobs": len(procs), "ticks": args.ticks, "processes_on_host": n_procs,
            "cpu_s_per_tick_mean": round(mean_cpu, 5), "cpu_s_per_tick_max": round(max(cpu), 5),
            "wall_s_per_tick_median": round(statistics.median(wall), 5),
            "pct_of_one_core_at_60s": round(100.0 * mean_cpu / 60.0, 4),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "findings_last_tick": [f["code"] for f in findings],
        }, indent=2))
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        store.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
