"""The idle exit's lock protocol, driven on a real daemon: a daemon past its
``agent.idle_exit_minutes`` does not exit while a command holds the ensure lock (so ``ensure``
never answers "running" for a daemon on its way out), exits once the lock is free, and the
next ``ensure`` starts a fresh one. The CLI side is in ``tests/cli/test_agent_cli.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from orchestrator.agent import control
from orchestrator.agent.framing import unframe
from orchestrator.core import agentship


def _ensure(pyz, state_dir, build: str, config: dict) -> dict:
    out = subprocess.run([sys.executable, str(pyz), "ensure", "--state-dir", str(state_dir)],
                         input=json.dumps({"build": build, "config": config}), capture_output=True, text=True,
                         timeout=60)
    reply = unframe(out.stdout)
    assert reply["ok"], reply
    return reply["result"]


def _gone_within(sd: str, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if control.running_daemon(sd) is None:
            return True
        time.sleep(0.05)
    return False


def test_idle_daemon_waits_for_an_ensuring_command_then_exits(home):
    _, pyz = agentship.build()
    sd = str(home / "state")
    cfg = {"agent": {"idle_exit_minutes": 0.02}}  # 1.2 s
    first = _ensure(pyz, sd, "b1", cfg)
    assert first["action"] == "started"
    with control.ensure_lock(sd):  # a command is between its look at the daemon and its verb
        # the daemon tries at its limit (1.2 s) and again every MIN_TICK_S while the lock is held
        assert not _gone_within(sd, 3), "exited while a command was ensuring"  # limit + 1.8 s
    assert _gone_within(sd, 6), "idle daemon did not exit"
    assert control.idle_exit_s(cfg) == 1.2
    again = _ensure(pyz, sd, "b1", cfg)
    assert again["action"] == "started" and again["pid"] != first["pid"]


def test_idle_exit_is_off_without_the_setting(home):
    _, pyz = agentship.build()
    sd = str(home / "state")
    first = _ensure(pyz, sd, "b1", {"agent": {"idle_exit_minutes": 0}})
    assert not _gone_within(sd, 3)
    assert control.running_daemon(sd)["pid"] == first["pid"]
    assert control.idle_exit_s({}) == 0 and control.idle_exit_s({"agent": {"idle_exit_minutes": None}}) == 0


def test_ensure_reports_the_pid_of_the_daemon_it_started_not_the_last_ones(home):
    """A daemon takes its lock before it writes its pid and build: the files left by the last
    daemon (the same build, after an idle exit) must not be taken for the new one's."""
    _, pyz = agentship.build()
    sd = home / "state"
    sd.mkdir(parents=True, exist_ok=True)
    f = control.files(str(sd))
    stale = subprocess.Popen([sys.executable, "-c", "pass"])
    stale.wait()  # a pid that was a process and is no more
    # 3 rounds in the suite (each waits out an idle exit, ~2.5 s); GPURUN_IDLE_ROUNDS for more
    for _ in range(int(os.environ.get("GPURUN_IDLE_ROUNDS", "3"))):
        control.write_atomic(f["pid"], "%d\n" % stale.pid)
        control.write_atomic(f["build"], "b1\n")
        got = _ensure(pyz, str(sd), "b1", {"agent": {"idle_exit_minutes": 0.02}})
        assert got["action"] == "started" and got["pid"] != stale.pid
        assert got["pid"] == control.running_daemon(str(sd))["pid"]
        with open("/proc/%d/cmdline" % got["pid"], "rb") as fh:
            assert b"daemon" in fh.read()
        assert _gone_within(str(sd), 6)  # its idle exit, then the next round
