"""The teardown gate's offline judgement: the controller's job snapshot plus real pull markers
(written by the pull engine from a real manifest), and ``gpurun down`` on an SSH host whose port
refuses connections (no provider API, so nobody can say the box is down)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from rigs.agents import gpurun
from orchestrator.agent.manifest import build_manifest
from orchestrator.core import snapshot
from orchestrator.core.teardown_offline import assess_offline
from orchestrator.sync.engine import pull_job
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.transfer import LocalFetcher

HOST = "gone"


def seen(jobs: list[dict]) -> None:
    """What a `queue status` round trip leaves at home."""
    snapshot.record({"name": HOST, "kind": "ssh"}, "status", {}, {"jobs": jobs})


def pull(tmp: Path, dest: Path, jid: str, state: str) -> dict:
    """A job with one checkpoint on a 'box' dir, pulled home by the real engine in ``state``."""
    ck = tmp / "box" / jid / "ckpt"
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "w.bin").write_bytes(jid.encode() * 1000)
    job = {"id": jid, "name": jid, "state": state, "run_dir": str(tmp / "box" / jid / "run"), "checkpoints": str(ck)}
    man = build_manifest(str(tmp / "state"), [job], settle_s=0)["jobs"][0]
    res = pull_job(man, dest / HOST / jid, LocalFetcher(), KeepPolicy(), host=HOST)
    assert res.verified
    return man


def test_no_job_list_at_home_refuses(isolated_home, tmp_path):
    a = assess_offline({"name": HOST}, tmp_path / "dest", "connection refused")
    assert a.offline and a.basis == "offline" and not a.ok
    assert "no record of its jobs at home" in a.missing[0]
    assert a.as_dict()["basis"] == "offline" and a.as_dict()["unreachable"] == "connection refused"


def test_unfinished_job_needs_the_provider_to_say_the_box_is_down(isolated_home, tmp_path):
    dest = tmp_path / "dest"
    pull(tmp_path, dest, "j1", "succeeded")
    pull(tmp_path, dest, "j2", "running")
    seen([{"id": "j1", "seq": 1, "state": "succeeded"}, {"id": "j2", "seq": 2, "state": "running"}])

    up = assess_offline({"name": HOST}, dest, "refused", "running")
    assert len(up.blockers) == 1 and "j2" in up.blockers[0] and not up.missing
    unknown = assess_offline({"name": HOST}, dest, "refused", None, "no API")
    assert unknown.blockers and unknown.notes == ["no API"]

    down = assess_offline({"name": HOST}, dest, "refused", "preempted")
    assert down.ok and down.files == 2 and down.last_pull_at is not None
    assert [r["state"] for r in down.jobs] == ["succeeded", "running (interrupted)"]
    assert down.last_pull_at == min(r["pulled_at"] for r in down.jobs)

    snapshot.mark_moved(HOST, ["j2"], "gone-r1")   # `gpurun recover` moved it: it is not running here
    assert assess_offline({"name": HOST}, dest, "refused", "running").ok


def test_a_job_moved_off_the_box_counts_with_its_pull_from_where_it_went(isolated_home, tmp_path):
    """A fleet's lost member (or `recover`): the job ran on at its new host and was pulled from
    there; that verified pull is its home copy, so the dead box does not wait for it forever."""
    dest = tmp_path / "dest"
    seen([{"id": "j1", "seq": 1, "state": "running"}])
    snapshot.mark_moved(HOST, ["j1"], "box-b")
    a = assess_offline({"name": HOST}, dest, "refused", None)
    assert not a.ok and a.missing == ["j1: no verified pull at home"]

    ck = tmp_path / "box-b" / "ckpt"
    ck.mkdir(parents=True)
    (ck / "w.bin").write_bytes(b"moved" * 1000)
    job = {"id": "j1", "name": "j1", "state": "succeeded", "run_dir": str(tmp_path / "box-b" / "run"),
           "checkpoints": str(ck)}
    man = build_manifest(str(tmp_path / "state-b"), [job], settle_s=0)["jobs"][0]
    assert pull_job(man, dest / "box-b" / "j1", LocalFetcher(), KeepPolicy(), host="box-b").verified
    a = assess_offline({"name": HOST}, dest, "refused", None)
    assert a.ok and a.files == 1 and a.jobs[0]["dir"] == str(dest / "box-b" / "j1")
    assert a.jobs[0]["moved_to"] == "box-b" and a.jobs[0]["state"] == "succeeded"

    # a copy at home that changed since its pull vouches for nothing, wherever it lies
    blob = dest / "box-b" / "j1" / "checkpoints" / "w.bin"
    blob.write_bytes(b"X" + blob.read_bytes()[1:])
    assert not assess_offline({"name": HOST}, dest, "refused", None).ok


def test_finished_job_needs_a_pull_made_after_it_finished(isolated_home, tmp_path):
    dest = tmp_path / "dest"
    pull(tmp_path, dest, "j1", "running")
    seen([{"id": "j1", "seq": 1, "state": "succeeded"}])
    a = assess_offline({"name": HOST}, dest, "refused", "stopped")
    assert not a.ok and "was made before the job finished" in a.missing[0]
    # the marker may be newer than the snapshot (a pull does not refresh it): it counts
    pull(tmp_path, dest, "j1", "succeeded")
    seen([{"id": "j1", "seq": 1, "state": "running"}])
    a = assess_offline({"name": HOST}, dest, "refused", "running")
    assert a.ok and a.jobs[0]["state"] == "succeeded"


def test_files_are_rechecked_at_home_and_unpulled_jobs_listed(isolated_home, tmp_path):
    dest = tmp_path / "dest"
    pull(tmp_path, dest, "j1", "succeeded")
    seen([{"id": "j1", "seq": 1, "state": "succeeded"},
          {"id": "j2", "seq": 2, "state": "queued", "started_at": None}])
    blob = dest / HOST / "j1" / "checkpoints" / "w.bin"
    blob.write_bytes(b"X" + blob.read_bytes()[1:])   # same size, other bytes: the hash catches it
    a = assess_offline({"name": HOST}, dest, "refused", "terminated")
    assert a.missing == ["j1/checkpoints/w.bin (changed or gone since the pull)",
                         "j2: no verified pull at home (it had not started when last seen)"]
    assert [r["verdict"] for r in a.jobs] == ["missing", "missing"]


def _dead_ssh_host(profile: str) -> None:
    from orchestrator import hosts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hosts.add_host({"name": HOST, "profile": profile, "kind": "ssh", "state_dir": "~/.gpurun",
                    "workdir": "~/w", "slots": 1,
                    "ssh": {"user": "nobody", "hostname": "127.0.0.1", "port": port, "key": None,
                            "proxy_jump": None, "alias": None}})


@pytest.fixture
def cli(isolated_home):
    """The real CLI in a subprocess (main() maps errors to exit codes); output = stdout + stderr."""
    def run(*args: str, input: str | None = None):
        res = gpurun(*args, input=input, timeout=60)
        res.output = res.stdout + res.stderr
        res.exit_code = res.returncode
        return res
    return run


def test_cli_offline_without_api_refuses_possibly_running_jobs_even_without_artifacts(cli, tmp_path):
    _dead_ssh_host("generic-ssh")
    seen([{"id": "j1", "seq": 1, "state": "running"}])
    res = cli("down", HOST, "--without-artifacts", "--dest", str(tmp_path / "d"), "--json", input=f"{HOST}\n")
    assert res.exit_code == 3
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    assert doc["offline"] is True and doc["decision"] == "refused" and doc["assessment"]["provider_state"] is None
    assert "may still be running" in res.output
    assert "not rented through a provider API" in doc["assessment"]["notes"][0]


def test_cli_offline_all_verified_asks_then_says_what_to_click(cli, tmp_path):
    from orchestrator import paths
    dest = tmp_path / "d"
    _dead_ssh_host("autodl")
    pull(tmp_path, dest, "j1", "succeeded")
    seen([{"id": "j1", "seq": 1, "state": "succeeded"}])
    dry = cli("down", HOST, "--yes", "--dry-run", "--dest", str(dest))
    assert dry.exit_code == 0 and "once you type the host name" in dry.output
    assert "box unreachable: judged from the last verified pull on" in dry.output
    # the typed name comes from a terminal: a pipe carrying it is not someone typing it
    no = cli("down", HOST, "--yes", "--dest", str(dest), input=f"{HOST}\n")
    assert no.exit_code == 3 and "typed at a terminal" in no.output and f"--confirm-host {HOST}" in no.output
    wrong = cli("down", HOST, "--yes", "--dest", str(dest), "--confirm-host", "other")
    assert wrong.exit_code == 3 and "--yes is not enough" in wrong.output
    res = cli("down", HOST, "--yes", "--dest", str(dest), "--json", "--confirm-host", HOST)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    assert doc["action"]["how"] == "manual" and "cannot run" in doc["action"]["detail"]
    log = [json.loads(x) for x in (paths.data_home() / "teardown.jsonl").read_text().splitlines()]
    assert [(e["decision"], e["offline"], e["confirmation"]) for e in log] == \
        [("aborted", True, None), ("aborted", True, "flag"), ("proceeded", True, "flag")]
