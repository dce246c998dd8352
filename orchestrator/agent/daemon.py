"""The agent daemon's lifecycle: pidfile + flock + build file, idempotent ``ensure``, the loop.

One daemon per state dir, proven by an exclusive flock held for its whole life. ``ensure``
is a no-op when a daemon of the same build holds the lock, and replaces an older build.
The loop sleeps on a wakeup fd: a job exit (SIGCHLD) or a client verb (SIGUSR1) wakes it at
once, so the next job starts within milliseconds while an idle agent costs nothing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import traceback
import zlib
from typing import Optional

from orchestrator.agent.runner import Runner
from orchestrator.agent.store import Store

IDLE_TICK_S = 2.0
BUSY_TICK_S = 0.5


def files(state_dir: str) -> dict:
    return {k: os.path.join(state_dir, v) for k, v in {
        "lock": "agent.lock", "pid": "agent.pid", "build": "agent.build", "log": "agent.log",
        "db": "gpurun.db", "config": "config.json"}.items()}


def load_config(state_dir: str) -> dict:
    try:
        with open(files(state_dir)["config"]) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_atomic(path: str, text: str) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_config(state_dir: str, config: dict) -> bool:
    """Store the host config the daemon runs with; returns False (and writes nothing, so
    the daemon does not reload) when it is unchanged."""
    text = json.dumps(config, indent=1, sort_keys=True)
    path = files(state_dir)["config"]
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    write_atomic(path, text)
    return True


def running_daemon(state_dir: str) -> Optional[dict]:
    """``{"pid", "build"}`` of the daemon holding the lock, or None when none runs."""
    f = files(state_dir)
    try:
        fd = os.open(f["lock"], os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        info = {"pid": None, "build": None}
        for key in ("pid", "build"):
            try:
                with open(f[key]) as fh:
                    info[key] = fh.read().strip()
            except OSError:
                pass
        info["pid"] = int(info["pid"]) if info["pid"] and info["pid"].isdigit() else None
        return info
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def wake(state_dir: str) -> None:
    info = running_daemon(state_dir)
    if info and info["pid"]:
        try:
            os.kill(info["pid"], signal.SIGUSR1)
        except OSError:
            pass


def ensure(state_dir: str, pyz: str, build: str, detach: str = "setsid", timeout: float = 15.0) -> dict:
    """Make sure a daemon of ``build`` runs for ``state_dir``; returns what was done."""
    os.makedirs(state_dir, exist_ok=True)
    info = running_daemon(state_dir)
    if info and info["build"] == build:
        return {"action": "none", "pid": info["pid"], "build": build}
    replaced = None
    if info:
        replaced = info["build"]
        if info["pid"]:
            try:
                os.kill(info["pid"], signal.SIGTERM)
            except OSError:
                pass
        deadline = time.time() + timeout
        while running_daemon(state_dir) and time.time() < deadline:
            time.sleep(0.05)
    argv = [sys.executable or "python3", pyz, "daemon", "--state-dir", state_dir, "--build", build]
    log = open(files(state_dir)["log"], "ab")
    if detach == "tmux" and _has("tmux"):
        session = "gpurun-agent-%08x" % zlib.crc32(state_dir.encode())  # stable across processes
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        cmd = " ".join(shlex.quote(a) for a in argv) + " >> %s 2>&1" % shlex.quote(files(state_dir)["log"])
        subprocess.run(["tmux", "new-session", "-d", "-s", session, cmd], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True)
    else:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True, close_fds=True)
    log.close()
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = running_daemon(state_dir)
        if info and info["build"] == build:
            return {"action": "replaced" if replaced else "started", "pid": info["pid"], "build": build,
                    "previous": replaced}
        time.sleep(0.02)
    raise RuntimeError("agent did not start within %ds; see %s" % (timeout, files(state_dir)["log"]))


def _has(prog: str) -> bool:
    return any(os.access(os.path.join(p, prog), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep))


class Daemon:
    def __init__(self, state_dir: str, pyz: str, build: str):
        self.state_dir = state_dir
        self.pyz = pyz
        self.build = build
        self.stop = False
        self.f = files(state_dir)

    def _lock(self) -> Optional[int]:
        fd = os.open(self.f["lock"], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def run(self) -> int:
        fd = self._lock()
        if fd is None:
            return 0  # another daemon holds the lock: nothing to do
        write_atomic(self.f["pid"], "%d\n" % os.getpid())
        write_atomic(self.f["build"], self.build + "\n")
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        os.set_blocking(rfd, False)
        signal.set_wakeup_fd(wfd)
        for sig in (signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)
        store = Store(self.f["db"])
        config = load_config(self.state_dir)
        runner = Runner(store, self.state_dir, config, [sys.executable or "python3", self.pyz])
        store.add_event(None, "agent_start", "info", "agent %s started (pid %d)" % (self.build, os.getpid()),
                        {"boot_id": runner.boot})
        runner.reconcile()
        periodic = self._periodic_runner(store, runner, config, self.state_dir)
        config_mtime = self._mtime()
        while not self.stop:
            try:
                mt = self._mtime()
                if mt != config_mtime:
                    config_mtime = mt
                    runner.config = periodic.ctx.config = config = load_config(self.state_dir)
                runner.step()
                periodic.run()
            except Exception:
                # A bug in one pass must not kill the agent that guards running jobs.
                sys.stderr.write(traceback.format_exc())
                sys.stderr.flush()
                time.sleep(1.0)
            busy = bool(runner.pids)
            try:
                select.select([rfd], [], [], BUSY_TICK_S if busy else IDLE_TICK_S)
                while os.read(rfd, 512):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        store.add_event(None, "agent_stop", "info", "agent stopped (pid %d); jobs keep running" % os.getpid())
        store.close()
        return 0

    def _mtime(self) -> float:
        try:
            return os.stat(self.f["config"]).st_mtime
        except OSError:
            return 0.0

    def _on_stop(self, *_: object) -> None:
        self.stop = True

    @staticmethod
    def _periodic_runner(store: Store, runner: Runner, config: dict, state_dir: str):
        from orchestrator.agent.periodic import Periodic
        return Periodic(AgentContext(state_dir, store, config, runner))


class AgentContext:
    """What hooks and verbs get: the state dir, the store, the host config (and the runner)."""

    def __init__(self, state_dir: str, store: Store, config: dict, runner: Optional[Runner] = None):
        self.state_dir = state_dir
        self.store = store
        self.config = config
        self.runner = runner
