"""The agent daemon's loop: sleeps on a wakeup fd, runs the runner's pass and the periodic hooks.

A job exit (SIGCHLD) or a client verb (SIGUSR1) wakes it at once, so the next job starts
within milliseconds while an idle agent costs nothing; with ``agent.idle_exit_minutes`` set
(the local profile) an idle one exits on its own. Its control files and idempotent start
live in ``orchestrator.agent.control``.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import sys
import time
import traceback
from typing import Optional

from orchestrator.agent import diskfull
from orchestrator.agent import states as S
from orchestrator.agent.context import AgentContext
from orchestrator.agent.control import ensure_lock, files, idle_exit_s, last_activity, load_config, write_atomic
from orchestrator.agent.migrations import StoreTooNew
from orchestrator.agent.periodic import Periodic
from orchestrator.agent.runner import Runner
from orchestrator.agent.store import Store

IDLE_TICK_S = 2.0   # the longest an idle daemon sleeps: it wakes sooner when something is due
BUSY_TICK_S = 0.5
# the shortest idle sleep: an idle exit refused because a command holds the ensure lock is
# tried again this often, not in a busy loop
MIN_TICK_S = 0.1
# A pass that starts a job leaves its other work (sweep, periodic hooks) to a pass this much
# later, so the new job's start does not share two cores with it (issue 15, the gap).
YIELD_S = 0.02


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
        from orchestrator.agent.secrets import RedactingStream
        # agent.log never holds a secret value, and a write to it never raises: on a full disk
        # the log is the first thing to fail, and the daemon must outlive it (issue 14)
        sys.stderr = diskfull.SafeStream(RedactingStream(sys.stderr, self.state_dir))
        sys.stdout = diskfull.SafeStream(sys.stdout)
        store = self._open_store()
        if store is None:
            return 1
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
        config = load_config(self.state_dir)
        runner = Runner(store, self.state_dir, config, [sys.executable or "python3", self.pyz])
        disk = diskfull.DiskWatch(self.state_dir, lambda ev: self._notify(config, ev))  # config: as reloaded
        try:  # a line of history; on a full disk it is lost, never the daemon
            store.add_event(None, "agent_start", "info", "agent %s started (pid %d)" % (self.build, os.getpid()),
                            {"boot_id": runner.boot})
        except Exception as exc:  # noqa: BLE001
            if not diskfull.is_full(exc):
                raise
        reconciled = False  # reconcile writes too: on a full disk it is retried by the loop
        periodic = self._periodic_runner(store, runner, config, self.state_dir)
        config_mtime = self._mtime()
        self.busy_at = time.time()  # the idle clock starts with the daemon
        started_at = 0.0  # monotonic time of the last pass that started a job
        deferred = 0      # passes in a row that left their other work to a later one
        yielded = False   # this pass did (the next wakes after YIELD_S at the latest)
        while not self.stop:
            try:
                mt = self._mtime()
                if mt != config_mtime:
                    config_mtime = mt
                    runner.config = periodic.ctx.config = config = load_config(self.state_dir)
                if not reconciled:
                    runner.reconcile()
                    reconciled = True
                # a pass that starts a job, or comes within YIELD_S of one (the ended job's
                # settle), leaves its other work to a later pass, but never three in a row: a
                # stream of short jobs still gets its sweeps
                young = deferred < 2 and time.monotonic() - started_at < YIELD_S
                runner.step(yield_to_start=deferred < 2, defer=young)
                if runner.launched:
                    started_at = time.monotonic()
                yielded = deferred < 2 and (bool(runner.launched) or young)
                deferred = deferred + 1 if yielded else 0
                if not yielded:
                    periodic.run()
                    disk.check()          # full though nothing failed this pass: still full
                    disk.passed(store)    # no longer full: the events it could not write, now
                    if self._idle_exit(store, runner, config, fd):
                        return 0
            except Exception as exc:
                self._sweep(runner)  # a pass cut short still stops the leftovers of ended jobs
                if diskfull.is_full(exc):
                    # SQLite's "database or disk is full", ENOSPC: back off and try again;
                    # the job wrappers keep their exit codes meanwhile
                    self._pause(disk.full(exc))
                    continue
                # A bug in one pass must not kill the agent that guards running jobs.
                sys.stderr.write(traceback.format_exc())
                sys.stderr.flush()
                time.sleep(1.0)
            busy = bool(runner.pids) or runner.sweeper.busy
            self._sleep(rfd, runner.ended_pipe.fd, YIELD_S if yielded else BUSY_TICK_S if busy else
                        self._idle_tick(periodic, config), yielded)
        try:
            store.add_event(None, "agent_stop", "info", "agent stopped (pid %d); jobs keep running" % os.getpid())
        except Exception as exc:  # noqa: BLE001 - a full disk loses the line, not the clean exit
            if not diskfull.is_full(exc):
                raise
        store.close()
        return 0

    def _sleep(self, wake_fd: int, ended_fd: int, timeout: float, yielded: bool) -> None:
        """Wait for a signal (the wakeup fd), a job's end (the ended pipe: its slot is free,
        ``Runner.ended``) or ``timeout``. After a pass that left its work for later, a wrapper's
        exit alone (SIGCHLD: the job before, settling) waits for the pass due anyway, so that
        the settle does not take the CPU the new job's start needs."""
        end = time.monotonic() + timeout
        while True:
            try:
                ready = select.select([wake_fd, ended_fd], [], [], max(0.0, timeout))[0]
            except InterruptedError:
                ready = [wake_fd]
            got = b""
            try:
                while True:
                    chunk = os.read(wake_fd, 512)
                    if not chunk:
                        break
                    got += chunk
            except (BlockingIOError, InterruptedError):
                pass
            timeout = end - time.monotonic()
            if not (yielded and ready == [wake_fd] and got and set(got) == {signal.SIGCHLD} and timeout > 0
                    and not self.stop):
                return

    def _idle_tick(self, periodic: Periodic, config: dict) -> float:
        """How long an idle daemon sleeps: until the next periodic hook is due or its idle exit
        would come (``agent.idle_exit_minutes``), at most ``IDLE_TICK_S``. A hook due in 0.3 s
        runs in 0.3 s, not at the next 2 s tick, and an idle exit comes at its minute, not up
        to a tick later; the daemon wakes no more often than with a fixed tick."""
        now = time.time()
        # past entries are hooks that run at every pass (the final quality checks): not a reason to wake
        wake = min([now + IDLE_TICK_S] + [due for due in periodic.due.values() if due > now])
        limit = idle_exit_s(config)
        if limit:
            wake = min(wake, max(self.busy_at, last_activity(self.state_dir) or 0.0) + limit)
        return min(IDLE_TICK_S, max(MIN_TICK_S, wake - now))

    def _open_store(self) -> Optional[Store]:
        """The store, waiting out a full disk (nothing can be done without it, and the lock is
        held, so no second daemon starts meanwhile); None for a database from a newer agent."""
        pause = 0.25
        while not self.stop:
            try:
                # the store first: a database from a newer agent is refused before this build claims the box
                return Store(self.f["db"])
            except StoreTooNew as exc:
                sys.stderr.write("gpurun agent %s: %s\n  hint: %s\n" % (self.build, exc, exc.hint))
                return None
            except Exception as exc:  # noqa: BLE001
                if not diskfull.is_full(exc):
                    raise
                diskfull.write_health(self.state_dir, {"disk_full": True, "since": time.time(), "error": str(exc)})
                self._pause(pause)
                pause = min(4.0, pause * 2)
        return None

    @staticmethod
    def _sweep(runner: Runner) -> None:
        """The sweep's tick (signals only; its history line is dropped when the store fails),
        which the runner's pass reaches only at its end."""
        try:
            runner.sweeper.tick()
        except Exception:  # noqa: BLE001 - never a reason to stop guarding jobs
            pass

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake for a stop request (a signal handler sets it), or as soon as a disk
        that ``statvfs`` showed full has room again: the jobs that ended meanwhile are recorded
        then, not at the end of a backoff of up to 4 s that a briefly freed disk may not outlast.
        A write that fails while ``statvfs`` shows room (a quota) keeps the whole backoff."""
        end = time.time() + seconds
        seen_full = False
        while not self.stop and time.time() < end:
            full = diskfull.full_free(self.state_dir) is not None
            if seen_full and not full:
                return
            seen_full = seen_full or full
            time.sleep(min(0.1, max(0.0, end - time.time())))

    def _notify(self, config: dict, event: dict) -> None:
        """Send one event from memory (the events table may not take it: a full disk), through
        the same notifier as ``agent/notifications`` (one per state dir and config)."""
        if not config.get("notify"):
            return
        from orchestrator.agent import notify
        n = notify.notifier_for(self.state_dir, config, state_dir=self.state_dir)
        if n is not None:
            n.send(event)

    def _idle_exit(self, store: Store, runner: Runner, config: dict, lock_fd: int) -> bool:
        """Exit when nothing was queued or running and no verb came for ``agent.idle_exit_minutes``.

        A local agent left behind by a demo should not run forever; the next command starts
        a new one. Off (0/absent) on remote profiles, whose watchdog and autostop must keep
        running. The exit is decided again under the ensure lock, and the daemon lock is given
        up before that lock is, so a verb that is ensuring right now either keeps this daemon
        (it touched ``activity`` first) or finds none and starts one (``control.ensure_lock``)."""
        limit = idle_exit_s(config)
        if not limit:
            return False
        now = time.time()
        if runner.pids or any(store.count_states(S.ACTIVE).values()):
            self.busy_at = now
            return False
        if now - max(self.busy_at, last_activity(self.state_dir) or 0.0) < limit:
            return False
        with ensure_lock(self.state_dir, wait=False) as held:
            if not held:
                return False  # someone is ensuring right now: that is activity
            if any(store.count_states(S.ACTIVE).values()) or \
                    time.time() - (last_activity(self.state_dir) or 0.0) < limit:
                return False
            store.add_event(None, "agent_stop", "info", "agent exited after %s idle minute(s) (pid %d); the next "
                            "gpurun command starts it again" % ("%g" % (limit / 60.0), os.getpid()),
                            {"cause": "idle"})
            store.close()
            os.close(lock_fd)  # the daemon lock goes first, while the ensure lock is still held
        return True

    def _mtime(self) -> float:
        try:
            return os.stat(self.f["config"]).st_mtime
        except OSError:
            return 0.0

    def _on_stop(self, *_: object) -> None:
        self.stop = True

    @staticmethod
    def _periodic_runner(store: Store, runner: Runner, config: dict, state_dir: str) -> Periodic:
        return Periodic(AgentContext(state_dir, store, config, runner))
