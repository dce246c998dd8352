#!/usr/bin/env python3
"""Issue 15 (items 3, 4, 5): cost of a job start and of ``queue status`` with a backlog.

    python bench/bench_backlog.py [--sizes 1000,10000,50000] [--gap-jobs 20] [--no-tsp] [--exec-wrapper]
                                  [--job shell|plain|both] [--gap-only]

For each backlog size N, in a throwaway XDG home on the ``local`` host with one slot:

* N queued rows are inserted straight through the agent's ``Store`` (fast), behind
  ``--gap-jobs`` short jobs, so every one of those starts with the whole backlog queued;
* gap: a job's end to the next job's start on the free slot, as the jobs record it
  (``date +%s.%N``: no interpreter start in the figure), median and p90;
* agent CPU per job start: the daemon's ``/proc/PID/stat`` ticks over the gap run / starts;
* ``gpurun queue status --json``, ``status`` piped, and ``status`` on a "terminal"
  (``TTY_COMPATIBLE=1 COLUMNS=120``), cold CLI, median of 3, output thrown away.

With task-spooler installed (``tsp``, found on PATH), its gap on the same job lines is measured
too, interleaved: right before each size, so both see the same load on a shared box (the floor
of a queue that starts jobs from a C daemon). ``--exec-wrapper`` runs the agent with
``GPURUN_EXEC_WRAPPER=1`` (the wrapper exec'd as a second Python, as before ``agent/spawn``),
for a before/after in one run. ``--job plain`` runs the same job as a script named by a plain
command line (``/tmp/.../gapjob LEDGER``: the runner spawns it without ``bash -c``, see
``agent/jobwrap``; task-spooler runs the same line), ``--job both`` measures both kinds.
``--gap-only`` skips the status timings. Prints one JSON document.
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
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


ALL_FLAG = False


def cli(env: dict, *args: str, tty: bool = False) -> tuple[float, subprocess.CompletedProcess]:
    e = dict(env, TTY_COMPATIBLE="1", COLUMNS="120") if tty else env
    t = time.perf_counter()
    res = subprocess.run(["gpurun", *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - t, res


def med(env: dict, n: int, *args: str, tty: bool = False) -> float:
    return statistics.median(cli(env, *args, tty=tty)[0] for _ in range(n))


def job_line(ledger: Path) -> str:
    return (f"echo s $(date +%s.%N) >> {ledger}; sleep 0.05; echo e $(date +%s.%N) >> {ledger}")


def plain_line(ledger: Path) -> str:
    """The same job as a ``#!/bin/sh`` script, named by a line of plain words (no ``bash -c``)."""
    script = ledger.parent / "gapjob"
    script.write_text('#!/bin/sh\necho s $(date +%s.%N) >> "$1"; sleep 0.05; echo e $(date +%s.%N) >> "$1"\n')
    script.chmod(0o755)
    return f"{script} {ledger}"


def line_for(kind: str, ledger: Path) -> str:
    return plain_line(ledger) if kind == "plain" else job_line(ledger)


def gaps_of(ledger: Path) -> list[float]:
    rows = [l.split() for l in ledger.read_text().splitlines() if l.strip()]
    starts = [float(v) for k, v in rows if k == "s"]
    ends = [float(v) for k, v in rows if k == "e"]
    return sorted(s - e for s, e in zip(starts[1:], ends[:-1]))


def summary(gaps: list[float]) -> dict:
    return {"gap_median_ms": round(1000 * statistics.median(gaps), 1),
            "gap_p90_ms": round(1000 * gaps[int(0.9 * (len(gaps) - 1))], 1), "gaps": len(gaps)}


def cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def one_size(n: int, gap_jobs: int, exec_wrapper: bool = False, kind: str = "shell", gap_only: bool = False) -> dict:
    from orchestrator.agent.control import wake
    from orchestrator.agent.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="gpurun-backlog-"))
    env = dict(os.environ, XDG_DATA_HOME=str(tmp / "data"), XDG_CONFIG_HOME=str(tmp / "cfg"))
    env.pop("TTY_COMPATIBLE", None)
    if exec_wrapper:
        env["GPURUN_EXEC_WRAPPER"] = "1"  # the daemon the CLI starts inherits it
    q = tmp / "one.txt"
    q.write_text("[name=warm] true\n")
    _, res = cli(env, "queue", "submit", str(q), "--slots", "1", "--wait")  # agent up, slots=1
    assert res.returncode == 0, res.stderr
    state = tmp / "data/gpurun/hosts/local/agent"
    pid = int((state / "agent.pid").read_text())
    ledger = tmp / "ledger"
    runs = state / "runs"

    def row(name: str, command: str) -> dict:
        jid = uuid.uuid4().hex[:12]
        return {"id": jid, "name": name, "command": command, "run_dir": str(runs / jid),
                "log": str(runs / jid / "log.txt")}

    line = line_for(kind, ledger)
    rows = [row("gap-%03d" % i, line) for i in range(gap_jobs)]
    rows += [row("backlog-%06d" % i, "sleep 1000") for i in range(n)]
    store = Store(str(state / "gpurun.db"))
    t = time.perf_counter()
    store.insert_jobs(rows)
    insert_s = time.perf_counter() - t
    c0 = cpu_s(pid)
    wake(str(state))
    deadline = time.time() + 600
    while time.time() < deadline:
        done = ledger.exists() and ledger.read_text().count("e ") >= gap_jobs
        if done:
            break
        time.sleep(0.05)
    c1 = cpu_s(pid)
    out = {"backlog": n, "job": kind, "load": round(os.getloadavg()[0], 2), "insert_s": round(insert_s, 2),
           **summary(gaps_of(ledger)),
           "agent_cpu_ms_per_start": round(1000 * (c1 - c0) / gap_jobs, 1)}
    time.sleep(0.5)  # the first backlog job (sleep 1000) is running now: N-1 queued
    if not gap_only:
        status_times(env, out)
    store.close()
    cli(env, "queue", "cancel", "--all", "--yes")
    time.sleep(0.5)
    try:
        os.kill(int((state / "agent.pid").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def status_times(env: dict, out: dict) -> None:
    out["status_json_s"] = round(med(env, 3, "queue", "status", "--json"), 3)
    out["status_piped_s"] = round(med(env, 3, "queue", "status"), 3)
    out["status_tty_s"] = round(med(env, 3, "queue", "status", tty=True), 3)
    if ALL_FLAG:
        out["status_tty_all_s"] = round(med(env, 3, "queue", "status", "--all", tty=True), 3)
        out["status_piped_all_s"] = round(med(env, 3, "queue", "status", "--all"), 3)


def tsp_gap(gap_jobs: int, kind: str = "shell") -> dict | None:
    if not shutil.which("tsp"):
        return None
    tmp = Path(tempfile.mkdtemp(prefix="tsp-bench-"))
    env = dict(os.environ, TS_SOCKET=str(tmp / "sock"), TMPDIR=str(tmp))
    ledger = tmp / "ledger"
    subprocess.run(["tsp", "-S", "1"], env=env, check=True)
    argv = ["sh", "-c", job_line(ledger)] if kind == "shell" else plain_line(ledger).split()
    for _ in range(gap_jobs):
        subprocess.run(["tsp", *argv], env=env, check=True, capture_output=True)
    subprocess.run(["tsp", "-w"], env=env, capture_output=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (ledger.exists() and ledger.read_text().count("e ") >= gap_jobs):
        time.sleep(0.05)
    subprocess.run(["tsp", "-K"], env=env, capture_output=True)
    out = dict(summary(gaps_of(ledger)), job=kind)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--gap-jobs", type=int, default=20)
    ap.add_argument("--no-tsp", action="store_true")
    ap.add_argument("--exec-wrapper", action="store_true", help="also each size with the exec'd wrapper")
    ap.add_argument("--job", choices=("shell", "plain", "both"), default="shell",
                    help="the gap jobs' line: shell syntax (bash -c), plain words (spawned directly), or both")
    ap.add_argument("--gap-only", action="store_true", help="skip the status timings")
    a = ap.parse_args()
    kinds = ("shell", "plain") if a.job == "both" else (a.job,)
    out: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
    out["runs"] = []
    for n in a.sizes.split(","):  # interleaved: tsp, fork, exec'd, size by size and kind by kind
        for kind in kinds:
            if not a.no_tsp:
                out["runs"].append({"backlog": int(n), "tsp": tsp_gap(a.gap_jobs, kind),
                                    "load": round(os.getloadavg()[0], 2)})
            out["runs"].append(one_size(int(n), a.gap_jobs, kind=kind, gap_only=a.gap_only))
            if a.exec_wrapper:
                out["runs"].append(dict(one_size(int(n), a.gap_jobs, exec_wrapper=True, kind=kind,
                                                 gap_only=a.gap_only), wrapper="exec"))
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
