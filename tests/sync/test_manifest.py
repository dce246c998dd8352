"""The agent's manifest: hashing once, leaving growing and temp files out, job scoping."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from orchestrator.agent import manifest as M
from orchestrator.agent.store import Store
from orchestrator.agent.verbs_sync import v_manifest as manifest_verb


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def make_job(tmp: Path, state: str = "running") -> dict:
    run = tmp / "runs" / "j1"
    ck = tmp / "work" / "ckpt"
    run.mkdir(parents=True)
    (ck / "step-10").mkdir(parents=True)
    (run / "log.txt").write_text("hello\n")
    (run / "metrics.jsonl").write_text('{"step": 10, "loss": 1.0}\n')
    (ck / "step-10" / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (ck / "best.pt").write_bytes(b"best")
    (ck / "step-20.pt.tmp").write_bytes(b"half")
    (ck / ".tmp_save").write_bytes(b"x")
    (ck / ".model.swp").write_bytes(b"x")
    (ck / "latest.pt").symlink_to(ck / "best.pt")
    return {"id": "j1", "name": "exp", "state": state, "run_dir": str(run), "checkpoints": str(ck),
            "metrics": None}


def test_settled_files_listed_with_hashes_temp_and_symlinks_left_out(tmp_path: Path):
    job = make_job(tmp_path)
    clock = Clock()
    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=clock.sleep)
    (j,) = man["jobs"]
    paths = {f["path"]: f for f in j["files"]}
    assert set(paths) == {"checkpoints/best.pt", "checkpoints/step-10/model.safetensors",
                          "run/log.txt", "run/metrics.jsonl"}
    data = (tmp_path / "work/ckpt/step-10/model.safetensors").read_bytes()
    f = paths["checkpoints/step-10/model.safetensors"]
    assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["size"] == len(data)
    assert f["kind"] == "checkpoint" and f["unit"] == "step-10"
    assert paths["run/metrics.jsonl"]["kind"] == "metrics" and paths["run/log.txt"]["kind"] == "log"
    skipped = {s["path"]: s["reason"] for s in j["skipped"]}
    assert skipped == {"checkpoints/step-20.pt.tmp": "temp name", "checkpoints/.tmp_save": "temp name",
                       "checkpoints/.model.swp": "temp name", "checkpoints/latest.pt": "symlink"}
    assert j["pending"] == [] and j["complete"] is False and j["terminal"] is False


def test_growing_file_stays_pending_until_it_stops_changing(tmp_path: Path):
    job = make_job(tmp_path)
    grow = Path(job["run_dir"]) / "growing.log"
    clock = Clock()

    def sleep(s: float) -> None:
        clock.sleep(s)
        with open(grow, "a") as fh:  # "training" appends between the two polls
            fh.write("tick\n")

    grow.write_text("tick\n")
    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=sleep)
    (j,) = man["jobs"]
    assert "run/growing.log" not in {f["path"] for f in j["files"]}
    assert [p["path"] for p in j["pending"]] == ["run/growing.log"]
    # the writer went quiet: the next pass lists it
    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=clock.sleep)
    assert "run/growing.log" in {f["path"] for f in man["jobs"][0]["files"]}


def test_terminal_job_needs_no_second_poll_and_large_files_hash_once(tmp_path: Path, monkeypatch):
    job = make_job(tmp_path, state="succeeded")
    calls = []
    real = M.sha256_file
    monkeypatch.setattr(M, "sha256_file", lambda p, chunk=M.CHUNK: calls.append(p) or real(p, chunk))
    slept = []
    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=5.0, sleep=slept.append)
    assert slept == [] and man["jobs"][0]["complete"] is True and len(man["jobs"][0]["files"]) == 4
    first = len(calls)
    M.build_manifest(str(tmp_path / "state"), [job], settle_s=5.0, sleep=slept.append)
    assert first == 4 and len(calls) == 4  # cached by (size, mtime_ns)
    ck = tmp_path / "work/ckpt/best.pt"
    ck.write_bytes(b"better")
    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=5.0, sleep=slept.append)
    assert len(calls) == 5
    best = next(f for f in man["jobs"][0]["files"] if f["path"] == "checkpoints/best.pt")
    assert best["sha256"] == hashlib.sha256(b"better").hexdigest()


def test_manifest_verb_scopes_jobs_and_rejects_unknown_refs(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    store = Store(str(state / "gpurun.db"))
    run = state / "runs" / "abc"
    run.mkdir(parents=True)
    (run / "log.txt").write_text("x")
    store.insert_jobs([{"id": "abc", "name": "one", "command": "true", "run_dir": str(run),
                        "log": str(run / "log.txt")}])

    from orchestrator.agent.context import AgentContext

    ctx = AgentContext(str(state), store, {})
    reply = manifest_verb(ctx, {"jobs": ["one"], "settle_s": 0})
    assert [j["id"] for j in reply["jobs"]] == ["abc"]
    assert reply["schema"] == M.SCHEMA
    from orchestrator.agent.protocol import VerbError

    with pytest.raises(VerbError) as err:
        manifest_verb(ctx, {"jobs": ["nope"]})
    assert err.value.kind == "not_found"


def test_quiet_files_are_hashed_during_the_settle_wait_and_only_once(tmp_path: Path, monkeypatch):
    """A running job's files seen for the first time need a second poll; the ones already
    quiet (mtime older than settle_s) are hashed while it waits, not after it."""
    import time

    job = make_job(tmp_path)
    clock = Clock()
    clock.t = time.time() + 60  # every file was last written a minute ago
    events: list[tuple[str, str]] = []
    real = M.sha256_file
    monkeypatch.setattr(M, "sha256_file", lambda p, chunk=M.CHUNK: events.append(("hash", p)) or real(p, chunk))

    def sleep(s: float) -> None:
        events.append(("sleep", str(s)))
        clock.sleep(s)

    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=sleep)
    (j,) = man["jobs"]
    assert len(j["files"]) == 4 and j["pending"] == []
    assert [e[0] for e in events] == ["hash"] * 4 + ["sleep"], events  # hashed during the wait, once each
    data = (tmp_path / "work/ckpt/step-10/model.safetensors").read_bytes()
    f = next(x for x in j["files"] if x["path"] == "checkpoints/step-10/model.safetensors")
    assert f["sha256"] == hashlib.sha256(data).hexdigest()
    events.clear()
    M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=sleep)
    assert events == []  # settled and cached: no second poll, no hash


def test_a_file_changed_after_its_early_hash_is_hashed_again(tmp_path: Path):
    """The early hash is only a guess: a file rewritten during the wait (same size here) is
    hashed again once it settles, never listed with the old bytes' hash."""
    import time

    job = make_job(tmp_path)
    ck = tmp_path / "work/ckpt/best.pt"
    clock = Clock()
    clock.t = time.time() + 60

    def sleep(s: float) -> None:
        clock.sleep(s)
        ck.write_bytes(b"BEST")  # rewritten between the two polls

    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=sleep)
    assert [p["path"] for p in man["jobs"][0]["pending"]] == ["checkpoints/best.pt"]
    man = M.build_manifest(str(tmp_path / "state"), [job], settle_s=2.0, clock=clock, sleep=clock.sleep)
    best = next(f for f in man["jobs"][0]["files"] if f["path"] == "checkpoints/best.pt")
    assert best["sha256"] == hashlib.sha256(b"BEST").hexdigest()


def test_a_file_replaced_with_the_same_size_and_mtime_is_hashed_again(tmp_path: Path):
    job = make_job(tmp_path, state="succeeded")
    state = str(tmp_path / "state")
    M.build_manifest(state, [job], settle_s=5.0)
    ck = tmp_path / "work/ckpt/best.pt"
    st = ck.stat()
    other = tmp_path / "work/ckpt/other"
    other.write_bytes(b"BEST")  # same length, other bytes, put in place by a rename
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, ck)
    assert (ck.stat().st_size, ck.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    man = M.build_manifest(state, [job], settle_s=5.0)
    best = next(f for f in man["jobs"][0]["files"] if f["path"] == "checkpoints/best.pt")
    assert best["sha256"] == hashlib.sha256(b"BEST").hexdigest()
