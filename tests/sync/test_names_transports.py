"""Every file name a filesystem allows comes home, byte for byte, over every transport: the
local copy, rsync on this machine, rsync over a real loopback sshd (one batch and one file at
a time) and SFTP. Path traversal stays refused, for that file only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from orchestrator.agent.manifest import build_manifest
from orchestrator.sync import engine
from orchestrator.sync.engine import pull_job
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.transfer import LocalFetcher, RsyncFetcher, SftpFetcher, ssh_argv_for

# what AutoDL users and training scripts really write, and what a shell would misread
NAMES = ["模型.pt", "it's.pt", 'say "hi".pt', "hash#1.pt", "(paren).pt", "[br].pt", "b.pt", "r.pt",
         "semi;colon.pt", "with space.pt", " lead space.pt", "trail space .pt", "star*.pt", "q?.pt",
         "new\nline.pt", "-leading.pt", "--rsh=evil.pt", "$(touch pwned).pt", "`tick`.pt", "back\\slash.pt",
         "a:b.pt", "tab\t.pt", "%s%n.pt", "~tilde.pt", "\x1b[31mred.pt", "amp&pipe|.pt", "é.pt",
         "e\u0301.pt", "emoji-🚀.pt", "x" * 200 + ".pt", os.fsdecode(b"latin1-\xe9\xff.pt"),
         "子目录/模型 2.pt", "[dir]/*/q?.pt", "-dir/-x.pt"]


def make_box(tmp: Path) -> dict:
    """A finished job whose checkpoint dir holds every name above (distinct bytes each)."""
    ck = tmp / "box" / "ckpt"
    for i, name in enumerate(NAMES):
        p = ck / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"%d:" % i + os.fsencode(name) * 50 + os.urandom(64))
    job = {"id": "jn", "name": "names", "state": "succeeded", "checkpoints": str(ck)}
    man = build_manifest(str(tmp / "state"), [job], settle_s=0)["jobs"][0]
    assert len(man["files"]) == len(NAMES) and not man["skipped"]
    return man


def check_home(man: dict, root: Path, res) -> None:
    assert not res.failed and not res.refused, res.failed
    assert res.verified and res.complete
    assert sorted(res.pulled) == sorted(f["path"] for f in man["files"])
    for f in man["files"]:
        got = root / f["path"]
        assert hashlib.sha256(got.read_bytes()).hexdigest() == f["sha256"] == \
            hashlib.sha256(Path(f["remote"]).read_bytes()).hexdigest(), f["path"]
    assert not (root.parent / "pwned").exists() and not Path("pwned").exists()
    assert not any((root / ".gpurun-partial").rglob("*.pt"))  # nothing left staged


@pytest.mark.parametrize("make", [LocalFetcher, RsyncFetcher], ids=["local", "rsync-local"])
def test_every_name_pulls_home_on_this_machine(tmp_path: Path, make):
    man = make_box(tmp_path)
    root = tmp_path / "home" / "h" / "names"
    res = pull_job(man, root, make(), KeepPolicy(), host="h")
    check_home(man, root, res)
    again = pull_job(man, root, make(), KeepPolicy(), host="h")
    assert again.pulled == [] and again.skipped == len(NAMES)


@pytest.mark.ssh
@pytest.mark.parametrize("batch", [True, False], ids=["rsync-batch", "rsync-per-file"])
def test_every_name_pulls_home_over_ssh_rsync(root_ssh_host: dict, tmp_path: Path, monkeypatch, batch):
    from orchestrator.transport.hostkeys import default_known_hosts

    man = make_box(tmp_path)
    if not batch:
        monkeypatch.setattr(engine, "BATCH_FILE_MAX", -1)  # every file alone: rsync host:path argv
        # one ssh handshake per file: only the names that stress that argv (globs, quotes,
        # backslash, '-', ':', newline, bytes that are not UTF-8, a wildcard directory)
        tricky = {"[br].pt", "star*.pt", "q?.pt", "back\\slash.pt", "-leading.pt", "a:b.pt", "new\nline.pt",
                  "$(touch pwned).pt", NAMES[30], "子目录/模型 2.pt", "[dir]/*/q?.pt", "-dir/-x.pt"}
        man["files"] = [f for f in man["files"] if f["path"][len("checkpoints/"):] in tricky]
        assert len(man["files"]) == len(tricky)
    argv, target = ssh_argv_for(root_ssh_host, str(default_known_hosts()))
    root = tmp_path / "home" / "rootbox" / "names"
    res = pull_job(man, root, RsyncFetcher(argv, target), KeepPolicy(), host="rootbox")
    check_home(man, root, res)


@pytest.mark.ssh
def test_every_name_pulls_home_over_sftp(root_ssh_host: dict, tmp_path: Path):
    from orchestrator.core.session import open_session

    man = make_box(tmp_path)
    root = tmp_path / "home" / "rootbox" / "names"
    with open_session("rootbox") as s:
        res = pull_job(man, root, SftpFetcher(s.transport.sftp_session), KeepPolicy(), host="rootbox")
    check_home(man, root, res)


def test_traversal_refused_per_file_the_rest_comes_home(tmp_path: Path):
    man = make_box(tmp_path)
    outside = tmp_path / "home" / "h" / "evil.pt"
    man["files"][0] = dict(man["files"][0], path="checkpoints/../../evil.pt")
    man["files"][1] = dict(man["files"][1], path="/tmp/abs-evil.pt")
    root = tmp_path / "home" / "h" / "names"
    res = pull_job(man, root, LocalFetcher(), KeepPolicy(), host="h")
    assert sorted(res.refused) == ["/tmp/abs-evil.pt", "checkpoints/../../evil.pt"]
    assert len(res.pulled) == len(NAMES) - 2 and not res.verified
    assert not outside.exists() and not Path("/tmp/abs-evil.pt").exists()
    assert not (root / "PULL_VERIFIED.json").exists()  # a refused file keeps the job unvouched


def test_the_gate_counts_a_refused_path_missing_instead_of_failing(tmp_path: Path):
    """`down` re-reads every copy through ``file_home``; an unsafe path used to raise there,
    so `down` exited 1 even with --without-artifacts and the meter could not be stopped."""
    from orchestrator.core.teardown import file_home
    from orchestrator.sync.state import JobRecord

    rec = JobRecord(tmp_path / "job")
    for bad in ("../x.pt", "/abs.pt", "a/../../b.pt"):
        assert file_home(rec, {"path": bad, "size": 1, "sha256": "0" * 64}) is None
    (tmp_path / "job" / "checkpoints").mkdir(parents=True)
    (tmp_path / "job" / "checkpoints" / "模型 1.pt").write_bytes(b"w")
    good = {"path": "checkpoints/模型 1.pt", "size": 1, "sha256": hashlib.sha256(b"w").hexdigest()}
    assert file_home(rec, good) == "local"


@pytest.mark.parametrize("make", [LocalFetcher, RsyncFetcher], ids=["local", "rsync-local"])
def test_a_name_home_cannot_take_fails_alone(tmp_path: Path, make):
    """A local obstacle for one file (here a file where its folder should be; on an exFAT
    drive, a name with '?' or ':') fails that file with a reason; the rest lands, and once
    the obstacle is gone the verified partial lands without moving a byte again."""
    ck = tmp_path / "box" / "ck"
    (ck / "sub").mkdir(parents=True)
    (ck / "sub" / "x.pt").write_bytes(b"x" * 5000)
    for i in range(3):
        (ck / f"y{i}.pt").write_bytes(b"%d" % i * 5000)
    job = {"id": "jo", "name": "ob", "state": "succeeded", "checkpoints": str(ck)}
    man = build_manifest(str(tmp_path / "state"), [job], settle_s=0)["jobs"][0]
    root = tmp_path / "home" / "h" / "ob"
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "sub").write_text("a file the user left here")
    res = pull_job(man, root, make(), KeepPolicy(), host="h")
    assert [f["path"] for f in res.failed] == ["checkpoints/sub/x.pt"] and not res.verified
    assert "cannot write it here" in res.failed[0]["reason"]
    assert sorted(res.pulled) == [f"checkpoints/y{i}.pt" for i in range(3)]
    (root / "checkpoints" / "sub").unlink()
    again = pull_job(man, root, make(), KeepPolicy(), host="h")
    assert again.pulled == ["checkpoints/sub/x.pt"] and again.verified
    assert (root / "checkpoints" / "sub" / "x.pt").read_bytes() == b"x" * 5000
    if make is LocalFetcher:
        assert again.wire_bytes == 0  # the verified partial was kept, not fetched again
