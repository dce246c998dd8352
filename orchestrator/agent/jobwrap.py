"""The per-job wrapper: runs one attempt of a job and records its exit code durably.

The daemon starts this as a session leader (its own process group) with the job's marker in
its environment. It survives the daemon's death, so a job re-adopted after an agent crash
still gets its exit code written (``exit.<attempt>``, via temp file + fsync + rename).

The daemon normally forks into it (``agent/spawn``: no interpreter start at all, the job's
environment passed to ``run``); where it cannot, it execs this module. It sits between one
job's end and the next one's start, so it starts lean: the daemon runs it
with ``python3 -S`` (no site-packages scan) and it imports only ``os``, ``signal``, ``sys`` and
``time`` (``posix_spawn`` of the shell, not ``subprocess``, which costs more to import than
the whole wrapper's work). A command line of plain words is spawned without its shell, as
bash would exec it (``agent/plainexec``: the rule, and why the job cannot tell).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Optional

from orchestrator.agent import plainexec


def shell() -> str:
    return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"


def job_env(base: "dict", job: "dict", attempt: int, state_dir: str, secret_env: "dict", hidden: "list",
            marker: "tuple") -> "dict":
    """The environment one attempt of ``job`` runs with, on any host (the runner's launch, the
    Slurm wrapper): ``base`` less the secrets it did not ask for (``hidden``), its ``env.``
    options, its secrets, gpurun's variables and its ``marker`` (name, token)."""
    env = {k: v for k, v in base.items() if k not in hidden}
    env.update({k: str(v) for k, v in (job.get("env") or {}).items()})
    env.update(secret_env)
    env.update({"GPURUN_JOB_ID": job["id"], "GPURUN_JOB_NAME": str(job["name"]), "GPURUN_RUN_DIR": job["run_dir"],
                "GPURUN_ATTEMPT": str(attempt), marker[0]: marker[1],
                "GPURUN_ENV_FILE": os.path.join(state_dir, "env.sh"), "PYTHONUNBUFFERED": "1"})
    # W&B writes its runs under the job's run dir, where the quality check looks, unless the
    # user chose a dir (env. or the agent's environment; a profile's env.sh export wins too)
    env.setdefault("WANDB_DIR", job["run_dir"])
    return env


def job_script(command: str, env: "dict") -> str:
    """The shell script of a job: its command, after the host's ``env.sh`` when there is one."""
    env_file = env.get("GPURUN_ENV_FILE", "")
    if env_file and os.path.exists(env_file):
        return '. "$GPURUN_ENV_FILE"\n' + command
    return command


def write_exit(path: str, code: int, sync: bool = True) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % code)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_durably(path: str, code: int, sync: bool = True) -> None:
    """``write_exit``, retried while the disk is full (ENOSPC, EDQUOT), the code held in memory
    meanwhile: the wrapper outlives its job until the code is on disk, so the runner (which
    settles only once the wrapper is gone) never takes a lost code for a failure (issue 14).
    A cancel's KILL still ends the wait. Any other error is raised, as before."""
    pause = 0.05
    while True:
        try:
            write_exit(path, code, sync)
            return
        except OSError as exc:
            if exc.errno not in (28, 122):  # ENOSPC, EDQUOT (``errno`` unimported: a lean start)
                raise
        time.sleep(pause)
        pause = min(2.0, pause * 2)


def _status_code(status: int) -> int:
    """``subprocess``'s convention: the exit status, or minus the signal that killed it."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


def _spawn(path: str, argv: list, log_fd: int, env: dict) -> int:
    """Start ``path`` with ``argv`` in this process's directory (the job's: the caller moved
    there), stdin from /dev/null, stdout and stderr to the log.

    ``posix_spawn`` (vfork + exec): a wrapper forked from the daemon holds the daemon's pages,
    and a ``fork`` here would copy their tables again between one job's end and the next one's
    start. A start that fails raises OSError."""
    # Python ignores SIGPIPE and SIGXFSZ; the job gets the defaults (as subprocess does). The
    # wrapper's own handlers for TERM/HUP/INT are reset to the default by exec.
    dfl = [getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, n)]
    return os.posix_spawn(path, argv, env, setsigdef=dfl, file_actions=[
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2)])


def _start_job(script: str, cwd: str, log_fd: int, env: dict) -> int:
    """Start the job in ``cwd``: a plain line directly (``plainexec``), anything else, and a
    plain line whose spawn fails, through the shell, which reports the failure as it would
    anyway (``command not found``, 127). The wrapper has no working directory of its own, so
    it moves there itself (every path it writes is absolute). Raises OSError: the caller logs
    it, 127."""
    if cwd:
        os.chdir(cwd)
    sh = shell()
    direct = plainexec.argv_env(script, env, sh)
    if direct is not None:
        try:
            return _spawn(direct[0], direct[1], log_fd, direct[2])
        except OSError:
            pass  # bash says what is wrong with it, in its words and with its exit code
    return _spawn(sh, [sh, "-c", script], log_fd, env)


def run(started_file: str, exit_file: str, log_file: str, cwd: str, command: str,
        env: Optional[dict] = None, write_started: bool = True, ended_fd: Optional[int] = None) -> int:
    """Run one attempt. ``env`` is the job's environment (this process's when None);
    ``write_started`` False when the caller wrote that file; ``ended_fd``: the daemon's pipe
    (``agent/spawn``), told this pid the moment the job's process has ended, so the daemon
    can start the next job on the slot while this wrapper writes the code durably (the job
    is settled only once this wrapper is gone, as before)."""
    env = os.environ if env is None else env
    # absolute before ``_spawn`` moves this process into the job's directory
    started_file, exit_file, log_file = (os.path.abspath(p) for p in (started_file, exit_file, log_file))
    # A Python handler (not SIG_IGN) so the child gets default dispositions after exec,
    # while the wrapper lives on to record the exit code when the group is TERMed.
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    done = []  # set once the real code is known: a late TERM must not overwrite it

    def on_term(*_: object) -> None:
        # A TERM to the group (cancel, timeout, quality stop) is followed by a KILL after the
        # grace, and that KILL ends this wrapper too, before it can write anything (bug 14:
        # exit_code null). So the code that KILL means is written now, and replaced by the
        # real one if the child exits within the grace.
        if not done:
            try:
                write_exit(exit_file, -signal.SIGKILL, sync=False)  # no fsync: within the grace
            except OSError:
                pass
    signal.signal(signal.SIGTERM, on_term)
    if write_started:
        write_durably(started_file, os.getpid(), sync=False)  # whole or absent: "never started" stays true
    script = job_script(command, env)
    with open(log_file, "ab", buffering=0) as log:
        try:  # a full disk loses the line; the job still runs
            log.write(("--- gpurun: attempt %s started %s in %s\n" % (
                env.get("GPURUN_ATTEMPT", "?"), time.strftime("%Y-%m-%dT%H:%M:%S%z"), cwd)).encode())
        except OSError:
            pass
        try:
            pid = _start_job(script, cwd, log.fileno(), dict(env))
        except OSError as exc:
            log.write(("--- gpurun: could not start: %s\n" % exc).encode())
            done.append(127)
            write_durably(exit_file, 127)
            return 127
        while True:
            try:
                _, status = os.waitpid(pid, 0)  # retried after a signal handler runs (PEP 475)
                break
            except InterruptedError:
                continue
        code = _status_code(status)
        done.append(code)
        if ended_fd is not None:
            try:  # 4 bytes: one atomic pipe write, never split between two wrappers
                os.write(ended_fd, os.getpid().to_bytes(4, "little"))
            except OSError:
                pass  # a full pipe or a daemon gone: the slot frees when this wrapper exits
        try:  # on a full disk this line is lost, and the exit code must still be tried
            log.write(("--- gpurun: exit code %d at %s\n" % (code, time.strftime("%Y-%m-%dT%H:%M:%S%z"))).encode())
        except OSError:
            pass
    write_durably(exit_file, code)
    return code


def main(argv: list) -> int:
    started_file, exit_file, log_file, cwd, command = argv[:5]
    run(started_file, exit_file, log_file, cwd, command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
