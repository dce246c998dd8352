"""Placement of a 1,000-job queue over a fleet of 4 loopback boxes, one command (issue 13):

    gpurun queue submit q1000.txt --fleet f4            target <= 2 s

The 4 boxes are 4 unix users (``gpurun-fb0`` .. ``gpurun-fb3``) on one real OpenSSH sshd on
127.0.0.1 (``tests/rigs/sshd.py``), each with its own home, state dir and agent. Every round
starts from 4 fresh state dirs whose agents are already up, each box running one ``sleep``
blocker on its one slot, so the 1,000 jobs stay queued and nothing runs while the command is
timed (a 2-core machine). The command is the cold CLI, timed from exec to exit: it reads the
file, asks the 4 boxes for their jobs and capacity in parallel, places, and sends 4 submits
in parallel. For reference, the same 1,000 jobs to one warm box (``--host solo``, a fifth
user) in the same round, and the CLI's own start (``gpurun --help``). Each round submits two
queues of 1,000 to the fleet: the first with no GPU count remembered (each box is asked for
its GPUs: one more round trip), the second with the counts the first one recorded in
``fleet-state.json`` (kept 10 minutes), so it asks each box only for its jobs. Bytecode is cached (PYTHONPYCACHEPREFIX) as in an installed gpurun.

Needs root (to create the users). Run: python bench/bench_fleet_place.py [--rounds 5] [--jobs 1000].
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
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

from rigs.fleet import box_entry  # noqa: E402  (tests/ on the path first)

USERS = ["gpurun-fb0", "gpurun-fb1", "gpurun-fb2", "gpurun-fb3"]
SOLO = "gpurun-fb4"


def cli(env: dict, *args: str, timeout: float = 300) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"gpurun {' '.join(args)} failed ({res.returncode}): {res.stderr[-600:]}")
    return dt, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1000)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the 4 boxes are 4 unix users")
    from rigs.sshd import SshdRig, _ensure_user

    home = Path(tempfile.mkdtemp(prefix="gpurun-bench-fleet-"))
    env = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"),
               PYTHONPYCACHEPREFIX=str(home / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("GPURUN_HOST", None)
    os.environ.update({k: env[k] for k in ("HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME")})
    from orchestrator import hosts, paths
    from orchestrator.fleets import add_fleet

    for u in USERS + [SOLO]:
        _ensure_user(u, noisy=False)
    rig = SshdRig()
    rig.start()
    names = [f"box-{i}" for i in range(len(USERS))]
    fleet_s, cached_s, solo_s, start_s, spreads = [], [], [], [], []
    try:
        rig.trust(paths.data_home() / "known_hosts")
        cli(env, "--help")   # bytecode into the cache before the first timed run
        for r in range(a.rounds):
            tag = f"r{r}-{time.monotonic_ns()}"
            for name, user in zip(names + ["solo"], USERS + [SOLO]):
                hosts.add_host(box_entry(rig, user, name, f"bench-{tag}", slots=1), replace=True)
            if r == 0:
                add_fleet("f4", names)
            block = home / f"block-{tag}.txt"
            block.write_text(f"[name=blocker-{tag}] sleep 600\n")
            for name in names + ["solo"]:   # agent up, its one slot held: the bench's jobs stay queued
                cli(env, "queue", "submit", str(block), "--host", name)
            start_s.append(cli(env, "--help")[0])   # the CLI's own start, a floor for the command
            (paths.data_home() / "fleet-state.json").unlink(missing_ok=True)   # no GPU count cached
            for kind, times in (("first", fleet_s), ("cached", cached_s)):
                q = home / "q1000.txt"
                q.write_text("".join(f"[name={tag}-{kind}-{i}] true\n" for i in range(a.jobs)))
                dt, res = cli(env, "queue", "submit", str(q), "--fleet", "f4", "--json")
                times.append(dt)
                doc = json.loads(res.stdout)
                spreads.append({h["host"]: len(h["added"]) for h in doc["hosts"]})
                assert sum(spreads[-1].values()) == a.jobs, spreads[-1]
            solo_q = home / "solo.txt"
            solo_q.write_text("".join(f"[name=solo-{tag}-{i}] true\n" for i in range(a.jobs)))
            dt, _ = cli(env, "queue", "submit", str(solo_q), "--host", "solo")
            solo_s.append(dt)
            for name in names + ["solo"]:   # this round's agents and blockers go; the next has fresh ones
                cli(env, "queue", "cancel", "--all", "--yes", "--host", name)
                cli(env, "agent", "stop", "--yes", "--host", name)
        med = statistics.median
        from orchestrator.core.fleet import Capacity, Load, place
        jobs = [{"id": f"j{i}", "name": f"j{i}", "gpus": 1, "source": f"q:{i}"} for i in range(a.jobs)]
        pure = []
        for _ in range(5):   # the placement alone, pure: what the command spends deciding
            loads = {n: Load(Capacity(0, 1), used=1) for n in names}
            t0 = time.perf_counter()
            place(jobs, loads)
            pure.append(time.perf_counter() - t0)
        print(json.dumps({
            "command": f"gpurun queue submit q1000.txt --fleet f4   ({a.jobs} jobs, 4 loopback boxes: "
                       "4 unix users on one sshd)",
            "rounds": a.rounds,
            "fleet_submit_first_s": [round(x, 3) for x in fleet_s],
            "fleet_submit_first_median_s": round(med(fleet_s), 3),
            "fleet_submit_cached_gpus_s": [round(x, 3) for x in cached_s],
            "fleet_submit_cached_gpus_median_s": round(med(cached_s), 3),
            "one_host_submit_s": [round(x, 3) for x in solo_s],
            "one_host_submit_median_s": round(med(solo_s), 3),
            "cli_start_median_s": round(med(start_s), 3),
            "place_alone_median_ms": round(med(pure) * 1000, 2),
            "spread": spreads[-1],
            "target_s": 2.0,
        }, indent=2))
    finally:
        for pidfile in home.rglob("agent.pid"):
            _kill(pidfile)
        for u in USERS + [SOLO]:
            for pidfile in Path(pwd.getpwnam(u).pw_dir).rglob("agent.pid"):
                if rig.run_id in str(pidfile):
                    _kill(pidfile)
        rig.close()
        shutil.rmtree(home, ignore_errors=True)


def _kill(pidfile: Path) -> None:
    try:
        os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
