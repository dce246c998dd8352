"""SSH figures on loopback (real sshd started here, clean non-root user; needs root):

  - cold ``gpurun queue status --host H`` vs bare ``ssh H true`` (target <= 2x)
  - submit of 1,000 jobs over SSH: one round trip (target <= 2 s), cold CLI and warm session
  - ``gpurun queue status --all-hosts`` over 20 SSH hosts (target <= 3 s)

Run: python bench/bench_ssh.py [--repeat N]. Prints one JSON document.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def timed(argv: list[str], env: dict, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = subprocess.run(argv, env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise SystemExit(f"{argv[:4]} failed: {res.stderr.strip()[-400:]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    home, env, rig, cli = start_loopback_hosts("gpurun-bench-", [f"h{i:02d}" for i in range(20)])
    from rigs.sshd import CLEAN_USER

    try:
        ssh_true = timed(rig.ssh_argv(CLEAN_USER, "true"), env, args.repeat)
        timed(cli + ["queue", "status", "--host", "h00"], env, 1)  # ship + start the agent
        status = timed(cli + ["queue", "status", "--host", "h00"], env, args.repeat)

        q = home / "q1000.txt"
        q.write_text("".join(f"[name=bench{i} gpus=0] true\n" for i in range(1000)))
        submit_cli = timed(cli + ["queue", "submit", str(q), "--host", "h01", "--json"], env, 1)
        from orchestrator.core.queue import to_jobs
        from orchestrator.core.session import open_session
        from orchestrator.queuefile import parse_file

        with open_session("h02") as s:
            s.status()
            jobs, _ = to_jobs(parse_file(str(q)), s.host, str(q))
            t0 = time.perf_counter()
            s.submit(jobs)
            submit_warm = time.perf_counter() - t0
            warm = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                s.status()
                warm.append(time.perf_counter() - t0)

        all_cmd = cli + ["queue", "status", "--all-hosts", "--json"]
        timed(all_cmd, env, 1)  # first contact ensures 20 agents
        all_hosts = timed(all_cmd, env, max(3, args.repeat // 3))
        med = statistics.median
        print(json.dumps({
            "ssh_true_s": round(med(ssh_true), 3),
            "queue_status_cold_cli_s": round(med(status), 3),
            "status_vs_ssh_true": round(med(status) / med(ssh_true), 2),
            "status_warm_session_s": round(med(warm), 3),
            "submit_1000_cold_cli_s": round(submit_cli[0], 3),
            "submit_1000_round_trip_s": round(submit_warm, 3),
            "status_all_20_hosts_s": round(med(all_hosts), 3),
            "repeat": args.repeat,
        }, indent=2))
    finally:
        stop_loopback_hosts(rig, home)


def start_loopback_hosts(prefix: str, names: list[str]) -> tuple[Path, dict, Any, list[str]]:
    """A throwaway gpurun home (also set in ``os.environ``), a started loopback sshd rig
    with ``names`` registered as hosts (clean non-root user), and the CLI argv prefix.
    Shared with bench_watch.py; pair it with ``stop_loopback_hosts``."""
    from rigs.sshd import CLEAN_USER, SshdRig

    home = Path(tempfile.mkdtemp(prefix=prefix))
    env = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / "data"),
               XDG_CONFIG_HOME=str(home / "config"))
    os.environ.update(env)
    from orchestrator import hosts, paths

    rig = SshdRig()
    rig.start()
    try:
        rig.trust(paths.data_home() / "known_hosts")
        for name in names:
            hosts.add_host(rig.host_entry(CLEAN_USER, name=name, label=name))
    except BaseException:
        stop_loopback_hosts(rig, home)
        raise
    return home, env, rig, [sys.executable, "-m", "orchestrator.cli"]


def stop_loopback_hosts(rig: Any, home: Path) -> None:
    """Stop the agent daemons the bench started (local one included) by their pidfiles,
    then the rig, then remove the throwaway home."""
    from rigs.sshd import CLEAN_USER

    for root in (rig.home_of(CLEAN_USER), home):
        for pidfile in Path(root).rglob("agent.pid"):
            if rig.run_id not in str(pidfile) and str(home) not in str(pidfile):
                continue
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    rig.close()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
