"""The agent daemon's control files and its idempotent start: pidfile + flock + build file.

One daemon per state dir, proven by an exclusive flock held for its whole life. ``ensure``
is a no-op when a daemon of the same build holds the lock, and replaces an older build.
Verbs use ``wake`` to have the daemon act on a change at once, and ``touch_activity`` to keep
an idle daemon from exiting (``idle_exit_s``; ``ensure_lock`` keeps that exit race-free). Nothing here imports the
runner or the store, so the one-shot verb processes stay light and free of import circles.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import zlib
from typing import Iterator, Mapping, Optional

from orchestrator.agent.migrations import refuse_if_too_new
from orchestrator.agent.protocol import AGENT_START, VerbError

START_TIMEOUT_S = 15.0
# a daemon whose process still lives at START_TIMEOUT_S is slow, not broken (a loaded 2-core
# box, a cold disk): it is given up to this long before the start is called failed
SLOW_START_S = 90.0


def files(state_dir: str) -> dict:
    return {k: os.path.join(state_dir, v) for k, v in {
        "lock": "agent.lock", "pid": "agent.pid", "build": "agent.build", "log": "agent.log",
        "db": "gpurun.db", "config": "config.json",
        # held by ``ensure``, ``agent_stop`` and an idle daemon on its way out (see ``ensure_lock``)
        "ensure_lock": "agent.ensure.lock",
        # touched by every verb but agent_info/agent_stop: the idle clock of ``idle_exit_minutes``
        "activity": "agent.activity"}.items()}


def load_config(state_dir: str) -> dict:
    try:
        with open(files(state_dir)["config"]) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_atomic(path: str, text: str) -> None:
    """Write ``path`` whole through a temp file and a rename. On a full disk (the temp file
    gets no block) the existing file is rewritten in place instead: the daemon's pid and build
    files are a few bytes, and ``ensure`` must see a daemon that started (issue 14)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _rewrite_in_place(path, text.encode()):
            raise


def _rewrite_in_place(path: str, data: bytes) -> bool:
    """Overwrite an existing file's first bytes, then cut it to length: no block is freed
    before the new bytes are in (a shorter text frees, a longer one within its page fits)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


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


@contextlib.contextmanager
def ensure_lock(state_dir: str, wait: bool = True) -> Iterator[bool]:
    """Hold the ensure lock; yields False (without holding it) when ``wait`` is off and it is busy.

    A daemon that exits because it is idle takes this lock and gives up the daemon lock before
    letting go of it. ``ensure`` looks at the daemon lock only while holding this one, so it
    sees either a daemon that is staying (a verb touched ``activity`` before ensuring, which
    the exiting daemon re-reads under the lock) or none at all (and starts one): it never
    answers "running" for a daemon about to vanish."""
    fd = os.open(files(state_dir)["ensure_lock"], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if wait or exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the fd releases the flock


def touch_activity(state_dir: str) -> None:
    """Note that a verb came in now (the idle-exit clock restarts)."""
    path = files(state_dir)["activity"]
    try:
        with open(path, "a"):
            pass
        os.utime(path, None)
    except OSError:
        pass  # a full disk must not fail the verb; the daemon then only counts its own jobs


def last_activity(state_dir: str) -> Optional[float]:
    try:
        return os.stat(files(state_dir)["activity"]).st_mtime
    except OSError:
        return None


def started_at(state_dir: str) -> Optional[float]:
    """When the running daemon started: it writes its pid file once, at start."""
    try:
        return os.stat(files(state_dir)["pid"]).st_mtime
    except OSError:
        return None


def idle_exit_s(config: dict) -> float:
    """Seconds of idleness after which the daemon exits (0: never); ``agent.idle_exit_minutes``."""
    try:
        return max(0.0, float((config.get("agent") or {}).get("idle_exit_minutes") or 0) * 60.0)
    except (TypeError, ValueError, AttributeError):
        return 0.0


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


def ensure(state_dir: str, pyz: str, build: str, detach: str = "setsid", timeout: float = START_TIMEOUT_S) -> dict:
    """Make sure a daemon of ``build`` runs for ``state_dir``; returns what was done. The
    ``ensure`` verb asks the host's backend (``agent/backend``): only the daemon's comes here."""
    os.makedirs(state_dir, exist_ok=True)
    with ensure_lock(state_dir):
        return _ensure(state_dir, pyz, build, detach, timeout)


def _ensure(state_dir: str, pyz: str, build: str, detach: str, timeout: float) -> dict:
    info = running_daemon(state_dir)
    if info and info["build"] == build:
        return {"action": "none", "pid": info["pid"], "build": build}
    # an older agent must not stop a newer daemon it could not replace: check its store first
    refuse_if_too_new(files(state_dir)["db"])
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
    env, dropped = daemon_env(os.environ)
    log = open(files(state_dir)["log"], "ab")
    since = log.tell()  # the log is appended to: only this start's lines say why it failed
    if detach == "tmux" and _has("tmux"):
        session = "gpurun-agent-%08x" % zlib.crc32(state_dir.encode())  # stable across processes
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        # a running tmux server gives new sessions its own environment, not ours: unset by name
        unset = "".join("-u %s " % shlex.quote(n) for n in dropped)
        cmd = ("env %s" % unset if unset else "") + " ".join(shlex.quote(a) for a in argv) + \
            " >> %s 2>&1" % shlex.quote(files(state_dir)["log"])
        subprocess.run(["tmux", "new-session", "-d", "-s", session, cmd], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, env=env)
        proc = None  # tmux owns the process: only the timeout tells
    else:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    relaunches, yielded = 3, False
    from orchestrator.agent.diskfull import HINT, full_free  # here: verbs that start nothing skip sqlite3
    start = time.time()
    while True:
        info = running_daemon(state_dir)
        # the daemon we launched takes its lock before it writes its pid and build: until then
        # the files are the last daemon's (the same build after an idle exit), so ours must show
        if info and info["build"] == build and (proc is None or info["pid"] == proc.pid):
            log.close()
            return {"action": "replaced" if replaced else "started", "pid": info["pid"], "build": build,
                    "previous": replaced}
        waited = time.time() - start
        if proc is not None and proc.poll() == 0:
            # exit 0 at start is a daemon that found the lock taken (``daemon.run``): an old
            # daemon still on its way out, or a racing one whose build is not written yet. Not a
            # crash: wait for the lock's holder, and start again if it lets the lock go
            proc, yielded = None, True
        if yielded and info is None and relaunches:
            relaunches, yielded = relaunches - 1, False
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, env=env)
        died = proc is not None and proc.poll() is not None
        # a dead process fails now; a live one past the timeout is waited for up to SLOW_START_S
        if died or waited > timeout and (proc is None or waited > max(timeout, SLOW_START_S)
                                         or full_free(state_dir) is not None):  # 0 bytes free is full
            break
        time.sleep(0.02)
    log.close()
    # operational, not a bug: a slow disk, a full one, or a crash at start (the log says which)
    free = full_free(state_dir)
    if free is not None:  # the log is on that disk too: say it here
        raise VerbError("the agent daemon did not start within %ds: disk full (%s has %d KiB free)"
                        % (timeout, state_dir, free // 1024), AGENT_START, HINT % state_dir)
    what = ("the agent daemon exited at start (exit code %s)" % proc.returncode if died
            else "the agent daemon did not start within %ds" % (time.time() - start))
    last = _last_line(files(state_dir)["log"], since)
    raise VerbError(what + (": %s" % last if last else ""), AGENT_START,
                    "see the last lines of %s on the host; a full disk or a broken Python are the usual causes"
                    % files(state_dir)["log"])


def _last_line(path: str, since: int, limit: int = 300) -> str:
    """The log's last non-empty line written after offset ``since``, cut to ``limit`` characters
    ('' if none): the daemon's own words on why it did not start (a traceback ends with the
    exception)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(since, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def daemon_env(environ: "Mapping[str, str]") -> "tuple[dict, list]":
    """``(environment, dropped names)`` for a daemon: the caller's, less the names listed in
    ``GPURUN_DAEMON_SCRUB`` (set by the controller's local transport: the secrets of the user's
    shell, which local jobs must not inherit; see ``transport/local.py``). Empty over SSH."""
    dropped = [n for n in environ.get("GPURUN_DAEMON_SCRUB", "").split(",") if n]
    drop = set(dropped) | {"GPURUN_DAEMON_SCRUB"}
    return {k: v for k, v in environ.items() if k not in drop}, dropped


def _has(prog: str) -> bool:
    return any(os.access(os.path.join(p, prog), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep))
