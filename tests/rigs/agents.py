"""Helpers for tests that start real local agents: run the CLI, wait, and clean up daemons."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def point_home(mp, home: Path) -> Path:
    """Point HOME, XDG_DATA_HOME and XDG_CONFIG_HOME at ``home`` through the monkeypatch ``mp``
    (created with its ``.ssh``), so gpurun's files and its local agent live there."""
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    mp.setenv("HOME", str(home))
    mp.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    mp.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


def gpurun(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 120,
           cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run the real ``gpurun`` CLI in a subprocess (same interpreter)."""
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env or dict(os.environ), input=input, timeout=timeout, cwd=cwd)


def one_error(res: subprocess.CompletedProcess, code: int = 2) -> str:
    """Assert ``res`` is gpurun's clean refusal (exit ``code``, no traceback, exactly an
    error line and a hint line on stderr); returns the error line."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0].startswith("gpurun: error: ") and lines[1].strip().startswith("hint:"), lines
    return lines[0]


def status_json(host: str | None = None) -> dict:
    args = ["queue", "status", "--json"] + (["--host", host] if host else [])
    res = gpurun(*args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def wait_terminal(host: str | None = None, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        st = status_json(host)
        if all(j["state"] not in ("queued", "running") for j in st["jobs"]):
            return st
        if time.time() > deadline:
            raise AssertionError("jobs not terminal after %ss: %s" % (timeout, st))
        time.sleep(0.3)


def kill_agents_under(root: Path) -> None:
    """Stop every agent daemon (and job process group) whose state dir is under ``root``."""
    for pidfile in root.rglob("agent.pid"):
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
    for db in root.rglob("runs"):
        for started in db.rglob("started.*"):
            try:
                pid = int(started.read_text().strip())
                os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


def job_events(job: str, host: str | None = None) -> list:
    """A job's event history, through the real agent client."""
    from orchestrator.core.session import open_session
    with open_session(host) as s:
        return s.events(job)["events"]
