"""`gpurun recover` edges through the real CLI, the controller-side job snapshot, the move
plan (which pulled checkpoint goes where), the profile's api extras and watch's cost keys."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.core import relocate, snapshot
from orchestrator.sync.state import JobRecord

from providers.conftest import fake_for


def run(capsys, *args, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO(stdin))
    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


@pytest.fixture
def runpod(isolated_home, monkeypatch, sshd):
    monkeypatch.setenv("GPURUN_PROVIDER_POLL_S", "0.02")
    fake = fake_for("runpod", monkeypatch, ssh=("127.0.0.1", sshd.port))
    yield fake
    fake.close()


def rent_box(capsys, sshd, name="box"):
    code, out, err = run(capsys, "up", "runpod", "--gpu", "RTX_4090", "--spot", "--yes", "--no-setup",
                         "--json", "--ssh-key", str(sshd.client_key), "--name", name)
    assert code == 0, err
    return json.loads(out)


def test_recover_needs_a_rented_host(isolated_home, capsys):
    from orchestrator import hosts
    hosts.add_host({"name": "plain", "profile": "generic-ssh", "kind": "ssh",
                    "ssh": {"user": "u", "hostname": "h", "port": 22}})
    code, _, err = run(capsys, "recover", "plain")
    assert code == 2 and "not rented through a provider API" in err and "Traceback" not in err
    code, _, err = run(capsys, "recover", "nosuch")
    assert code == 2 and "nosuch" in err
    code, _, err = run(capsys, "recover", "plain", "--policy", "sideways")
    assert code == 2 and "sideways" in err


def test_nothing_to_recover_and_declined_replace_changes_nothing(runpod, sshd, capsys, monkeypatch):
    res = rent_box(capsys, sshd)
    code, out, _ = run(capsys, "recover", "box", "--json")
    assert code == 0 and json.loads(out)["action"] == "none"
    runpod.preempt(res["instance_id"])
    code, out, err = run(capsys, "recover", "box", "--policy", "replace", stdin="n\n", monkeypatch=monkeypatch)
    assert code == 0 and "rent a new box like box" in err and "not recovered" in out
    assert len(runpod.instances) == 1                       # no second pod was rented
    code, _, err = run(capsys, "recover", "box", "--policy", "restart", "--watch")
    assert code == 2 and "--yes" in err                      # unattended spending needs --yes
    assert runpod.routes.get(("POST", "/pods/{id}/start"), 0) == 0


def test_snapshot_merges_submit_and_status(isolated_home):
    host = {"name": "b", "kind": "ssh"}
    spec = {"id": "j1", "name": "t", "command": "python t.py", "env": {"SEED": "1"}, "source": "q.txt:1"}
    snapshot.record(host, "submit", {"jobs": [spec]}, {"added": ["j1"], "present": []})
    snapshot.record(host, "status", {}, {"jobs": [{"id": "j1", "state": "running", "attempt": 2, "seq": 1}]})
    (j,) = snapshot.jobs("b")
    assert j["env"] == {"SEED": "1"} and j["state"] == "running" and j["attempt"] == 2
    snapshot.mark_moved("b", ["j1"], "b-r1")
    assert snapshot.jobs("b")[0]["moved_to"] == "b-r1"
    snapshot.record({"name": "loc", "kind": "local"}, "submit", {"jobs": [spec]}, {"added": ["j1"]})
    assert not snapshot.snapshot_file("loc").exists()       # a local store is its own truth


def _pulled(root: Path, files: dict[str, str], state: str = "verified") -> None:
    rec = JobRecord(root)
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        st = p.stat()
        rec.mark(rel, state=state, sha256="x", size=st.st_size, mtime_ns=st.st_mtime_ns)
    rec.data["job"] = {"id": root.name, "state": "running"}
    rec.save()


def test_move_plan_takes_the_newest_fully_verified_checkpoint(tmp_path):
    dest = tmp_path / "art"
    _pulled(dest / "old" / "j1", {"checkpoints/step-10/m.pt": "a", "checkpoints/step-20/m.pt": "b",
                                  "checkpoints/step-20/opt.pt": "c", "metrics/metrics.jsonl": "{}\n",
                                  "run/log.txt": "x", "run/exit.1": "1", "run/notes/seed.json": "{}"})
    _pulled(dest / "older" / "j1", {"checkpoints/step-5/m.pt": "z"})
    tampered = dest / "old" / "j1" / "checkpoints" / "step-20" / "opt.pt"
    tampered.write_text("cc")                                # changed after the pull: not trusted
    job = {"id": "j1", "checkpoints": "/w/old/ckpt", "metrics": "/w/old/metrics.jsonl",
           "cwd": "/w/old", "attempt": 0, "env": {"A": "1"}}
    pairs = [("/w/old", "/w/new"), ("/s/old", "/s/new")]
    plan = relocate.restore_plan(job, dest, "/s/new/runs/j1", pairs)
    assert plan["step"] == 10 and plan["resume_from"] == "/w/new/ckpt/step-10"
    targets = sorted(r for _, r in plan["files"])
    assert targets == ["/s/new/runs/j1/notes/seed.json", "/w/new/ckpt/step-10/m.pt", "/w/new/metrics.jsonl"]
    row = relocate.resubmission(job, pairs, "old", plan)
    assert row["cwd"] == "/w/new" and row["attempt"] == 1 and "state" not in row
    assert row["env"] == {"A": "1", "GPURUN_MOVED_FROM": "old", "GPURUN_RESUME_FROM": "/w/new/ckpt/step-10"}
    assert relocate.rebase("/w/older/x", pairs) == "/w/older/x"   # a prefix must end at a '/'
    (dest / "old" / "j1" / ".gpurun-pull.json").write_text(
        json.dumps({"files": {}, "job": {"id": "j1", "state": "succeeded"}}))
    assert relocate.pulled_state(dest, "j1") == "succeeded"  # finished before the loss: not moved


def test_profile_api_extras_are_validated(isolated_home, capsys):
    d = isolated_home / ".config" / "gpurun" / "profiles"
    d.mkdir(parents=True)
    (d / "autodl.yaml").write_text("api:\n  regions: [westDC2]\n  prices: {RTX 4090: 1.98}\n"
                                   "  gpu_specs: {RTX 4090: v-48g}\n  poll_interval_s: 2\n")
    from orchestrator.profiles import load_profile
    assert load_profile("autodl").get("api.prices") == {"RTX 4090": 1.98}
    (d / "autodl.yaml").write_text("api:\n  regions: [westDC2]\n  prices: {RTX 4090: cheap}\n")
    code, _, err = run(capsys, "profiles", "show", "autodl")
    assert code == 2 and "autodl.yaml:3" in err and "api.prices.RTX 4090" in err and "Traceback" not in err


def test_watch_cost_keys(isolated_home):
    from orchestrator.cli.watch import cost_of, json_host
    from orchestrator.core import rent
    now = time.time()
    entry = {"name": "b", "instance": {"provider": "runpod", "id": "p1", "price_per_hour": 0.5,
                                       "currency": "USD", "rented_at": now - 7200}}
    c = cost_of(entry, now)
    assert c["price_per_hour"] == 0.5 and c["hours"] == pytest.approx(2.0) and c["cost_so_far"] == pytest.approx(1.0)
    rent.note_rental("runpod", "p1", stopped_by_us=True, stopped_at=now - 3600)
    assert cost_of(entry, now)["cost_so_far"] == pytest.approx(0.5)   # our stop ends the GPU meter
    assert cost_of({"name": "plain"}, now) is None
    down = json_host({"host": "b", "ok": False, "error": "unreachable", "elapsed_s": 1.0, "cost": c})
    assert down["cost"]["currency"] == "USD" and set(down) == {"host", "ok", "error", "elapsed_s", "cost"}
