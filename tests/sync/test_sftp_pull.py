"""The SFTP fallback (boxes without rsync): a real pull over the loopback sshd, resumed
from a partial file, verified against the box's manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pullrig import chown_to, job_state, submit, wait_until
from rigs.agents import gpurun, kill_agents_under

pytestmark = [pytest.mark.ssh]


def test_pull_over_sftp_resumes_and_verifies(ssh_host, tmp_path, isolated_home):
    work = Path(ssh_host["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    chown_to(work, ssh_host["ssh"]["user"])
    cfg = isolated_home / ".config/gpurun"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.yaml").write_text("pull:\n  method: sftp\n")
    try:
        job = submit(ssh_host, "[name=w gpus=0 checkpoints=ck] mkdir -p ck && "
                               "head -c 3000000 /dev/urandom > ck/model.bin && echo done")
        wait_until(lambda: job_state(ssh_host, job)["state"] == "succeeded", 60, "job done")
        remote = work / "ck" / "model.bin"
        want = hashlib.sha256(remote.read_bytes()).hexdigest()
        dest = tmp_path / "home"
        # a partial left by an interrupted earlier pull: the first 1 MB
        part = dest / "box" / job / ".gpurun-partial" / "checkpoints" / "model.bin"
        part.parent.mkdir(parents=True)
        part.write_bytes(remote.read_bytes()[:1_000_000])
        res = gpurun("pull", "--host", "box", "--dest", str(dest), "--json", timeout=120)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["method"] == "sftp" and out["done"]
        (row,) = out["jobs"]
        assert row["verified"] and row["complete"]
        assert row["wire_bytes"] <= 3_000_000 - 1_000_000 + 200_000   # only the missing part, plus small run files
        got = dest / "box" / job / "checkpoints" / "model.bin"
        assert hashlib.sha256(got.read_bytes()).hexdigest() == want
        assert not part.exists() and (dest / "box" / job / "PULL_VERIFIED.json").exists()
    finally:
        kill_agents_under(Path(ssh_host["state_dir"]).parent)
