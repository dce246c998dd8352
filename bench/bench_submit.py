"""gpurun against its peers, interleaved round by round in one run (issue 15, items 6-8):

  - submit of 1,000 jobs, cold CLI, vs 1,000 task-spooler calls (``tsp``/``ts``): locally, and
    over SSH (gpurun's one round trip vs one ``ssh H sh -s`` running the 1,000 ``tsp`` calls)
  - cold ``gpurun queue status --host H`` with 1,000 jobs vs bare ``ssh H true`` (target <= 2x),
    with the parts: CLI start (``--help``), one warm-session status round trip, reply size
  - cold ``gpurun check`` of a 1M-line JSONL vs the ``json.loads``-per-line floor (<= 1.5x)

Needs root (loopback sshd rig, see bench_ssh.py) and task-spooler (apt-get install task-spooler).
gpurun's jobs queue behind one ``sleep`` job (one slot); tsp's run (``true``, one slot): a tsp
server takes at most 1,000 waiting clients, so its 1,000 jobs cannot all wait. Bytecode is cached (PYTHONPYCACHEPREFIX) as in an installed gpurun.

Run: python bench/bench_submit.py [--rounds N] [--lines N]. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

FLOOR = "import json, sys\nloads = json.loads\nwith open(sys.argv[1]) as f:\n    for line in f:\n        loads(line)\n"


def run(argv, env, stdin=None) -> float:
    # no pipes: a tsp server forked by the command would hold them open (and ssh with them)
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        res = subprocess.run(argv, env=env, input=stdin, stdout=subprocess.DEVNULL, stderr=err,
                             text=stdin is not None, timeout=120)
        dt = time.perf_counter() - t0
        if res.returncode not in (0, 10, 11):  # check exits 10/11 for WAIT/STOP
            err.seek(0)
            raise SystemExit(f"{argv[:5]} failed ({res.returncode}): {err.read().decode()[-400:]}")
    return dt


def queue_file(path: Path, tag: str, n: int) -> Path:
    path.write_text("".join(f"[name={tag}-{i} gpus=0] true\n" for i in range(n)))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--lines", type=int, default=1_000_000)
    a = ap.parse_args()
    tsp = shutil.which("tsp") or shutil.which("ts")
    if not tsp or subprocess.run([tsp, "-V"], capture_output=True).returncode not in (0, 1):
        raise SystemExit("task-spooler not found: apt-get install -y task-spooler")

    from bench_ssh import start_loopback_hosts, stop_loopback_hosts
    from bench_quality import gen_jsonl

    home, env, rig, cli = start_loopback_hosts("gpurun-bench15-", ["h00", "h01"])
    from rigs.sshd import CLEAN_USER

    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(home / "pyc")
    env["TS_SOCKET"] = str(home / "ts.sock")
    ssh = rig.ssh_argv(CLEAN_USER)
    rts = "TS_SOCKET=/tmp/gpurun-bench15-%d.sock" % os.getpid()
    jl = home / "metrics.jsonl"
    gen_jsonl(str(jl), a.lines)
    med = statistics.median
    r: dict[str, list[float]] = {k: [] for k in (
        "submit_local", "tsp_local", "submit_ssh", "tsp_ssh", "ssh_true", "status_ssh", "status_ssh_json",
        "cli_help", "check", "floor")}
    try:
        # the blocker: one slot busy with a sleep, so the 1,000 jobs only queue (both tools)
        (home / "block.txt").write_text("[name=block gpus=0] sleep 900\n")
        for host in ("local", "h00", "h01"):
            run(cli + ["queue", "submit", str(home / "block.txt"), "--host", host, "--slots", "1"], env)
        run([tsp, "-S", "1"], env)
        run(ssh + ["%s %s -S 1 </dev/null >/dev/null 2>&1" % (rts, tsp)], env)
        run(cli + ["--help"], env)  # bytecode cache
        tsp_script = "".join("%s %s true </dev/null >/dev/null 2>&1\n" % (rts, tsp) for _ in range(a.jobs))
        local_script = "for i in $(seq %d); do %s true </dev/null >/dev/null 2>&1; done" % (a.jobs, tsp)
        for k in range(a.rounds):
            q = queue_file(home / f"q{k}.txt", f"l{k}", a.jobs)
            r["submit_local"].append(run(cli + ["queue", "submit", str(q), "--json"], env))
            r["tsp_local"].append(run(["bash", "-c", local_script], env))
            q = queue_file(home / f"s{k}.txt", f"s{k}", a.jobs)
            r["submit_ssh"].append(run(cli + ["queue", "submit", str(q), "--host", "h00", "--json"], env))
            r["tsp_ssh"].append(run(ssh + ["sh -s"], env, stdin=tsp_script))
        # status: h01 holds exactly 1,000 jobs (the blocker + 999 queued)
        run(cli + ["queue", "submit", str(queue_file(home / "st.txt", "st", a.jobs - 1)), "--host", "h01"], env)
        from orchestrator.core.session import open_session
        for k in range(a.rounds * 2):
            r["ssh_true"].append(run(ssh + ["true"], env))
            r["status_ssh"].append(run(cli + ["queue", "status", "--host", "h01"], env))
            r["status_ssh_json"].append(run(cli + ["queue", "status", "--host", "h01", "--json"], env))
            r["cli_help"].append(run(cli + ["--help"], env))
        with open_session("h01") as s:
            n_jobs = len(s.status()["jobs"])
            warm = []
            for _ in range(a.rounds * 2):
                t0 = time.perf_counter()
                s.status()
                warm.append(time.perf_counter() - t0)
        reply = subprocess.run(cli + ["queue", "status", "--host", "h01", "--json"], env=env,
                               capture_output=True, timeout=120).stdout
        for k in range(max(3, a.rounds // 2)):
            r["check"].append(run(cli + ["check", str(jl)], env))
            r["floor"].append(run([sys.executable, "-c", FLOOR, str(jl)], env))
        m = {k: round(med(v), 3) for k, v in r.items() if v}
        print(json.dumps({
            "load_average": os.getloadavg(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "peer": tsp, "jobs": a.jobs, "rounds": a.rounds, "medians_s": m,
            "submit_local_vs_tsp": round(m["submit_local"] / m["tsp_local"], 2),
            "submit_ssh_vs_tsp_over_ssh": round(m["submit_ssh"] / m["tsp_ssh"], 2),
            "status_jobs_on_h01": n_jobs,
            "status_ssh_vs_ssh_true": round(m["status_ssh"] / m["ssh_true"], 2),
            "status_json_vs_ssh_true": round(m["status_ssh_json"] / m["ssh_true"], 2),
            "status_warm_session_round_trip_s": round(med(warm), 3),
            "status_json_reply_kb": round(len(reply) / 1024, 1),
            "check_lines": a.lines, "check_vs_json_loads_floor": round(m["check"] / m["floor"], 2),
        }, indent=1))
    finally:
        quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        subprocess.run(["sh", "-c", "%s -k; %s -K" % (tsp, tsp)], env=env, **quiet)
        subprocess.run(ssh + ["(%s %s -k; %s %s -K) </dev/null >/dev/null 2>&1" % (rts, tsp, rts, tsp)], env=env, **quiet)
        for q in ("local", "h00", "h01"):
            subprocess.run(cli + ["queue", "cancel", "--all", "--yes", "--host", q], env=env, **quiet)
        stop_loopback_hosts(rig, home)


if __name__ == "__main__":
    main()
