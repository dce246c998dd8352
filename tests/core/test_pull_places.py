"""Where pulled artifacts live and how ``down`` and ``recover`` find them: one place per host
whatever the current directory, folders named ``<job name>-<short id>``, older id-named
folders kept, and ``down`` on a box gpurun cannot stop. Real CLI, real local agents."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under


@pytest.fixture
def box(isolated_home: Path, tmp_path: Path):
    """Host 'box': this machine behind the generic-ssh profile (a meter only its owner stops)."""
    from orchestrator import hosts

    hosts.add_host({"name": "box", "profile": "generic-ssh", "kind": "local",
                    "state_dir": str(tmp_path / "agent"), "workdir": str(tmp_path / "work")})
    yield "box"
    kill_agents_under(tmp_path)
    kill_agents_under(isolated_home)


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "dir-a", tmp_path / "dir-b"
    a.mkdir()
    b.mkdir()
    return a, b


def run_jobs(host: str, tmp_path: Path, *lines: str) -> list[dict]:
    q = tmp_path / "q.txt"
    q.write_text("".join(line + "\n" for line in lines))
    # local jobs run where they are submitted: here, not in the checkout
    res = gpurun("queue", "submit", str(q), "--host", host, "--wait", cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    jobs = json.loads(gpurun("queue", "status", "--host", host, "--json").stdout)["jobs"]
    assert {j["state"] for j in jobs} == {"succeeded"}, jobs
    return jobs


TRAIN = ("[name=toy-lr3 gpus=0 checkpoints=ck] sh -c 'mkdir -p ck/step-10 && "
         "echo w > ck/step-10/w.bin && echo done > \"$GPURUN_RUN_DIR/out.txt\"'")


def test_down_from_another_directory_finds_the_default_pull(box, tmp_path):
    from orchestrator import paths

    a, b = _dirs(tmp_path)
    (job,) = run_jobs(box, tmp_path, TRAIN)
    pulled = gpurun("pull", "--host", box, "--json", cwd=str(a))
    assert pulled.returncode == 0, pulled.stderr
    doc = json.loads(pulled.stdout)
    assert doc["dest"] == str(paths.artifacts_home()) and not list(a.iterdir())
    folder = paths.artifacts_home() / box / f"toy-lr3-{job['id'][:6]}"
    assert doc["jobs"][0]["dir"] == str(folder) and (folder / "run" / "out.txt").read_text() == "done\n"
    res = gpurun("down", box, "--dry-run", cwd=str(b))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "missing" not in res.stdout.replace("0 missing", "") and "the gate passes" in res.stdout


def test_down_from_another_directory_finds_a_relative_pull_dest(box, tmp_path):
    from orchestrator import paths

    a, b = _dirs(tmp_path)
    paths.config_home().mkdir(parents=True, exist_ok=True)
    (paths.config_home() / "config.yaml").write_text("pull: {dest: results}\n")
    run_jobs(box, tmp_path, TRAIN)
    assert gpurun("pull", "--host", box, cwd=str(a)).returncode == 0
    assert (a / "results" / box).is_dir()
    res = gpurun("down", box, "--json", cwd=str(b))   # nothing to confirm: gpurun stops nothing here
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    assert doc["assessment"]["dest"] == str(a / "results") and doc["assessment"]["ok"]


def test_down_on_a_box_gpurun_cannot_stop_reports_and_asks_nothing(box, tmp_path):
    run_jobs(box, tmp_path, TRAIN)
    res = gpurun("down", box)
    assert res.returncode == 3 and "not verified at home" in res.stderr   # the gate still guards
    assert gpurun("pull", "--host", box).returncode == 0
    res = gpurun("down", box, input="")   # no answer given: none must be needed
    assert res.returncode == 0, res.stderr
    assert "IRREVERSIBLE" not in res.stdout + res.stderr and "?" not in res.stderr
    assert "gpurun cannot stop this box" in res.stdout and "stopped nothing" in res.stdout
    assert "whatever the owner of the box uses" in res.stdout
    doc = _json_tail(gpurun("down", box, "--json").stdout)
    assert doc["decision"] == "proceeded" and doc["action"]["how"] == "manual"
    assert doc["verb"]["manual"] is True


def _json_tail(text: str) -> dict:
    return json.loads(text[text.index("{"):])


def test_an_id_named_folder_from_older_pulls_keeps_being_used(box, tmp_path):
    (job,) = run_jobs(box, tmp_path, TRAIN)
    dest = tmp_path / "d"
    assert gpurun("pull", "--host", box, "--dest", str(dest)).returncode == 0
    named = dest / box / f"toy-lr3-{job['id'][:6]}"
    legacy = dest / box / job["id"]
    os.rename(named, legacy)   # what a pull before named folders left behind
    res = gpurun("pull", "--host", box, "--dest", str(dest), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["jobs"][0]["dir"] == str(legacy)
    assert sorted(p.name for p in (dest / box).iterdir()) == [job["id"]]   # nothing duplicated
    assert gpurun("down", box, "--dry-run", "--dest", str(dest)).returncode == 0


def test_recover_relocation_finds_named_and_id_folders_anywhere(box, tmp_path, monkeypatch):
    from orchestrator.core import relocate

    (job,) = run_jobs(box, tmp_path, TRAIN)
    a, b = _dirs(tmp_path)
    assert gpurun("pull", "--host", box, "--dest", str(a / "art")).returncode == 0
    monkeypatch.chdir(b)
    # recover's own default dest holds nothing: the recorded pull destination is searched too
    ck = relocate.latest_checkpoint(b / "nowhere", job["id"])
    assert ck is not None and ck["unit"] == "step-10" and ck["root"].name == f"toy-lr3-{job['id'][:6]}"
    assert relocate.pulled_state(b / "nowhere", job["id"]) == "succeeded"
    os.rename(ck["root"], ck["root"].with_name(job["id"]))
    assert relocate.latest_checkpoint(a / "art", job["id"])["root"].name == job["id"]


def test_folder_names_are_sanitized_and_stable():
    from orchestrator.sync.state import job_dir_name, job_root

    assert job_dir_name("1a2b3c4d5e6f", "toy-lr3") == "toy-lr3-1a2b3c"
    assert job_dir_name("1a2b3c4d5e6f", "python train.py --lr 3e-4 > /x…") == "python-train.py-lr-3e-4-x-1a2b3c"
    assert job_dir_name("1a2b3c4d5e6f", "../..") == "1a2b3c4d5e6f"
    assert job_dir_name("1a2b3c4d5e6f") == "1a2b3c4d5e6f"
    assert len(job_dir_name("1a2b3c4d5e6f", "x" * 500)) <= 60 + 7
    assert job_root(Path("/nonexistent"), "1a2b3c4d5e6f", "toy") == Path("/nonexistent/toy-1a2b3c")


def test_a_short_id_clash_falls_back_to_the_full_id(tmp_path):
    from orchestrator.sync.state import RECORD, job_root

    taken = tmp_path / "toy-1a2b3c"
    taken.mkdir()
    (taken / RECORD).write_text(json.dumps({"files": {}, "job": {"id": "1a2b3cffffff"}}))
    assert job_root(tmp_path, "1a2b3c4d5e6f", "toy") == tmp_path / "toy-1a2b3c4d5e6f"
    assert job_root(tmp_path, "1a2b3cffffff", "toy") == taken
