"""``core/localhost``: this machine's CPU / RAM line and a process's RSS / CPU / age (psutil),
read for real, plus the local agent daemon found by its lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.core import localhost

KEYS = {"load", "cpus", "cpu_pct", "mem_used_bytes", "mem_total_bytes", "mem_pct", "mem_scope"}


def test_machine_has_the_host_load_keys_and_sane_values():
    m = localhost.machine(sample_s=0.05)
    assert set(m) == KEYS
    assert m["cpus"] >= 1 and 0.0 <= m["cpu_pct"] <= 100.0
    assert 0 < m["mem_used_bytes"] < m["mem_total_bytes"] and 0 < m["mem_pct"] < 100
    assert m["mem_scope"] == "host" and len(m["load"]) == 3


def test_machine_keys_match_the_agent_side_line():
    """One renderer shows the box's line (health.system.host_load) and this machine's."""
    from orchestrator.health import system

    if not hasattr(system, "host_load"):
        pytest.skip("health.system.host_load not in this tree")
    assert set(system.host_load(sample_s=0)) == set(localhost.machine(sample_s=0))


def test_machine_without_sampling_gives_no_cpu_pct():
    assert localhost.machine(sample_s=0)["cpu_pct"] is None


def test_process_sees_a_busy_child_and_its_memory():
    code = "b = bytearray(64 << 20)\nimport time\nt = time.time()\nwhile time.time() - t < 30: pass"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 10
        p = localhost.process(child.pid, sample_s=0.3)
        while p["rss_bytes"] < 64 << 20 and time.time() < deadline:
            time.sleep(0.1)
            p = localhost.process(child.pid, sample_s=0.3)
        assert p["pid"] == child.pid and p["alive"] and p["name"].startswith("python")
        assert p["rss_bytes"] >= 64 << 20 and p["threads"] >= 1
        assert p["cpu_pct"] > 20  # a spinning loop: most of one core
        assert 0 <= p["age_s"] < 60 and p["started_at"] <= time.time()
    finally:
        child.kill()
        child.wait()


def test_process_gone_or_zombie_is_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 10
    while time.time() < deadline:  # exited but not reaped: a zombie
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    assert localhost.process(child.pid) is None
    child.wait()
    assert localhost.process(child.pid) is None


def test_local_agent_none_without_state_dir(isolated_home: Path):
    assert localhost.local_agent() is None
    assert not (isolated_home / ".local" / "share" / "gpurun").exists()  # looked, created nothing


def test_local_agent_finds_the_daemon_holding_the_lock(isolated_home: Path):
    """A process holding the state dir's flock with its pid in the pidfile, as the daemon does."""
    from orchestrator.agent.control import files
    from orchestrator.paths import local_state_dir

    state = local_state_dir()
    state.mkdir(parents=True)
    f = files(str(state))
    holder = ("import fcntl, os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
              "open(sys.argv[3], 'w').write('b123')\n"
              "time.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", holder, f["lock"], f["pid"], f["build"]])
    try:
        deadline = time.time() + 10
        info = localhost.local_agent(sample_s=0)
        while (info is None or info["build"] is None) and time.time() < deadline:
            time.sleep(0.05)
            info = localhost.local_agent(sample_s=0)
        assert info is not None and info["pid"] == child.pid and info["build"] == "b123"
        assert info["state_dir"] == str(state) and info["rss_bytes"] > 0 and info["cpu_pct"] is None
    finally:
        child.kill()
        child.wait()
    assert localhost.local_agent() is None  # lock released: no daemon


def test_psutil_is_not_imported_until_used():
    code = "import sys; import orchestrator.core.localhost; print('psutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
