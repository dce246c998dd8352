"""Code sync over SSH: rsync, and the tar / SFTP fallbacks when rsync is missing or broken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.transport import ssh_sync
from orchestrator.transport.excludes import Matcher
from orchestrator.transport.ssh import SSHTransport

pytestmark = pytest.mark.ssh

EXCLUDES = [".git/", "__pycache__/", "*.pyc", "/data/", "**/secret*"]


def make_tree(root: Path) -> None:
    for rel, body in {"train.py": "print(1)\n", "pkg/mod.py": "x = 2\n",
                      "pkg/__pycache__/mod.cpython-311.pyc": "junk", "pkg/old.pyc": "junk",
                      ".git/HEAD": "ref", "data/big.bin": "0" * 100, "pkg/data/keep.txt": "k",
                      "conf/secret.env": "TOKEN", "we ird $(x) 'q'.txt": "w"}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    os.symlink("train.py", root / "link.py")


def kept(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir()}


EXPECTED = {"train.py", "pkg/mod.py", "pkg/data/keep.txt", "we ird $(x) 'q'.txt", "link.py"}


@pytest.mark.parametrize("how", ["rsync", "no-rsync-on-box", "no-rsync-here"])
def test_sync_methods(ssh_host, tmp_path, monkeypatch, how):
    src = tmp_path / "proj"
    make_tree(src)
    entry = dict(ssh_host)
    if how == "no-rsync-on-box":
        entry["ssh"] = {**entry["ssh"], "rsync_path": "/nonexistent/rsync"}
    if how == "no-rsync-here":
        monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    dest = f"{ssh_host['workdir']}/code $(touch PWNED)"
    with SSHTransport(entry) as t:
        stats = t.sync(str(src), dest, excludes=EXCLUDES)
        assert stats["method"] == ("rsync" if how == "rsync" else "tar")
        assert kept(Path(dest)) == EXPECTED
        assert os.readlink(Path(dest) / "link.py") == "train.py"
        assert stats["files"] == len(EXPECTED) - 1
        if how == "rsync":
            (src / "pkg" / "mod.py").unlink()
            (Path(dest) / "checkpoints-excluded").mkdir()
            t.sync(str(src), dest, excludes=EXCLUDES + ["checkpoints-excluded/"])
            assert not (Path(dest) / "pkg" / "mod.py").exists()  # mirrored deletion
            assert (Path(dest) / "checkpoints-excluded").is_dir()  # excluded: kept
        else:
            assert "rsync missing" in stats["fallback_reason"]
    assert not list(Path(ssh_host["workdir"]).rglob("PWNED"))


def test_noisy_bashrc_breaks_rsync_so_tar_is_used(noisy_ssh_host, tmp_path):
    src = tmp_path / "proj"
    make_tree(src)
    with SSHTransport(noisy_ssh_host) as t:
        stats = t.sync(str(src), noisy_ssh_host["workdir"] + "/code", excludes=EXCLUDES)
    assert stats["method"] == "tar"
    assert "rsync failed" in stats["fallback_reason"]
    assert kept(Path(noisy_ssh_host["workdir"]) / "code") == EXPECTED


def test_sftp_fallback(ssh_host, tmp_path):
    """Boxes with neither rsync nor tar still get their code (file by file over SFTP)."""
    src = tmp_path / "proj"
    make_tree(src)
    with SSHTransport(ssh_host) as t:
        dest = ssh_host["workdir"] + "/sftp-code"
        t.run(f"mkdir -p '{dest}'")
        stats = ssh_sync._sftp(t, src, dest, Matcher(EXCLUDES))
    assert stats["method"] == "sftp" and stats["files"] == len(EXPECTED) - 1
    assert kept(Path(dest)) == EXPECTED
    assert (Path(dest) / "we ird $(x) 'q'.txt").read_text() == "w"
