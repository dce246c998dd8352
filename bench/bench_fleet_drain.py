"""A host that drains early, to its moved jobs running elsewhere (issue 13, figure 2).

Two loopback boxes (one sshd rig, two state dirs, one agent each, one slot each): ``busy`` runs
a job that holds its slot and has ``--jobs`` quick jobs queued behind it; ``idle`` has nothing.
Each round times, from the moment ``gpurun queue balance --host busy --host idle`` is started
(a cold CLI, as a user or a cron line runs it):

  - ``balance_cli_s``: until the command has exited (status of both, release on busy, submit
    on idle: three round trips, the two status calls in parallel);
  - ``drain_to_start_s``: until the moved job's ``started_at`` on ``idle`` (the agent's clock:
    the same machine). The target is one controller poll + 2 s; ``queue balance`` run by hand
    is its own poll, and ``watch --fleet`` / ``pull --fleet --loop`` poll every 10 s
    (``core/fleet_views.BALANCE_EVERY_S``), so that adds at most 10 s to this figure.

The first round also asks each agent for its GPUs (``gpu`` verb); later rounds use the count
kept in ``fleet-state.json`` for 10 minutes, as a poll loop does. Needs root (the sshd rig).

Run: python bench/bench_fleet_drain.py [--rounds N] [--jobs N]. Prints one JSON document.
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
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from rigs.fleet import wait_until  # noqa: E402  (tests/ on the path first)


def rows(host: str) -> dict[str, dict]:
    from orchestrator.core.session import open_session
    with open_session(host) as s:
        return {j["name"]: j for j in s.status()["jobs"]}


def one_round(i: int, jobs: int, cli: list[str], env: dict, home: Path) -> dict:
    from orchestrator.core.queue import to_jobs
    from orchestrator.core.session import open_session
    from orchestrator.queuefile import parse_text

    gate = home / f"gate-{i}"
    lines = [f"[name=hold-{i}] while [ ! -e {gate} ]; do sleep 0.05; done"]
    lines += [f"[name=r{i}-j{k:03d}] true" for k in range(jobs)]
    with open_session("busy") as s:
        specs, _ = to_jobs(parse_text("\n".join(lines) + "\n", "q.txt"), s.host, "q.txt")
        s.submit(specs)
    wait_until(lambda: rows("busy")[f"hold-{i}"]["state"] == "running", "the job holding busy's slot")
    t0 = time.time()
    res = subprocess.run(cli + ["queue", "balance", "--host", "busy", "--host", "idle", "--json"],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    t_cli = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"queue balance failed ({res.returncode}): {res.stderr[-400:]}")
    moved = [m["name"] for m in json.loads(res.stdout)["moves"]]
    if len(moved) != 1:
        raise SystemExit(f"expected one move onto the one free slot, got {moved}")
    got: dict = {}

    def started() -> bool:
        got.update(rows("idle").get(moved[0]) or {})
        return bool(got.get("started_at"))

    wait_until(started, "the moved job to start on idle")
    gate.touch()
    with open_session("busy") as s:   # the rest of the queue is not this figure's business
        s.cancel([], all_=True)
    wait_until(lambda: all(j["state"] not in ("queued", "running") for j in rows("busy").values()), "busy to settle")
    wait_until(lambda: all(j["state"] not in ("queued", "running") for j in rows("idle").values()), "idle to settle")
    return {"balance_cli_s": round(t_cli, 3), "drain_to_start_s": round(got["started_at"] - t0, 3),
            "moved": moved[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=50)
    a = ap.parse_args()
    from bench_ssh import start_loopback_hosts, stop_loopback_hosts

    home, env, rig, cli = start_loopback_hosts("gpurun-bench-drain-", ["busy", "idle"])
    try:
        from orchestrator import hosts
        for name in ("busy", "idle"):
            hosts.update_host(name, slots=1)
        gate_dir = home
        gate_dir.chmod(0o755)
        rounds = [one_round(i, a.jobs, cli, env, gate_dir) for i in range(a.rounds)]
    finally:
        stop_loopback_hosts(rig, home)
    later = rounds[1:] or rounds
    med = statistics.median
    print(json.dumps({
        "rounds": rounds,
        "first_round": rounds[0],
        "later_rounds": {k: {"median": med(r[k] for r in later), "min": min(r[k] for r in later),
                             "max": max(r[k] for r in later)} for k in ("balance_cli_s", "drain_to_start_s")},
        "queued_behind": a.jobs,
    }, indent=2))


if __name__ == "__main__":
    main()
