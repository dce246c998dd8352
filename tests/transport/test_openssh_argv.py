"""Push (rsync through the transport) and pull (rsync fetcher) build one OpenSSH argv with
one host-key policy. They used to differ: pull fell back to ``~/.ssh/known_hosts`` and
OpenSSH's default policy when gpurun's known_hosts did not exist yet, and ignored
``insecure_host_key``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.sync.transfer import ssh_argv_for
from orchestrator.transport.hostkeys import default_known_hosts
from orchestrator.transport.openssh import host_argv
from orchestrator.transport.ssh import SSHTransport
from orchestrator.transport.ssh_sync import openssh_args

pytest.importorskip("paramiko")


def _opts(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-o")


ENTRIES = [
    {"name": "plain", "ssh": {"hostname": "10.0.0.5", "port": 2222, "user": "root"}},
    {"name": "keyed", "ssh": {"hostname": "gpu.example", "user": "me", "key": "~/.ssh/id_gpu"}},
    {"name": "jump", "ssh": {"hostname": "10.0.0.9", "user": "me", "proxy_jump": "bastion@jump.example:2200"}},
    {"name": "ipv6", "ssh": {"hostname": "::1", "port": 2201, "user": "u"}},
    {"name": "insecure", "ssh": {"hostname": "h", "user": "u"}, "insecure_host_key": True},
]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_push_and_pull_build_the_same_ssh_command(isolated_home, entry):
    assert not default_known_hosts().exists()  # the case where pull used to go lax
    push = openssh_args(SSHTransport(entry))
    pull, target = ssh_argv_for(entry, str(default_known_hosts()))
    assert pull == push
    assert _opts(pull) == _opts(push)
    t = SSHTransport(entry).endpoint
    assert target.startswith(t.user + "@") and t.hostname in target
    opts = _opts(push)
    if entry.get("insecure_host_key"):
        assert opts["StrictHostKeyChecking"] == "no"
    else:
        assert opts["StrictHostKeyChecking"] == "yes"
        assert opts["UserKnownHostsFile"] == str(default_known_hosts())
    assert "-F" in push and push[push.index("-F") + 1] == "/dev/null"  # ~/.ssh/config read once, by us


def test_jump_hops_carry_the_same_policy(isolated_home):
    argv, _ = host_argv(ENTRIES[2])
    proxy = _opts(argv)["ProxyCommand"]
    assert "StrictHostKeyChecking=yes" in proxy and f"UserKnownHostsFile={default_known_hosts()}" in proxy


def test_alias_from_ssh_config_resolves_the_same_for_both(isolated_home):
    (isolated_home / ".ssh" / "config").write_text("Host gpubox\n  HostName 192.0.2.7\n  Port 2022\n  User alice\n")
    entry = {"name": "aliased", "ssh": {"alias": "gpubox"}}
    push = openssh_args(SSHTransport(entry))
    pull, target = ssh_argv_for(entry)
    assert pull == push and target == "alice@192.0.2.7"
    assert push[push.index("-p") + 1] == "2022"


def test_pull_argv_refuses_a_changed_key_and_accepts_the_recorded_one(sshd, isolated_home):
    entry = sshd.host_entry()
    kh = Path(default_known_hosts())
    kh.parent.mkdir(parents=True, exist_ok=True)
    name, _, _ = sshd.host_key_line().split(" ", 2)
    # a recorded key for this host that is not the one it offers: a changed key
    kh.write_text(f"{name} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHd1cm9uZ2tleXdyb25na2V5d3JvbmdrZXl3cm9u\n")
    argv, target = ssh_argv_for(entry, str(kh))
    bad = subprocess.run(argv + [target, "true"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0
    kh.write_text("")
    sshd.trust(kh)
    ok = subprocess.run(argv + [target, "true"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
