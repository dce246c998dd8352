"""``gpurun watch --once --json`` over 20 SSH hosts (real sshd on loopback; needs root), target <= 3 s.

The hosts are 20 inventory entries on one loopback sshd (clean non-root user), each with its
own agent state dir; the first run ships and starts the agents and is reported separately.
Run: python bench/bench_watch.py [--repeat N] [--hosts N]. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_ssh import start_loopback_hosts, stop_loopback_hosts  # noqa: E402  (one loopback setup for both)


def run_watch(cli: list, env: dict, n_hosts: int) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cli + ["watch", "--once", "--json"], env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit("watch failed: " + res.stderr.strip()[-400:])
    doc = json.loads(res.stdout)
    bad = [h for h in doc["hosts"] if not h["ok"]]
    if len(doc["hosts"]) != n_hosts or bad:
        raise SystemExit("watch answered for %d hosts, %d failed: %s" % (len(doc["hosts"]), len(bad), bad[:1]))
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=20)
    args = ap.parse_args()
    home, env, rig, cli = start_loopback_hosts("gpurun-bench-watch-", ["w%02d" % i for i in range(args.hosts)])
    try:
        first = run_watch(cli, env, args.hosts)  # ships the zipapp and starts 20 agents
        warm = [run_watch(cli, env, args.hosts) for _ in range(args.repeat)]
        print(json.dumps({"hosts": args.hosts, "first_run_s": round(first, 3),
                          "watch_once_json_median_s": round(statistics.median(warm), 3),
                          "watch_once_json_max_s": round(max(warm), 3), "repeat": args.repeat}, indent=2))
    finally:
        stop_loopback_hosts(rig, home)


if __name__ == "__main__":
    main()
