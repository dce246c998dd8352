"""``gpurun watch --once --json`` over 20 SSH hosts (real sshd on loopback; needs root), target <= 3 s.

The hosts are 20 inventory entries on one loopback sshd (clean non-root user), each with its
own agent state dir; the first run ships and starts the agents and is reported separately.
Run: python bench/bench_watch.py [--repeat N] [--hosts N]. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


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
    from rigs.sshd import CLEAN_USER, SshdRig

    home = Path(tempfile.mkdtemp(prefix="gpurun-bench-watch-"))
    env = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"))
    os.environ.update(env)
    from orchestrator import hosts, paths

    rig = SshdRig()
    rig.start()
    cli = [sys.executable, "-m", "orchestrator.cli"]
    try:
        rig.trust(paths.data_home() / "known_hosts")
        for i in range(args.hosts):
            hosts.add_host(rig.host_entry(CLEAN_USER, name="w%02d" % i, label="w%02d" % i))
        first = run_watch(cli, env, args.hosts)  # ships the zipapp and starts 20 agents
        warm = [run_watch(cli, env, args.hosts) for _ in range(args.repeat)]
        print(json.dumps({"hosts": args.hosts, "first_run_s": round(first, 3),
                          "watch_once_json_median_s": round(statistics.median(warm), 3),
                          "watch_once_json_max_s": round(max(warm), 3), "repeat": args.repeat}, indent=2))
    finally:
        for root in (rig.home_of(CLEAN_USER), home):
            for pidfile in Path(root).rglob("agent.pid"):
                if rig.run_id in str(pidfile) or str(home) in str(pidfile):
                    try:
                        os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
                    except (OSError, ValueError):
                        pass
        rig.close()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
