"""kill -9 of the agent at random moments: every job ends once, none twice, none lost."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from rigs.agents import gpurun, status_json, wait_terminal


def _kill_agent(state_dir) -> bool:
    try:
        pid = int((state_dir / "agent.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        return True
    except (OSError, ValueError):
        return False


def test_agent_killed_20_times_across_10_jobs(home, tmp_path):
    ledger = tmp_path / "ledger"
    lines = []
    for i in range(10):
        # each job records its start and end; O_APPEND writes of short lines are atomic
        lines.append(f"[name=j{i}] echo start j{i} $$ >> {ledger}; sleep 0.{3 + i % 5}; echo end j{i} >> {ledger}")
    q = tmp_path / "q.txt"
    q.write_text("\n".join(lines) + "\n")
    assert gpurun("queue", "submit", str(q), "--slots", "3").returncode == 0
    state_dir = home / ".local/share/gpurun/hosts/local/agent"
    rng = random.Random(1234)
    kills = 0
    stop = threading.Event()

    def poke() -> None:
        # Another CLI keeps calling in, which re-ensures the agent after every kill.
        while not stop.is_set():
            gpurun("queue", "status", "--json")
            time.sleep(0.05)

    poker = threading.Thread(target=poke, daemon=True)
    poker.start()
    deadline = time.time() + 90
    while kills < 20 and time.time() < deadline:
        time.sleep(rng.uniform(0.02, 0.25))
        if _kill_agent(state_dir):
            kills += 1
    stop.set()
    poker.join(30)
    assert kills >= 20
    st = wait_terminal(timeout=90)
    jobs = {j["name"]: j for j in st["jobs"]}
    assert len(jobs) == 10                                            # none lost
    assert all(j["state"] == "succeeded" for j in jobs.values()), st  # every job terminal and fine
    starts = [ln.split()[1] for ln in ledger.read_text().splitlines() if ln.startswith("start")]
    ends = [ln.split()[1] for ln in ledger.read_text().splitlines() if ln.startswith("end")]
    assert sorted(starts) == sorted(f"j{i}" for i in range(10)), "each job started exactly once"
    assert sorted(ends) == sorted(starts)
    assert all(j["attempt"] == 1 for j in jobs.values()), "survivors are re-adopted, never restarted"


def test_two_submits_at_the_same_moment_lose_nothing(home, tmp_path):
    import subprocess
    import sys
    files = []
    for k in range(2):
        p = tmp_path / f"q{k}.txt"
        p.write_text("".join(f"[name=s{k}-{i}] true\n" for i in range(50)))
        files.append(p)
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "queue", "submit", str(f)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for f in files]
    for p in procs:
        assert p.wait(60) == 0, p.stderr.read()
    names = {j["name"] for j in status_json()["jobs"]}
    assert names == {f"s{k}-{i}" for k in range(2) for i in range(50)}
    st = wait_terminal(timeout=120)
    assert all(j["state"] == "succeeded" for j in st["jobs"])
