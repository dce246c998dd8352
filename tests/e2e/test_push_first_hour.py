"""`gpurun push` as a newcomer meets it: real counts after a real rsync over the loopback sshd,
``.gitignore`` honoured by rsync and by the tar fallback alike, and a plain word for the local
host (its jobs run where they are submitted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import hosts as hostinv
from rigs.agents import gpurun

FILES = {"train.py": "print('hi')\n" * 10, "lib/util.py": "U = 1\n", ".gitignore": "*.egg-info/\n/build/\n",
         "mypkg.egg-info/PKG-INFO": "Name: mypkg\n", "build/lib/train.py": "stale copy\n",
         "lib/build/keep.py": "K = 2\n",          # /build/ is anchored: this one is source
         "data/.gitignore": "raw/\n*.npy\n", "data/raw/big.bin": "x" * 5000, "data/x.npy": "n",
         "data/README": "how to get the data\n", "lib/__pycache__/u.pyc": "x"}
SENT = sorted([".gitignore", "data/.gitignore", "data/README", "lib/build/keep.py", "lib/util.py", "train.py"])


def project(root: Path) -> Path:
    for rel, body in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    return root


def on_box(work: Path) -> list[str]:
    return sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())


def push_json(host: str, root: Path) -> dict:
    res = gpurun("push", "--host", host, str(root), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.ssh
def test_rsync_push_reports_real_counts_and_honours_gitignore(ssh_host, tmp_path):
    root = project(tmp_path / "proj")
    out = push_json(ssh_host["name"], root)
    work = Path(ssh_host["workdir"])
    assert out["method"] == "rsync" and on_box(work) == SENT
    assert out["files"] == len(SENT) and out["bytes"] == sum(len(FILES[f]) for f in SENT)
    again = push_json(ssh_host["name"], root)
    assert again["files"] == 0 and again["bytes"] == 0 and again["code_hash"] == out["code_hash"]
    (root / "train.py").write_text("print('changed')\n")
    res = gpurun("push", "--host", ssh_host["name"], str(root))
    assert res.returncode == 0, res.stderr
    assert "?" not in res.stdout and "files: 1  bytes: 17 (changed files only)" in res.stdout


@pytest.mark.ssh
def test_tar_fallback_leaves_out_the_same_files(ssh_host, tmp_path):
    hostinv.update_host(ssh_host["name"], ssh={**ssh_host["ssh"], "rsync_path": "/nonexistent/rsync"})
    root = project(tmp_path / "proj")
    out = push_json(ssh_host["name"], root)
    assert out["method"] == "tar" and "rsync missing on the box" in out["fallback_reason"]
    assert on_box(Path(ssh_host["workdir"])) == SENT
    assert out["files"] == len(SENT) and out["bytes"] == sum(len(FILES[f]) for f in SENT)


def test_push_to_local_says_jobs_run_where_submitted(isolated_home, tmp_path):
    root = project(tmp_path / "proj")
    res = gpurun("push", str(root))
    assert res.returncode == 0, res.stderr
    assert "no workdir" not in res.stderr and "run in the directory you submit them from" in res.stdout
    doc = json.loads(gpurun("push", str(root), "--json").stdout)
    assert doc["method"] == "none" and doc["remote_dir"] is None and doc["files"] == 0
    # with --to, the local host copies, with the same leaving-out and real counts
    dest = tmp_path / "copy"
    doc = json.loads(gpurun("push", str(root), "--to", str(dest), "--json").stdout)
    assert on_box(dest) == SENT and doc["files"] == len(SENT)


def test_hash_and_walk_follow_gitignore(tmp_path):
    from orchestrator.core.push import local_tree_hash

    root = project(tmp_path / "proj")
    before = local_tree_hash(root)
    assert before["files"] == len(SENT)
    (root / "mypkg.egg-info" / "SOURCES.txt").write_text("rebuilt")
    assert local_tree_hash(root)["hash"] == before["hash"]   # build output changes nothing
