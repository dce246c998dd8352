"""SSHTransport against the real loopback sshd: run/put/get as root, a clean user and a
user whose .bashrc prints noise; env and quoting; reconnects; timeouts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import ConnectError, TransportError
from orchestrator.transport.base import Transport
from orchestrator.transport.ssh import SSHTransport

pytestmark = pytest.mark.ssh

EVIL = "a b;$(touch PWNED)`id`'q\"&|*"


def test_run_exit_codes_stdout_stderr(any_ssh_host):
    with SSHTransport(any_ssh_host) as t:
        assert isinstance(t, Transport)
        r = t.run("echo out; echo err >&2; exit 7")
        assert r.exit_code == 7
        assert r.stdout.splitlines()[-1] == "out"
        assert r.stderr.splitlines()[-1] == "err"
        assert t.run("id -un").stdout.splitlines()[-1] == any_ssh_host["ssh"]["user"]


def test_stdin_large_payload_roundtrip(ssh_host):
    payload = "".join(f"line {i} \u00e9\n" for i in range(60000))  # ~0.8 MB
    with SSHTransport(ssh_host) as t:
        r = t.run("cat", input=payload)
        assert r.exit_code == 0
        assert r.stdout == payload
        r = t.run("head -c 3000000 /dev/zero | tr '\\0' x")  # output larger than a window
        assert len(r.stdout) == 3000000


def test_env_values_are_quoted(ssh_host, tmp_path):
    with SSHTransport(ssh_host) as t:
        r = t.run('printf "%s" "$GPURUN_X"', env={"GPURUN_X": EVIL}, timeout=20)
        assert r.stdout.endswith(EVIL)
        home = t.run("pwd").stdout.strip().splitlines()[-1]
        assert t.run(f"ls {home}/PWNED 2>/dev/null").exit_code != 0


def test_put_get_atomic_with_metacharacter_paths(any_ssh_host, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00\x01payload" * 1000)
    src.chmod(0o750)
    remote_dir = f"{any_ssh_host['workdir']}/{EVIL}"
    remote = f"{remote_dir}/f {EVIL}.bin"
    with SSHTransport(any_ssh_host) as t:
        t.put(str(src), remote)
        t.put(str(src), remote)  # replaces in place
        back = tmp_path / "back" / "b.bin"
        t.get(remote, str(back))
        assert back.read_bytes() == src.read_bytes()
        listing = [p.name for p in Path(remote_dir).iterdir()]
        assert listing == [f"f {EVIL}.bin"]  # no temp files left behind
        assert (Path(remote).stat().st_mode & 0o777) == 0o750
        assert not list(Path(any_ssh_host["workdir"]).rglob("PWNED"))


def test_put_relative_to_home(ssh_host, sshd, tmp_path):
    src = tmp_path / "x.txt"
    src.write_text("hello")
    name = f"gpurun-test-{sshd.run_id}-rel/x.txt"
    with SSHTransport(ssh_host) as t:
        t.put(str(src), f"~/{name}")
        assert t.run(f"cat ~/{name}").stdout.endswith("hello")
        t.run(f"rm -rf ~/gpurun-test-{sshd.run_id}-rel")


def test_reconnects_after_connections_are_cut(ssh_host, sshd):
    with SSHTransport(ssh_host) as t:
        assert t.run("echo one").stdout.strip().endswith("one")
        assert sshd.kill_connections() >= 1
        time.sleep(0.2)
        assert t.run("echo two").stdout.strip().endswith("two")
        sshd.restart()
        sshd.kill_connections()
        assert t.run("echo three").stdout.strip().endswith("three")


def test_lost_link_during_command_is_not_retried(ssh_host, sshd):
    marker = Path(ssh_host["workdir"]) / "ran"
    with SSHTransport(ssh_host) as t:
        t.run(f"mkdir -p {ssh_host['workdir']}")
        errors: list[BaseException] = []

        def go():
            try:
                t.run(f"echo x >> {marker}; sleep 20")
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        th = threading.Thread(target=go)
        th.start()
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sshd.kill_connections()
        th.join(30)
        assert len(errors) == 1 and type(errors[0]) is TransportError
        assert "may have run" in errors[0].hint
        assert marker.read_text() == "x\n"  # ran exactly once, never re-sent


def test_command_timeout(ssh_host):
    with SSHTransport(ssh_host) as t:
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="timed out"):
            t.run("sleep 30", timeout=1)
        assert time.monotonic() - t0 < 5
        assert t.run("echo ok").exit_code == 0


def test_wrong_port_fails_fast_with_one_line(ssh_host, free_port_):
    bad = {**ssh_host, "ssh": {**ssh_host["ssh"], "port": free_port_}}
    t0 = time.monotonic()
    with pytest.raises(ConnectError) as ei:
        SSHTransport(bad, connect_timeout=3).check()
    assert time.monotonic() - t0 < 3.5
    assert "connection refused" in str(ei.value) and "\n" not in str(ei.value)
    assert ei.value.hint


def test_dead_host_fails_within_connect_timeout(ssh_host, sshd):
    sshd.freeze()
    try:
        t0 = time.monotonic()
        with pytest.raises(ConnectError) as ei:
            SSHTransport(ssh_host, connect_timeout=2).check()
        took = time.monotonic() - t0
    finally:
        sshd.thaw()
    assert took < 3.0, took
    assert "\n" not in str(ei.value)


@pytest.fixture
def free_port_():
    from rigs.sshd import free_port

    return free_port()
