"""Starting a job's wrapper by forking the daemon: no second Python start between jobs.

``python3 -S agent.pyz jobwrap ...`` cost 35-45 ms of interpreter start and imports, and that
lay between one job's end and the next one's start (issue 15). Here the daemon forks; the
child makes itself a session leader, drops everything it inherited (fds, signal handlers,
the wakeup fd) and runs ``jobwrap.run`` in-process; the only exec is the job's shell.

What the exec'd wrapper had for free, the forked one gets here:

* its marker in ``/proc/PID/environ``. The runner, the sweeper, the watchdog and reconcile
  tell a job's wrapper from a reused pid by that file, which shows the environment block the
  process was exec'd with (the daemon's). Right before the fork the daemon writes the job's
  marker, run dir, job id and attempt over that block in its own memory (the kernel reads it
  from there), and puts its own back right after: the child is marked from its first
  instant, with no round trip, and the job's shell gets the full environment through
  ``execve``. When the daemon's block is too short to hold those (not seen in practice),
  ``start`` returns None and the runner execs the wrapper as before.
* "whole or absent" start, as with the exec'd wrapper: the child writes ``started.<attempt>``
  (its pid, temp file + rename) before it spawns the job. A daemon killed after the fork
  leaves a marked child that runs the job and that the next daemon adopts (by the file, or by
  marker before the file exists); one killed before it leaves a claim that is requeued at no
  cost (no started file): no job lost or doubled.
* an early word that the slot is free: the child keeps one of the daemon's fds, the write end
  of ``Runner.ended``'s pipe, and writes its pid there the moment the job's process ends,
  before it writes the exit code (fsync, rename) and exits (tearing down a copy of the
  daemon's address space): the daemon starts the next job meanwhile and settles this one
  once the wrapper is gone, as before.
* no share in the daemon's state. The child never returns into the daemon's code (it ends in
  ``os._exit``), turns the garbage collector off (a collected SQLite connection must never
  checkpoint from a second process) and closes every inherited fd, the daemon's flock among
  them (but the ended pipe), so a new daemon can start while jobs of a dead one run on.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from typing import Dict, List, Optional

from orchestrator.agent import jobwrap

try:  # stdlib, but a Python built without it still runs jobs (the exec'd wrapper)
    import ctypes
except ImportError:  # pragma: no cover - never seen on a supported host
    ctypes = None  # type: ignore[assignment]

_MEM: Optional[tuple] = None  # (env_start, env_end, arg_start, arg_end) of this process, read once


def _layout() -> Optional[tuple]:
    """Where the kernel reads ``environ`` and ``cmdline`` in this process (``/proc/self/stat``
    fields 48-51, Linux >= 3.5); a fork has the same addresses."""
    global _MEM
    if _MEM is None:
        try:
            with open("/proc/self/stat", "rb") as f:
                rest = f.read().rsplit(b") ", 1)[1].split()
            # rest[0] is field 3; arg_start..env_end are fields 48..51
            _MEM = (int(rest[47]), int(rest[48]), int(rest[45]), int(rest[46]))
        except (OSError, IndexError, ValueError):
            _MEM = (0, 0, 0, 0)
    return _MEM if _MEM[1] > _MEM[0] else None


def _block(items: List[str], size: int) -> Optional[bytes]:
    """``items`` NUL-separated and padded with NULs to ``size``; None when they do not fit."""
    raw = b"".join(i.encode("utf-8", "surrogateescape") + b"\0" for i in items)
    return raw + b"\0" * (size - len(raw)) if len(raw) <= size else None


def _identity(env: Dict[str, str], marker: str) -> Optional[tuple]:
    """The bytes the child writes over its environ and cmdline blocks; None when the marker
    and run dir do not fit (the caller execs the wrapper instead)."""
    mem = _layout()
    if mem is None or ctypes is None:
        return None
    env_size, arg_size = mem[1] - mem[0], mem[3] - mem[2]
    keys = [marker, "GPURUN_RUN_DIR", "GPURUN_JOB_ID", "GPURUN_ATTEMPT"]  # the first two are required
    items = ["%s=%s" % (k, env[k]) for k in keys if k in env]
    envb = _block(items, env_size) or _block(items[:2], env_size)
    if envb is None:
        return None
    # ``ps`` shows what this process is, not a second "agent daemon"
    argb = _block(["gpurun-jobwrap", env.get(marker, "")], arg_size) or _block(["gpurun-jobwrap"], arg_size)
    return envb, argb


class Ended:
    """The pipe forked wrappers write their pid to when their job's process ends (``w``, kept
    by every wrapper); the daemon selects on ``fd``. Both ends non-blocking: a wrapper never
    waits on a daemon that is busy or gone, and a full pipe only costs the early word."""

    def __init__(self) -> None:
        self.fd, self.w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self.w, False)

    def read(self) -> List[int]:
        """The pids written since the last read (4 bytes each: one atomic pipe write)."""
        out: List[int] = []
        try:
            while True:
                data = os.read(self.fd, 4096)
                if not data:
                    break
                out.extend(int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data) - 3, 4))
        except (BlockingIOError, InterruptedError):
            pass
        return out


class Child:
    """A forked wrapper as ``Runner.children`` holds it: ``pid`` and a ``poll`` that reaps."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it is gone all the same
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = jobwrap._status_code(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """``Popen.wait``'s contract, for code that held an exec'd wrapper."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("wrapper %d still running" % self.pid)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]


def start(args: List[str], env: Dict[str, str], marker: str, ended_fd: Optional[int] = None) -> Optional[Child]:
    """Fork a wrapper for ``args`` (jobwrap's five: started, exit, log, cwd, command) with the
    job's environment ``env``; None when this host cannot (the caller execs one). The child
    keeps ``ended_fd`` (``jobwrap.run``'s) and no other inherited fd. Raises OSError when the
    fork itself fails."""
    ident = _identity(env, marker)
    if ident is None:
        return None
    try:  # the log exists once the start is recorded, as it did with the exec'd wrapper
        os.close(os.open(args[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError:
        pass  # the wrapper meets the same error and the attempt ends with it
    mem = _layout()
    envb, argb = ident
    own = ctypes.string_at(mem[0], len(envb))  # type: ignore[union-attr]
    # Born marked: the daemon's own block names the job for the length of the fork (no other
    # thread reads markers, and the sweep skips the agent's pid), so the child carries the
    # marker from its first instant, as an exec'd wrapper does, with no round trip to set it.
    ctypes.memmove(mem[0], envb, len(envb))  # type: ignore[union-attr]
    try:
        pid = os.fork()
    except BaseException:
        ctypes.memmove(mem[0], own, len(own))  # type: ignore[union-attr]
        raise
    if pid == 0:
        _child(args, env, argb, ended_fd)  # never returns
    ctypes.memmove(mem[0], own, len(own))  # type: ignore[union-attr]
    return Child(pid)


def _child(args: List[str], env: Dict[str, str], argb: Optional[bytes], ended_fd: Optional[int]) -> None:
    code = 1
    try:
        gc.disable()
        os.setsid()
        signal.set_wakeup_fd(-1)  # the daemon's pipe: a signal here must not wake the daemon
        for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)  # jobwrap.run sets its own TERM/HUP/INT
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # every inherited fd goes: the store's, the daemon lock (a flock shared by fork would
        # keep the next daemon out), client sockets
        if ended_fd is None or ended_fd < 3:
            os.closerange(3, 1 << 20)
        else:
            os.closerange(3, ended_fd)
            os.closerange(ended_fd + 1, 1 << 20)
        if argb is not None:
            ctypes.memmove(_layout()[2], argb, len(argb))  # type: ignore[index,union-attr]
        # writes ``started`` (this pid, whole or absent) before it spawns the job, as the
        # exec'd wrapper does: the marker is already in this process's /proc environ
        jobwrap.run(*args[:5], env=env, write_started=True, ended_fd=ended_fd)
        code = 0
    except BaseException:  # noqa: BLE001 - never unwind into the daemon's loop
        code = 1
    finally:
        os._exit(code)
