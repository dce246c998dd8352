"""A job line of plain words is spawned without ``bash -c`` (``agent/plainexec``), and the job
cannot tell: the same environment, exit codes, messages and group signals as under bash.

Real processes throughout: the wrapper (``jobwrap.run``) in a forked child, the job's
programs, bash itself as the reference, and a real ``Runner`` for TERM and the KILL after
the grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from orchestrator.agent import jobwrap, plainexec, procs
from orchestrator.agent import states as S
from orchestrator.agent.runner import Runner, started_path
from orchestrator.agent.store import Store


def _wrap(tmp: Path, command: str, env: dict, cwd: Path) -> tuple:
    """Run one attempt through the wrapper in a forked child, as the daemon does; returns
    (exit code from the exit file, the job's output without the wrapper's lines)."""
    for name in ("started.1", "exit.1", "log.txt"):
        (tmp / name).unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            jobwrap.run(str(tmp / "started.1"), str(tmp / "exit.1"), str(tmp / "log.txt"), str(cwd), command,
                        env=env)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    log = (tmp / "log.txt").read_bytes()
    body = log.split(b"\n", 1)[1]  # after the "attempt started" line, before the "exit code" one
    return int((tmp / "exit.1").read_text()), body[:body.rfind(b"--- gpurun: exit code")]


def _bash_env(command: str, env: dict, cwd: Path) -> set:
    out = subprocess.run(["/bin/bash", "-c", command], env=env, cwd=cwd, capture_output=True).stdout
    return set(out.split(b"\0")) - {b""}


def test_a_plain_line_gets_the_environment_bash_would_pass_it(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (tmp_path / "bin").mkdir()
    os.symlink("/usr/bin/env", tmp_path / "bin" / "myenv")
    base = {k: v for k, v in os.environ.items() if not k.startswith("BASH_FUNC_") and k not in plainexec._ENV_KEYS}
    variants = [
        dict(base, PWD="/nonexistent", OLDPWD="/nonexistent/either"),  # stale PWD, OLDPWD not a dir
        dict({k: v for k, v in base.items() if k not in ("SHLVL", "PWD", "OLDPWD")}),
        dict(base, PWD=str(work), OLDPWD="sub", SHLVL="4", PATH=str(tmp_path / "bin") + "/:" + base["PATH"]),
    ]
    for env in variants:
        for line in ("env -0", "myenv -0", "/usr/bin/env -0"):
            if line == "myenv -0" and "/bin/:" not in env["PATH"]:
                continue
            monkeypatch.chdir(work)
            assert plainexec.argv_env(line, env, "/bin/bash") is not None, line
            code, out = _wrap(tmp_path, line, env, work)
            assert code == 0
            got = set(out.split(b"\0")) - {b""}
            assert got == _bash_env(line, env, work), (line, got ^ _bash_env(line, env, work))


def test_lines_that_need_bash_go_through_bash():
    env = dict(os.environ, PATH="/usr/bin:/bin")
    for line in ('/bin/echo "a b"', "echo a", "cd /tmp", "exec sleep 1", "time sleep 1", "A=1 env",
                 "ls $HOME", "ls *", "ls ~", "true; false", "a|b", "ls > x", "ls\tx", "ls \\x", "x\ny",
                 "if", "{ ls; }", "", "   ", "ls # note"):
        assert plainexec.argv_env(line, env, "/bin/bash") is None, line
    assert plainexec.argv_env("sleep 1", env, "/bin/sh") is None           # no bash: its own shell
    for extra in ({"BASH_ENV": "/x"}, {"BASH_FUNC_sleep%%": "() { :; }"}, {"SHELLOPTS": "xtrace"},
                  {"PATH": "/usr/bin::/bin"}, {"SHLVL": "abc"}, {"SHLVL": "1000"}):
        assert plainexec.argv_env("sleep 1", dict(env, **extra), "/bin/bash") is None, extra
    assert plainexec.argv_env("sleep 1", {k: v for k, v in env.items() if k != "PATH"}, "/bin/bash") is None
    assert plainexec.argv_env("sleep 1", env, "/bin/bash")[1] == ["sleep", "1"]
    assert jobwrap.job_script("sleep 1", {"GPURUN_ENV_FILE": __file__}).startswith(". ")  # env.sh: bash


def test_failures_read_as_bash_reports_them(tmp_path, monkeypatch):
    work = tmp_path / "w"
    work.mkdir()
    env = dict(os.environ)
    for name, text, mode in (("exit7", "#!/bin/sh\nexit 7\n", 0o755), ("noexec", "#!/bin/sh\nexit 0\n", 0o644),
                             ("nobang", "echo no shebang\nexit 4\n", 0o755)):
        (work / name).write_text(text)
        (work / name).chmod(mode)
    monkeypatch.chdir(work)
    assert _wrap(tmp_path, "./exit7 a b", env, work)[0] == 7
    code, out = _wrap(tmp_path, "gpurun-no-such-command-x arg", env, work)
    assert code == 127 and out == b"/bin/bash: line 1: gpurun-no-such-command-x: command not found\n"
    code, out = _wrap(tmp_path, "./noexec", env, work)
    assert code == 126 and b"./noexec: Permission denied" in out
    assert _wrap(tmp_path, "./nobang", env, work) == (4, b"no shebang\n")  # ENOEXEC: bash runs it
    assert _wrap(tmp_path, '/bin/echo "a  b"', env, work) == (0, b"a  b\n")  # quotes: through bash
    assert _wrap(tmp_path, "/bin/echo a  b", env, work) == (0, b"a b\n")


def test_a_plain_job_dies_of_term_to_its_group_and_kill_after_the_grace(tmp_path):
    """Through a real runner: ``sleep 30`` ends on the cancel's TERM (-15); a program that
    ignores TERM gets the KILL after the grace (-9), and nothing with the marker is left."""
    (tmp_path / "stubborn").write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.1; done\n")
    (tmp_path / "stubborn").chmod(0o755)
    store = Store(str(tmp_path / "gpurun.db"))
    tag = uuid.uuid4().hex[:8]
    jobs = [{"id": "plain-%s-%d" % (tag, i), "name": "plain-%s-%d" % (tag, i), "command": cmd,
             "cwd": str(tmp_path), "run_dir": str(tmp_path / "runs" / str(i)),
             "log": str(tmp_path / "runs" / str(i) / "log.txt")}
            for i, cmd in enumerate(("sleep 30", "./stubborn"))]
    store.insert_jobs(jobs)
    runner = Runner(store, str(tmp_path), {"slots": 2, "gpus": [], "kill_grace_s": 1},
                    [sys.executable, "-m", "orchestrator.agent"])
    try:
        runner.step()
        deadline = time.time() + 20
        while not all(os.path.exists(started_path(dict(j), 1)) for j in jobs) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the stubborn script has set its trap
        for j in jobs:
            assert store.update_fields(j["id"], [S.RUNNING], cancel_requested=1)
        while time.time() < deadline + 10:
            runner.step()
            done = [store.get_job(j["id"]) for j in jobs]
            if all(S.is_terminal(d["state"]) for d in done):
                break
            time.sleep(0.05)
        assert [(d["state"], d["exit_code"]) for d in done] == [(S.CANCELLED, -15), (S.CANCELLED, -9)], done
        time.sleep(0.3)
        left = [procs.find_marked().get(procs.token(j["id"], 1)) for j in jobs]
        assert left == [None, None]
    finally:
        for pid in runner.pids.values():
            procs.signal_group(pid, signal.SIGKILL)
