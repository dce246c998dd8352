"""Fixtures for pull/teardown tests: a job on a real loopback SSH box that writes a
checkpoint and keeps appending to a log until told to stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pullrig import TRAIN, chown_to, job_state, submit, wait_until
from rigs.agents import kill_agents_under


@pytest.fixture
def training_box(ssh_host: dict):
    """(host entry, job id, workdir): a job running on the SSH box with a finished 96 MB
    checkpoint (size via GPURUN_TEST_CKPT_MB) and a log that is still growing. 96 MB is over
    ``sync.engine.BATCH_FILE_MAX`` (64 MiB), so it streams alone as a large file does (200 MB
    before: every pull, re-hash and re-pull of it took twice as long, proving nothing more)."""
    mb = int(os.environ.get("GPURUN_TEST_CKPT_MB", "96"))
    work = Path(ssh_host["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    user = ssh_host["ssh"]["user"]
    chown_to(work, user)
    (work / "train.py").write_text(TRAIN)
    chown_to(work / "train.py", user)
    job_id = submit(ssh_host, f"[name=train gpus=0 checkpoints=ckpt] python3 train.py {mb}")
    wait_until(lambda: (work / "ckpt" / "model-100.safetensors").exists(), 120, "checkpoint")
    wait_until(lambda: job_state(ssh_host, job_id)["state"] == "running", 30, "running")
    yield ssh_host, job_id, work
    (work / "stop").touch()
    kill_agents_under(Path(ssh_host["state_dir"]).parent)
