"""Many small files: one rsync per source dir, every file still hashed before its final name."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from orchestrator.sync import transfer
from orchestrator.sync.engine import pull_job
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.transfer import RsyncFetcher


def tree(tmp: Path, n: int = 60) -> dict:
    run = tmp / "box" / "run"
    files = []
    for i in range(n):
        p = run / f"samples/{i % 4}" / f"s-{i:03d}.dat"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = (b"%d " % i) * (50 + i)
        p.write_bytes(data)
        files.append({"path": "run/" + p.relative_to(run).as_posix(), "remote": str(p), "kind": "evidence",
                      "size": len(data), "mtime": 0, "sha256": hashlib.sha256(data).hexdigest()})
    return {"id": "j", "name": "j", "state": "succeeded", "terminal": True, "pending": [], "files": files}


def test_one_rsync_for_many_files_resumes_and_rejects_bad(tmp_path: Path, monkeypatch):
    job = tree(tmp_path)
    root = tmp_path / "home"
    bad = job["files"][5]
    bad["sha256"] = "0" * 64          # the box's bytes do not match its manifest
    half = job["files"][7]
    staged = root / ".gpurun-partial" / half["path"]
    staged.parent.mkdir(parents=True)
    staged.write_bytes(Path(half["remote"]).read_bytes()[:10])  # an earlier pull died here
    calls = []
    real = subprocess.Popen
    monkeypatch.setattr(transfer.subprocess, "Popen", lambda argv, **kw: calls.append(argv) or real(argv, **kw))
    res = pull_job(job, root, RsyncFetcher(), KeepPolicy(), host="h")
    calls = [a for a in calls if a[0] == "rsync"]  # each also has its group watcher (a /bin/sh)
    batch = [a for a in calls if "--files-from=-" in a]
    assert len(batch) == 1                      # one rsync for the whole tree
    assert len(calls) == 1 + 2                  # + two single-file tries of the bad one
    assert [f["path"] for f in res.failed] == [bad["path"]] and not res.verified
    assert not (root / bad["path"]).exists()    # never under its final name unverified
    assert not (root / ".gpurun-partial" / bad["path"]).exists()
    for f in job["files"]:
        if f is not bad:
            assert hashlib.sha256((root / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    assert not staged.exists()
    bad["sha256"] = hashlib.sha256(Path(bad["remote"]).read_bytes()).hexdigest()
    again = pull_job(job, root, RsyncFetcher(), KeepPolicy(), host="h")
    assert again.verified and again.pulled == [bad["path"]] and again.skipped == len(job["files"]) - 1


def test_a_link_that_breaks_once_is_tried_again_and_twice_is_a_failure(tmp_path: Path, monkeypatch):
    """rsync's exit 12 (its data stream broke: a busy sshd dropping sessions past MaxStartups) is
    tried once more at once; a link broken twice fails the files, none under its final name."""
    from orchestrator.sync import engine
    monkeypatch.setattr(engine, "LINK_RETRY_PAUSE_S", 0.0)
    job = tree(tmp_path, 12)
    real = subprocess.Popen
    broken = {"left": 1}

    def popen(argv, **kw):
        if argv[0] == "rsync" and "--files-from=-" in argv and broken["left"]:
            broken["left"] -= 1
            return real(["sh", "-c", "cat >/dev/null; echo 'rsync error: error in rsync protocol data stream "
                                     "(code 12)' >&2; exit 12"], **kw)
        return real(argv, **kw)

    monkeypatch.setattr(transfer.subprocess, "Popen", popen)
    res = pull_job(job, tmp_path / "home", RsyncFetcher(), KeepPolicy(), host="h")
    assert not res.failed and len(res.pulled) == 12 and res.verified   # the second try brought all
    broken["left"] = 2
    root = tmp_path / "home2"
    res = pull_job(job, root, RsyncFetcher(), KeepPolicy(), host="h")
    assert len(res.failed) == 12 and "exit 12" in res.failed[0]["reason"] and not res.verified
    assert not any((root / f["path"]).exists() for f in job["files"])
