#!/usr/bin/env python3
"""Foundation figures (issue 2), measured on the local host in a throwaway XDG home.

    python bench/bench_queue.py [--jobs 1000] [--gap-jobs 30]

* submit of an N-line queue (wall, cold CLI);
* gap between one job ending and the next starting on a free slot (median, p90);
* ``gpurun queue status --json`` with N jobs in the store (wall, cold CLI);
* ``gpurun --help`` cold;
* idle agent RSS and CPU over a 20 s window.
Prints one JSON document; docs/BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cli(env: dict, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    res = subprocess.run(["gpurun", *args], env=env, capture_output=True, text=True)
    return time.perf_counter() - t, res


def median_of(env: dict, n: int, *args: str) -> float:
    return statistics.median(cli(env, *args)[0] for _ in range(n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--gap-jobs", type=int, default=30)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpurun-bench-"))
    env = dict(os.environ, XDG_DATA_HOME=str(tmp / "data"), XDG_CONFIG_HOME=str(tmp / "cfg"))
    out: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}

    out["help_cold_s"] = median_of(env, 7, "--help")
    # warm the agent zipapp cache and daemon, so "submit" measures the submit itself
    cli(env, "queue", "status", "--json")

    q = tmp / "big.txt"
    q.write_text("".join(f"[name=job-{i:05d}] sleep 1000 # {i}\n" for i in range(a.jobs)))
    # slots=1 and a long first job: the store fills up without starting 1,000 processes
    t, res = cli(env, "queue", "submit", str(q))
    assert res.returncode == 0, res.stderr
    out["submit_%d_s" % a.jobs] = t
    t2, _ = cli(env, "queue", "submit", str(q))
    out["resubmit_%d_noop_s" % a.jobs] = t2
    out["status_json_%d_jobs_s" % a.jobs] = median_of(env, 5, "queue", "status", "--json")
    cli(env, "queue", "cancel", "--all", "--yes")

    # idle agent: no queued or running work
    time.sleep(2)
    state = tmp / "data/gpurun/hosts/local/agent"
    pid = int((state / "agent.pid").read_text())

    def cpu_s() -> float:
        f = open(f"/proc/{pid}/stat").read().split(") ")[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    c0, w0 = cpu_s(), time.time()
    time.sleep(20)
    c1, w1 = cpu_s(), time.time()
    rss_kb = next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS"))
    out["idle_agent_cpu_pct"] = 100 * (c1 - c0) / (w1 - w0)
    out["idle_agent_rss_mb"] = rss_kb / 1024

    # gap: N short jobs on one slot; gap = start(k+1) - end(k) as recorded by the jobs themselves
    ledger = tmp / "ledger"
    gq = tmp / "gap.txt"
    gq.write_text("".join(
        f"[name=gap-{i:03d}] python3 -c \"import time;print('s',time.time())\" >> {ledger}; "
        f"sleep 0.2; python3 -c \"import time;print('e',time.time())\" >> {ledger}\n" for i in range(a.gap_jobs)))
    t, res = cli(env, "queue", "submit", str(gq), "--wait", "--slots", "1")
    assert res.returncode == 0, res.stderr
    rows = [l.split() for l in ledger.read_text().splitlines()]
    starts = [float(v) for k, v in rows if k == "s"]
    ends = [float(v) for k, v in rows if k == "e"]
    gaps = sorted(s - e for s, e in zip(starts[1:], ends[:-1]))
    out["gap_median_s"] = statistics.median(gaps)
    out["gap_p90_s"] = gaps[int(0.9 * (len(gaps) - 1))]
    try:
        os.kill(int((state / "agent.pid").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
