"""S3 target against a real S3-compatible server on loopback (moto's server mode)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, CredentialError, VerificationError
from orchestrator.sync.s3 import S3Target, validate_config


@pytest.fixture(scope="module")
def s3_server():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3cfg(s3_server, monkeypatch) -> dict:
    monkeypatch.setenv("TEST_S3_KEY", "testing")
    monkeypatch.setenv("TEST_S3_SECRET", "testing-secret")
    cfg = {"endpoint_url": s3_server, "bucket": "ckpts", "prefix": "team/exp",
           "access_key_env": "TEST_S3_KEY", "secret_key_env": "TEST_S3_SECRET", "region": "us-east-1"}
    target = S3Target(cfg)
    try:
        target.client.create_bucket(Bucket="ckpts")
    except target.client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return cfg


def test_multipart_upload_and_byte_for_byte_roundtrip(s3cfg, tmp_path: Path):
    data = os.urandom(20 * 1024 * 1024 + 123)  # 3 parts of 8 MiB
    src = tmp_path / "model.safetensors"
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    t = S3Target(s3cfg)
    key = t.key("box", "job1", "checkpoints/model.safetensors")
    assert key == "team/exp/box/job1/checkpoints/model.safetensors"
    up = t.upload(src, key, digest)
    assert up["size"] == len(data)
    head = t.client.head_object(Bucket="ckpts", Key=key)
    assert head["Metadata"]["gpurun-sha256"] == digest
    assert t.verify(key, digest, len(data))["size"] == len(data)
    back = tmp_path / "back.bin"
    t.download(key, back)
    assert back.read_bytes() == data
    # an object changed in the bucket is caught on read-back
    t.client.put_object(Bucket="ckpts", Key=key, Body=data[:-1] + b"\x00")
    with pytest.raises(VerificationError):
        t.verify(key, digest, len(data))


def test_config_names_env_vars_never_values(s3cfg, monkeypatch):
    with pytest.raises(ConfigError, match="s3.secret_key_env"):
        validate_config(dict(s3cfg, secret_key_env="AKIA/abc+secret"))
    with pytest.raises(ConfigError, match="s3.bucket"):
        validate_config({"endpoint_url": "http://x"})
    with pytest.raises(ConfigError, match="s3.acl"):
        validate_config(dict(s3cfg, acl="public"))
    monkeypatch.delenv("TEST_S3_SECRET")
    with pytest.raises(CredentialError) as err:
        S3Target(s3cfg)
    assert "TEST_S3_SECRET" in str(err.value) and "testing-secret" not in str(err.value)
