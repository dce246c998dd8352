"""A full destination disk during `pull` (bug 4): one line naming the place and what is needed,
exit 1, code ``disk_full``; the partial is kept and the next pull, with room, resumes from it.
Tested on a REAL small filesystem: a 2 MiB tmpfs mounted for the test."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.agent.manifest import build_manifest
from orchestrator.errors import DiskFull
from orchestrator.sync import engine
from orchestrator.sync.engine import pull_job
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.transfer import LocalFetcher, RsyncFetcher
from rigs.agents import gpurun, kill_agents_under


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 2 MiB tmpfs (root only; skipped with the reason where mounting is not allowed)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({res.stderr.strip() or 'not root'}): "
                    "a full disk cannot be made real")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def grow(mnt: Path, size: str = "16m") -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


def no_tmp_files(root: Path) -> None:
    left = [p for p in root.rglob("*") if ".tmp-" in p.name]
    assert not left, left


def big_job(tmp: Path, mb: int = 3) -> dict:
    ck = tmp / "box" / "ck"
    ck.mkdir(parents=True)
    (ck / "model.bin").write_bytes(os.urandom(mb << 20))
    (ck / "small.json").write_text('{"ok": 1}')
    job = {"id": "jf", "name": "full", "state": "succeeded", "checkpoints": str(ck)}
    return build_manifest(str(tmp / "state"), [job], settle_s=0)["jobs"][0]


def stream_fetcher(tmp: Path) -> RsyncFetcher:
    """The large-file stream (``sync.stream``) through an "ssh" that runs the box's command
    here with a real shell (and rsync's server argv as it is, should it fall back)."""
    fake = tmp / "fake-ssh"
    fake.write_text('#!/bin/sh\nshift\nif [ "$#" -eq 1 ]; then exec sh -c "$1"; fi\nexec "$@"\n')
    fake.chmod(0o755)
    return RsyncFetcher([str(fake)], "box", fast_cipher=False)


@pytest.mark.parametrize("kind", ["local", "rsync", "stream"])
def test_full_disk_is_one_error_and_the_partial_resumes(small_fs: Path, tmp_path: Path, kind, monkeypatch):
    if kind == "stream":
        monkeypatch.setattr(engine, "BATCH_FILE_MAX", -1)  # model.bin takes the large-file path
    make = {"local": LocalFetcher, "rsync": RsyncFetcher, "stream": lambda: stream_fetcher(tmp_path)}[kind]
    man = big_job(tmp_path)
    root = small_fs / "h" / "full"
    with pytest.raises(DiskFull) as err:
        pull_job(man, root, make(), KeepPolicy(), host="h")
    msg = str(err.value)
    assert msg.startswith(f"no space left on {small_fs}") and " needed for job full" in msg and "\n" not in msg
    assert err.value.code == "disk_full" and err.value.exit_code == 1
    partial = root / ".gpurun-partial" / "checkpoints" / "model.bin"
    kept = partial.stat().st_size
    assert 0 < kept < 3 << 20                       # what arrived stays for the resume
    assert not (root / "checkpoints" / "model.bin").exists()   # nothing unverified under its name
    no_tmp_files(small_fs)
    grow(small_fs)
    fetcher = make()
    res = pull_job(man, root, fetcher, KeepPolicy(), host="h")
    assert res.verified and not res.failed
    if kind != "rsync":
        assert res.wire_bytes <= (3 << 20) - kept + 100   # resumed, not restarted
    if kind == "stream":
        assert fetcher.stream  # it streamed (no fall back to rsync)
    f = next(x for x in man["files"] if x["path"].endswith("model.bin"))
    assert hashlib.sha256((root / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    no_tmp_files(small_fs)


@pytest.fixture
def box(isolated_home: Path, tmp_path: Path):
    from orchestrator import hosts

    hosts.add_host({"name": "box", "profile": "generic-ssh", "kind": "local",
                    "state_dir": str(tmp_path / "agent"), "workdir": str(tmp_path / "work")})
    yield "box"
    kill_agents_under(tmp_path)
    kill_agents_under(isolated_home)


def test_gpurun_pull_on_a_full_disk_says_one_line(box: str, small_fs: Path, tmp_path: Path):
    q = tmp_path / "q.txt"
    q.write_text("[name=big gpus=0 checkpoints=ck] mkdir -p ck && head -c 3000000 /dev/urandom > ck/model.bin\n")
    res = gpurun("queue", "submit", str(q), "--host", box, "--wait", cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    res = gpurun("pull", "--host", box, "--dest", str(small_fs))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    err = [x for x in lines if x.startswith("gpurun: error:")]
    assert len(err) == 1 and f"no space left on {small_fs}" in err[0] and "MB needed" in err[0], lines
    assert len(lines) <= 3, lines   # the error, its hint; no traceback, no per-file noise
    res = gpurun("pull", "--host", box, "--dest", str(small_fs), "--json")
    assert res.returncode == 1
    assert json.loads(res.stdout)["error"]["code"] == "disk_full"
    partials = [p for p in small_fs.rglob("*") if ".gpurun-partial" in p.parts and p.is_file()]
    assert partials and all(p.stat().st_size > 0 for p in partials)
    no_tmp_files(small_fs)
    grow(small_fs)
    res = gpurun("pull", "--host", box, "--dest", str(small_fs), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["done"]


def test_a_disk_already_full_to_the_last_block_is_the_same_one_line(small_fs: Path, tmp_path: Path):
    """Not one byte free before the pull starts: creating the job folder, the lock note and
    the record must end in the same DiskFull, with no .tmp-PID left behind."""
    man = big_job(tmp_path, mb=1)
    filler = small_fs / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    with pytest.raises(DiskFull):
        pull_job(man, small_fs / "h" / "full", LocalFetcher(), KeepPolicy(), host="h")
    no_tmp_files(small_fs)
    filler.unlink()
    assert pull_job(man, small_fs / "h" / "full", LocalFetcher(), KeepPolicy(), host="h").verified


def test_a_read_only_destination_is_one_line_too(small_fs: Path, tmp_path: Path):
    from orchestrator.errors import OperationalError

    man = big_job(tmp_path, mb=1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    with pytest.raises(OperationalError) as err:
        pull_job(man, small_fs / "h" / "ro", LocalFetcher(), KeepPolicy(), host="h")
    assert "Read-only file system" in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 1 and "--dest" in err.value.hint
