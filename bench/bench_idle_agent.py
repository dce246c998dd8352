#!/usr/bin/env python3
"""What an idle local agent daemon costs: CPU and wake-ups per minute, nothing queued or running.

    python bench/bench_idle_agent.py [--seconds 30] [--rounds 2] [--repo PATH ...]

Each ``--repo`` is a checkout of gpurun (default: this one); its own CLI starts its own agent
(the zipapp is built from that checkout) in a throwaway home. The rounds interleave the repos
(A, B, A, B), so a before/after pair shares the machine's load. Wake-ups are the daemon's
voluntary context switches (``/proc/PID/status``): every sleep that ends, on a tick or a signal.
Prints one JSON document: per repo, each round's figures and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as fh:
        return dict(ln.split(":", 1) for ln in fh if ":" in ln)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(") ", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def one_round(repo: Path, seconds: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpurun-bench-idle-"))
    env = dict(os.environ, HOME=str(tmp), XDG_DATA_HOME=str(tmp / "data"), XDG_CONFIG_HOME=str(tmp / "cfg"),
               PYTHONPATH=str(repo))
    cli = [sys.executable, "-m", "orchestrator.cli"]
    q = tmp / "q.txt"
    q.write_text("[name=one] true\n")
    res = subprocess.run(cli + ["queue", "submit", str(q), "--wait"], env=env, cwd=str(repo),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    pid = int(next((tmp / "data").rglob("agent.pid")).read_text())
    time.sleep(6)  # past the first notify and autostop looks: the steady idle state
    c0, v0, w0 = _cpu_s(pid), int(_status(pid)["voluntary_ctxt_switches"]), time.time()
    time.sleep(seconds)
    c1, v1, w1 = _cpu_s(pid), int(_status(pid)["voluntary_ctxt_switches"]), time.time()
    subprocess.run(cli + ["agent", "stop", "--yes"], env=env, cwd=str(repo), capture_output=True)
    return {"cpu_pct": round(100 * (c1 - c0) / (w1 - w0), 3), "wakes_per_min": round(60 * (v1 - v0) / (w1 - w0), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repo", action="append", default=[])
    a = ap.parse_args()
    repos = [Path(r).resolve() for r in (a.repo or [Path(__file__).resolve().parents[1]])]
    out: dict = {str(r): {"rounds": []} for r in repos}
    for _ in range(a.rounds):
        for r in repos:
            out[str(r)]["rounds"].append(one_round(r, a.seconds))
    for r in out.values():
        for k in ("cpu_pct", "wakes_per_min"):
            r[k + "_median"] = statistics.median(x[k] for x in r["rounds"])
    out["load"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
