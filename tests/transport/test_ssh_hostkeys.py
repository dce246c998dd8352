"""Host keys: verified by default, recorded only on first contact, a changed key refused;
~/.ssh/config aliases and ProxyJump through a jump host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator import paths
from orchestrator.errors import HostKeyError
from orchestrator.transport.hostkeys import default_known_hosts
from orchestrator.transport.ssh import SSHTransport, first_contact

pytestmark = pytest.mark.ssh


def _fresh_entry(sshd, user):
    return sshd.host_entry(user, name="fresh")


def test_unknown_key_is_refused_by_default(sshd, isolated_home):
    entry = _fresh_entry(sshd, sshd.users[-1])
    with pytest.raises(HostKeyError, match="not recorded") as ei:
        SSHTransport(entry).check()
    assert "gpurun host add" in ei.value.hint
    assert not default_known_hosts().exists()


def test_first_contact_records_and_shows_fingerprint(sshd, isolated_home):
    entry = _fresh_entry(sshd, sshd.users[-1])
    ktype, fp = first_contact(entry)
    expected = subprocess.run(["ssh-keygen", "-lf", str(sshd.host_key) + ".pub"],
                              capture_output=True, text=True, check=True).stdout.split()[1]
    assert (ktype, fp) == ("ssh-ed25519", expected)
    kh = default_known_hosts()
    assert kh == paths.data_home() / "known_hosts"
    assert kh.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert first_contact(entry) == (ktype, fp)  # idempotent: no duplicate line
    assert len(kh.read_text().splitlines()) == 1
    with SSHTransport(entry) as t:
        assert t.run("echo ok").stdout.strip().endswith("ok")


def test_changed_key_is_refused(sshd, isolated_home, tmp_path):
    entry = _fresh_entry(sshd, sshd.users[-1])
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = Path(str(other) + ".pub").read_text().split()[:2]
    kh = default_known_hosts()
    kh.parent.mkdir(parents=True, exist_ok=True)
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    for call in (lambda: SSHTransport(entry).check(), lambda: first_contact(entry)):
        with pytest.raises(HostKeyError, match="CHANGED") as ei:
            call()
        assert f"{kh}:1" in str(ei.value)
        assert "ssh-keygen -R" in ei.value.hint
    assert len(kh.read_text().splitlines()) == 1  # TOFU never overwrites a recorded key


def test_insecure_skips_verification(sshd, isolated_home):
    entry = _fresh_entry(sshd, sshd.users[-1])
    with SSHTransport(entry, insecure=True) as t:
        assert t.run("true").exit_code == 0
    with SSHTransport({**entry, "insecure_host_key": True}) as t:
        assert t.run("true").exit_code == 0
    assert not default_known_hosts().exists()


def test_ssh_config_alias_and_proxyjump(ssh_host, sshd, isolated_home):
    user = ssh_host["ssh"]["user"]
    (isolated_home / ".ssh" / "config").write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.users[0]}\n"
        f"  IdentityFile {sshd.client_key}\n"
        f"Host gpubox\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {user}\n"
        f"  IdentityFile {sshd.client_key}\n"
        f"Host gpubox-via-jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {user}\n"
        f"  IdentityFile {sshd.client_key}\n  ProxyJump jumpbox\n")
    alias = {"name": "a", "kind": "ssh", "ssh": {"alias": "gpubox"},
             "workdir": ssh_host["workdir"], "state_dir": ssh_host["state_dir"]}
    with SSHTransport(alias) as t:
        assert t.endpoint.user == user and t.endpoint.port == sshd.port
        assert t.run("id -un").stdout.splitlines()[-1] == user
    jumped = {**alias, "ssh": {"alias": "gpubox-via-jump"}}
    with SSHTransport(jumped) as t:
        assert [j.user for j in t.endpoint.jumps] == [sshd.users[0]]
        assert t.run("id -un").stdout.splitlines()[-1] == user
        assert len(t._clients) == 2  # jump hop + target
        src = isolated_home / "proj"
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "m.py").write_text("x = 1\n")
        stats = t.sync(str(src), ssh_host["workdir"] + "/viajump")
        assert stats["method"] in ("rsync", "tar")
        assert (Path(ssh_host["workdir"]) / "viajump" / "pkg" / "m.py").read_text() == "x = 1\n"
    explicit = {**alias, "ssh": {"alias": None, "hostname": "127.0.0.1", "port": sshd.port,
                                 "user": user, "key": str(sshd.client_key),
                                 "proxy_jump": f"{sshd.users[0]}@127.0.0.1:{sshd.port}"}}
    with SSHTransport(explicit) as t:
        assert t.run("id -un").stdout.splitlines()[-1] == user
