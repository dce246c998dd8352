"""Large files over SSH as one stream (``sync.stream``), against the real loopback sshd: the
bytes arrive hashed in one pass, through a chatty login shell, resumed from a partial, a bad
prefix is thrown away and fetched again, and a box without ``tail`` falls back to rsync."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from pullrig import chown_to

from orchestrator.errors import TransportError
from orchestrator.sync import engine
from orchestrator.sync.direct import quiet
from orchestrator.sync.engine import pull_job
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.state import JobRecord
from orchestrator.sync.stream import ssh_stream
from orchestrator.sync.transfer import RsyncFetcher, ssh_argv_for

pytestmark = [pytest.mark.ssh]


def box_file(host: dict, name: str, size: int) -> tuple[Path, str]:
    work = Path(host["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    path = work / name
    data = os.urandom(size)
    path.write_bytes(data)
    chown_to(work, host["ssh"]["user"])
    chown_to(path, host["ssh"]["user"])
    return path, hashlib.sha256(data).hexdigest()


def job_of(path: Path, digest: str, rel: str = "checkpoints/model.bin") -> dict:
    return {"id": "j1", "name": "s", "state": "succeeded", "terminal": True, "pending": [],
            "files": [{"path": rel, "remote": str(path), "kind": "checkpoint", "unit": rel.split("/")[1],
                       "size": path.stat().st_size, "mtime": path.stat().st_mtime, "sha256": digest}]}


def fetcher_for(host: dict, **kw) -> RsyncFetcher:
    from orchestrator.transport.hostkeys import default_known_hosts

    argv, target = ssh_argv_for(host, str(default_known_hosts()))
    return RsyncFetcher(argv, target, **kw)


@pytest.fixture
def one_by_one(monkeypatch):
    monkeypatch.setattr(engine, "BATCH_FILE_MAX", -1)  # every file takes the large-file path


def test_stream_through_a_chatty_shell_resumes_and_verifies(noisy_ssh_host: dict, tmp_path: Path, one_by_one):
    src, digest = box_file(noisy_ssh_host, "model.bin", 6_000_000)
    root = tmp_path / "home" / "j1"
    partial = root / ".gpurun-partial" / "checkpoints" / "model.bin"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(src.read_bytes()[:2_400_000])  # a pull killed at 40 %
    fetcher = fetcher_for(noisy_ssh_host)
    assert not quiet(fetcher._ssh_list(), fetcher.target)  # probed (by an earlier pass): the marked pipe
    res = pull_job(job_of(src, digest), root, fetcher, KeepPolicy(), host="noisy")
    assert res.verified and res.pulled == ["checkpoints/model.bin"], res.as_dict()
    final = root / "checkpoints" / "model.bin"
    assert hashlib.sha256(final.read_bytes()).hexdigest() == digest  # the .bashrc noise is not in it
    assert not partial.exists()
    # only the missing 60 % crossed the link (plus the marker line)
    assert 3_600_000 <= res.wire_bytes < 3_600_100, res.wire_bytes
    assert JobRecord(root).files["checkpoints/model.bin"]["method"] == "ssh-stream"


def test_a_bad_prefix_is_dropped_and_the_file_fetched_again(ssh_host: dict, tmp_path: Path, one_by_one):
    src, digest = box_file(ssh_host, "odd name $(x) 'q'.bin", 3_000_000)
    root = tmp_path / "home" / "j1"
    partial = root / ".gpurun-partial" / "checkpoints" / "model.bin"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 1_000_000)  # not the file's first MB: the hash must say so
    res = pull_job(job_of(src, digest), root, fetcher_for(ssh_host), KeepPolicy(), host="box")
    assert res.verified and not res.failed, res.as_dict()
    assert hashlib.sha256((root / "checkpoints" / "model.bin").read_bytes()).hexdigest() == digest


def test_a_vanished_file_fails_that_file_with_the_box_s_words(ssh_host: dict, tmp_path: Path):
    src, _digest = box_file(ssh_host, "gone.bin", 1000)
    src.unlink()
    part = tmp_path / "p" / "gone.bin"
    f = fetcher_for(ssh_host)
    with pytest.raises(TransportError) as err:
        ssh_stream(f._ssh_list(), f.target, str(src), part, 1000, lambda _n: None, 60)
    assert "No such file" in str(err.value)


def test_a_box_without_tail_is_pulled_with_rsync(tmp_path: Path):
    """A 'box' reached through a shell whose PATH has no tail (a real sh, here): the stream
    says it cannot (exit 127), and the same fetcher pulls the file with rsync."""
    src = tmp_path / "box" / "m.bin"
    src.parent.mkdir()
    data = os.urandom(200_000)
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    # ``ssh ARGS target COMMAND`` -> sh -c 'PATH=/nonexistent; eval "$2"' ... target COMMAND;
    # rsync calls it as ``-e`` too: ``... target rsync --server ...`` (then PATH is kept)
    fake_ssh = tmp_path / "fake-ssh"
    fake_ssh.write_text('#!/bin/sh\nshift\ncase "$1" in\n  rsync*) exec sh -c "$*" ;;\n'
                        '  *) PATH=/nonexistent; eval "$1" ;;\nesac\n')
    fake_ssh.chmod(0o755)
    f = RsyncFetcher([str(fake_ssh)], "box", fast_cipher=False)
    assert ssh_stream(f._ssh_list(), "box", str(src), tmp_path / "p1", len(data), lambda _n: None, 60) is None
    root = tmp_path / "home" / "j1"
    res = pull_job(job_of(src, digest), root, f, KeepPolicy(), host="box")
    assert res.verified, res.as_dict()
    assert f.stream is False
    assert JobRecord(root).files["checkpoints/model.bin"]["method"] == "rsync"


def test_a_shell_that_cannot_run_the_command_means_rsync_but_a_dead_link_is_an_error(tmp_path: Path):
    odd = tmp_path / "odd-shell"
    odd.write_text("#!/bin/sh\necho 'fish: Unsupported use of ;' >&2\nexit 2\n")  # no marker, exit 2
    odd.chmod(0o755)
    assert ssh_stream([str(odd)], "box", "/x", tmp_path / "p", 10, lambda _n: None, 60) is None
    dead = tmp_path / "dead-link"
    dead.write_text("#!/bin/sh\necho 'ssh: connect to host box port 22: Connection refused' >&2\nexit 255\n")
    dead.chmod(0o755)
    with pytest.raises(TransportError) as err:
        ssh_stream([str(dead)], "box", "/x", tmp_path / "p", 10, lambda _n: None, 60)
    assert "Connection refused" in str(err.value)
