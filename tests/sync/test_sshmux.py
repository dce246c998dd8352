"""One SSH connection for a pull pass's rsyncs (``sync.sshmux``), against the real loopback sshd:
with two jobs or more, the rsyncs after the first go through an OpenSSH master (``ssh -O check``
finds it), the files arrive whole, and ``close`` (or a ``kill -9`` of gpurun) leaves no master
and no socket folder behind. One job, or a client that is not OpenSSH's ``ssh``, never starts
one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pullrig import chown_to

from orchestrator.sync.sshmux import MuxRsyncFetcher
from orchestrator.sync.transfer import ssh_argv_for

pytestmark = [pytest.mark.ssh]


def _argv(host: dict) -> tuple[list[str], str]:
    from orchestrator.transport.hostkeys import default_known_hosts
    return ssh_argv_for(host, str(default_known_hosts()))


def _box_dir(host: dict, name: str, files: dict) -> Path:
    d = Path(host["workdir"]) / name
    d.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (d / rel).write_text(text)
        chown_to(d / rel, host["ssh"]["user"])
    for p in (d, d.parent):
        chown_to(p, host["ssh"]["user"])
    return d


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(pred, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while not pred():
        assert time.time() < end, "not within %ss: %s" % (timeout, what)
        time.sleep(0.05)


def test_a_pass_over_two_jobs_shares_one_master_and_leaves_nothing(ssh_host: dict, tmp_path: Path):
    argv, target = _argv(ssh_host)
    a = _box_dir(ssh_host, "job-a", {"m.txt": "a" * 1000})
    b = _box_dir(ssh_host, "job-b", {"m.txt": "b" * 2000})
    f = MuxRsyncFetcher(argv, target)
    f.expect(2)
    rc, _, err = f.fetch_tree(str(a), ["m.txt"], tmp_path / "a")   # the master starts beside it
    assert rc == 0, err
    mux = f._mux
    assert mux is not None
    sock = mux._socket()
    _wait(lambda: os.path.exists(sock), 15, "the master's socket")
    check = subprocess.run([argv[0], "-O", "check", "-o", "ControlPath=" + sock, *argv[1:], target],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and "Master running" in check.stderr, check.stderr
    assert "ControlPath=" + sock in f._ssh_command()                  # the next rsync goes through it
    rc, _, err = f.fetch_tree(str(b), ["m.txt"], tmp_path / "b")
    assert rc == 0, err
    assert (tmp_path / "a/m.txt").read_text() == "a" * 1000 and (tmp_path / "b/m.txt").read_text() == "b" * 2000
    folder, pid = mux._dir, mux._group.proc.pid
    f.close()
    assert not os.path.exists(folder) and not _alive(pid)
    assert "ControlPath" not in f._ssh_command()                      # closed: each connects alone again


def test_one_job_or_another_client_never_starts_a_master(ssh_host: dict):
    argv, target = _argv(ssh_host)
    f = MuxRsyncFetcher(argv, target)
    f.expect(1)
    assert f._mux is None and "ControlPath" not in f._ssh_command()
    wrapped = MuxRsyncFetcher(["/usr/local/bin/my-ssh-wrapper", *argv[1:]], target)
    wrapped.expect(5)
    assert wrapped._mux is None


CHILD = r'''
import json, os, sys, time
from orchestrator.sync.sshmux import MuxRsyncFetcher
argv, target, src, dest = json.loads(sys.argv[1])
f = MuxRsyncFetcher(argv, target)
f.expect(2)
rc, _, err = f.fetch_tree(src, ["m.txt"], __import__("pathlib").Path(dest))
end = time.time() + 15
while not os.path.exists(f._mux._socket()) and time.time() < end:
    time.sleep(0.05)
print(json.dumps({"rc": rc, "dir": f._mux._dir, "pid": f._mux._group.proc.pid}), flush=True)
time.sleep(600)
'''


def test_a_kill_9_of_gpurun_takes_the_master_and_its_folder(ssh_host: dict, tmp_path: Path):
    argv, target = _argv(ssh_host)
    a = _box_dir(ssh_host, "job-k", {"m.txt": "k" * 500})
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps([argv, target, str(a), str(tmp_path / "k")])],
                             stdout=subprocess.PIPE, text=True)
    try:
        got = json.loads(child.stdout.readline())
        assert got["rc"] == 0 and os.path.exists(os.path.join(got["dir"], "m")) and _alive(got["pid"])
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        _wait(lambda: not os.path.exists(got["dir"]) and not _alive(got["pid"]), 10, "master and folder gone")
    finally:
        if child.poll() is None:
            child.kill()
