"""The sshd rig itself: logins as every user, noise, stop/restart, cutting connections."""

from __future__ import annotations

import subprocess
import time

import pytest

from rigs.sshd import NOISY_USER

pytestmark = pytest.mark.ssh


def _ssh(rig, user, *cmd, timeout=20):
    return subprocess.run(rig.ssh_argv(user, *cmd), capture_output=True, text=True, timeout=timeout)


def test_login_as_every_user(sshd):
    for user in sshd.users:
        r = _ssh(sshd, user, "id -un")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == user


def test_noisy_user_prints_noise(sshd):
    if NOISY_USER not in sshd.users:
        pytest.skip("needs root")
    r = _ssh(sshd, NOISY_USER, "echo payload")
    assert r.stdout.startswith("Welcome to rented-box")
    assert r.stdout.rstrip().endswith("payload")
    assert "motd" in r.stderr


def test_restart_keeps_port_and_key(sshd):
    port, line = sshd.port, sshd.host_key_line()
    sshd.stop()
    r = _ssh(sshd, sshd.users[-1], "true", timeout=10)
    assert r.returncode == 255
    sshd.start()
    assert (sshd.port, sshd.host_key_line()) == (port, line)
    assert _ssh(sshd, sshd.users[-1], "true").returncode == 0


def test_kill_connections_cuts_live_session(sshd):
    p = subprocess.Popen(sshd.ssh_argv(sshd.users[-1], "sleep 30"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    killed = 0
    while time.monotonic() < deadline and not killed:
        time.sleep(0.1)
        killed = sshd.kill_connections()
    assert killed >= 1
    assert p.wait(timeout=10) == 255
