"""`gpurun pull` and `gpurun down` against a real loopback sshd and a real agent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.manifest import sha256_file
from rigs.agents import gpurun

from pullrig import job_state, wait_until

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def sha(path: Path) -> str:
    return sha256_file(str(path))


def pull_json(host: str, dest: Path, *extra: str) -> dict:
    res = gpurun("pull", "--host", host, "--dest", str(dest), "--json", *extra, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_pull_while_training_then_gate(training_box, tmp_path: Path):
    host, job_id, work = training_box
    dest = tmp_path / "home-artifacts"
    jobdir = dest / host["name"] / f"train-{job_id[:6]}"  # <name>-<short id>: what users look for
    remote_ckpt = work / "ckpt" / "model-100.safetensors"

    summary = pull_json(host["name"], dest)
    (row,) = summary["jobs"]
    assert "ssh-stream" in summary["method"].split(" + ") and not summary["done"]  # the large (96 MB) file streamed
    assert row["state"] == "running" and row["verified"] and not row["complete"]
    local_ckpt = jobdir / "checkpoints" / "model-100.safetensors"
    assert sha(local_ckpt) == sha(remote_ckpt)
    # the log that is still being appended is not pulled half-written; the temp file never
    assert not (jobdir / "run" / "growing.log").exists()
    assert row["pending"] >= 1
    assert not list(jobdir.rglob("*.tmp"))
    marker = json.loads((jobdir / "PULL_VERIFIED.json").read_text())
    assert marker["complete"] is False
    assert any(p["path"] == "run/growing.log" for p in marker["pending"])
    ck = next(f for f in marker["files"] if f["path"] == "checkpoints/model-100.safetensors")
    assert ck["checks"]["format"] == "safetensors" and ck["checks"]["tensors"] == 1
    assert ck["checks"]["nonfinite"] == 0

    # gate: a running job blocks, even with --without-artifacts
    res = gpurun("down", host["name"], "--yes", "--dest", str(dest))
    assert res.returncode == 3, res.stderr
    assert "not finished" in res.stderr and "Traceback" not in res.stderr
    res = gpurun("down", host["name"], "--without-artifacts", "--dest", str(dest), input=host["name"] + "\n")
    assert res.returncode == 3

    (work / "stop").touch()
    wait_until(lambda: job_state(host, job_id)["state"] == "succeeded", 60, "job end")

    # finished, but the final log is not home yet: refused, naming what is missing
    res = gpurun("down", host["name"], "--yes", "--dest", str(dest), "--json")
    assert res.returncode == 3
    doc = json.loads(res.stdout)
    assert doc["decision"] == "refused" and any("growing.log" in m for m in doc["assessment"]["missing"])

    summary = pull_json(host["name"], dest)
    assert summary["done"] and summary["jobs"][0]["complete"]
    assert sha(jobdir / "run" / "growing.log") == sha(Path(host["state_dir"]) / "runs" / job_id / "growing.log")
    assert summary["jobs"][0]["skipped"] >= 1  # the checkpoint was not transferred again

    # a bit flip in the local copy (size and mtime kept): a plain pull with the sampled
    # re-verify off trusts the record; --verify re-reads everything and re-pulls it
    def flip() -> None:
        st = local_ckpt.stat()
        with open(local_ckpt, "r+b") as fh:
            fh.seek(st.st_size // 2)
            b = fh.read(1)
            fh.seek(st.st_size // 2)
            fh.write(bytes([b[0] ^ 0x01]))
        os.utime(local_ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert sha(local_ckpt) != sha(remote_ckpt)

    cfg = Path(os.environ["XDG_CONFIG_HOME"]) / "gpurun"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.yaml").write_text("pull:\n  reverify: 0\n")
    flip()
    quick = pull_json(host["name"], dest)
    assert quick["jobs"][0]["repaired"] == []  # without a re-verify the record is trusted
    fixed = pull_json(host["name"], dest, "--verify")
    assert fixed["jobs"][0]["repaired"] == ["checkpoints/model-100.safetensors"]
    assert sha(local_ckpt) == sha(remote_ckpt)

    # the gate always re-reads before down: a flipped copy is re-pulled from the box and said so
    flip()
    res = gpurun("down", host["name"], "--dry-run", "--dest", str(dest))
    assert res.returncode == 0 and "dry run" in res.stdout, res.stderr
    assert "re-pulled" in res.stdout and "model-100.safetensors" in res.stdout
    assert sha(local_ckpt) == sha(remote_ckpt)
    flip()
    res = gpurun("down", host["name"], "--yes", "--dest", str(dest), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert any("re-pulled" in n for n in doc["assessment"]["notes"])
    assert sha(local_ckpt) == sha(remote_ckpt)
    assert doc["decision"] == "proceeded" and doc["action"]["how"] == "manual"
    assert doc["verb"]["irreversible"] is True
    log = Path(os.environ["XDG_DATA_HOME"]) / "gpurun" / "teardown.jsonl"
    decisions = [json.loads(line)["decision"] for line in log.read_text().splitlines()]
    assert decisions.count("refused") == 3 and decisions[-1] == "proceeded"
    # the host keeps every file: gpurun never deletes remotely
    assert remote_ckpt.exists() and (work / "train.py").exists()


def test_pull_killed_repeatedly_always_resumes(training_box, tmp_path: Path):
    import random
    import signal
    import subprocess
    import sys
    import time

    host, job_id, work = training_box
    (work / "stop").touch()
    wait_until(lambda: job_state(host, job_id)["state"] == "succeeded", 60, "job end")
    run_dir = Path(host["state_dir"]) / "runs" / job_id
    remote = {"checkpoints/model-100.safetensors": sha(work / "ckpt" / "model-100.safetensors")}
    for p in run_dir.rglob("*"):
        if p.is_file():
            remote["run/" + p.relative_to(run_dir).as_posix()] = sha(p)
    dest = tmp_path / "d"
    jobdir = dest / host["name"] / f"train-{job_id[:6]}"
    rng = random.Random(4)
    partial_seen = 0
    staged = jobdir / ".gpurun-partial" / "checkpoints" / "model-100.safetensors"
    final = jobdir / "checkpoints" / "model-100.safetensors"
    for i in range(10):
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "pull", "--host", host["name"],
                                 "--dest", str(dest), "--json"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        if i % 3 == 2:
            time.sleep(rng.uniform(0.0, 1.5))      # anywhere: connecting, manifest, transfer, rename
        else:
            # aim inside the transfer: wait until bytes are arriving, then a little more
            deadline = time.time() + 30
            while proc.poll() is None and time.time() < deadline and not (
                    staged.exists() and staged.stat().st_size > 0):
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if staged.exists() and staged.stat().st_size > 0:
            partial_seen += 1
        # never a corrupt file under a final name
        for p in jobdir.rglob("*") if jobdir.exists() else []:
            rel = p.relative_to(jobdir).as_posix()
            if p.is_file() and rel in remote:
                assert sha(p) == remote[rel], f"corrupt final file {rel}"
        if final.exists() and sha(final) == remote["checkpoints/model-100.safetensors"] and i < 9:
            final.unlink()  # a finished pass: lose the local copy so the next pass transfers again
    assert partial_seen >= 1, "no kill landed mid-transfer; the test proves nothing"
    summary = pull_json(host["name"], dest)
    (row,) = summary["jobs"]
    assert summary["done"] and row["verified"] and row["complete"] and not row["failed"]
    for rel, digest in remote.items():
        assert sha(jobdir / rel) == digest
    marker = json.loads((jobdir / "PULL_VERIFIED.json").read_text())
    assert {f["path"] for f in marker["files"]} == set(remote)
    assert not list((jobdir / ".gpurun-partial").rglob("*")) if (jobdir / ".gpurun-partial").exists() else True
