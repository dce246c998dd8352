"""``gpurun pull --s3`` without the ``gpurun[s3]`` extra: a clear error naming the extra,
through the real CLI, before any host is contacted. boto3 is made unimportable in a fresh
interpreter (``sys.modules['boto3'] = None``), as when the extra is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import paths
from orchestrator.errors import Unsupported

HINT = "pip install 'gpurun[s3]'"


def _gpurun_without(module: str, args: list) -> subprocess.CompletedProcess:
    code = ("import sys; sys.modules[%r] = None; sys.argv = ['gpurun'] + sys.argv[1:]; "
            "from orchestrator.cli.main import main; main()" % module)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def s3_config(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("T_S3_KEY", "k")
    monkeypatch.setenv("T_S3_SECRET", "s")
    cfg = paths.config_home() / "config.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("s3: {endpoint_url: 'http://127.0.0.1:9', bucket: b, access_key_env: T_S3_KEY, "
                   "secret_key_env: T_S3_SECRET}\n")
    return cfg


@pytest.mark.parametrize("module", ["boto3", "botocore"])
def test_pull_s3_without_boto3_names_the_extra(s3_config, tmp_path: Path, module: str):
    dest = tmp_path / "artifacts"
    proc = _gpurun_without(module, ["pull", "--s3", "--dest", str(dest)])
    assert proc.returncode == 2, proc.stderr
    assert "needs boto3" in proc.stderr and HINT in proc.stderr and "Traceback" not in proc.stderr
    assert not any(dest.rglob("*"))  # refused before any file was pulled
    assert not (paths.local_state_dir() / "agent.pid").exists()  # nor was the host's agent started

    proc = _gpurun_without(module, ["pull", "--s3", "--dest", str(dest), "--json"])
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 2 and err["code"] == "unsupported" and HINT in err["hint"]


def test_s3_target_raises_unsupported(monkeypatch: pytest.MonkeyPatch):
    from orchestrator.sync.s3 import S3Target

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(Unsupported) as info:
        S3Target({"bucket": "b"})
    assert info.value.hint.startswith(HINT) and info.value.exit_code == 2
    # an injected client (tests, callers with their own session) needs no import at all
    assert S3Target({"bucket": "b"}, client=object()).bucket == "b"
