"""Durable copy of verified artifacts in any S3-compatible bucket (AWS, R2, MinIO, OSS).

Config ``s3: {endpoint_url, bucket, prefix, access_key_env, secret_key_env, region}``: the
credentials are read from the env vars *named* there, never stored or printed. Uploads are
multipart with SHA-256 checksums; ``verify`` re-downloads and re-hashes, byte for byte.

boto3 is the ``gpurun[s3]`` extra, imported only here and only when a target is opened:
without it, ``S3Target`` raises ``Unsupported`` with the install hint (``S3_HINT``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Optional

from orchestrator.errors import ConfigError, CredentialError, OperationalError, Unsupported, VerificationError

CHUNK = 8 * 1024 * 1024
KEYS = ("endpoint_url", "bucket", "prefix", "access_key_env", "secret_key_env", "region")
S3_HINT = "pip install 'gpurun[s3]'  (boto3: the S3 client; gpurun installs it only with this extra)"


def _boto3() -> Any:
    """boto3, or ``Unsupported`` naming the extra that brings it."""
    try:
        import boto3
        import botocore  # noqa: F401  # boto3's own dependency; a broken install lacks it
    except ImportError as exc:
        raise Unsupported(f"`gpurun pull --s3` needs boto3, which is not installed ({exc})", S3_HINT) from None
    return boto3


def validate_config(cfg: Any, source: str = "config.yaml") -> dict:
    """The ``s3`` section, checked; raises ConfigError naming the key."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: key 's3' must be a mapping", "see `gpurun pull --help` for the s3 keys")
    unknown = sorted(set(cfg) - set(KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key 's3.{unknown[0]}'", "allowed: " + ", ".join(KEYS))
    if not cfg.get("bucket"):
        raise ConfigError(f"{source}: key 's3.bucket' is required", "name the bucket artifacts go to")
    for k in ("access_key_env", "secret_key_env"):
        v = cfg.get(k)
        if v is not None and (not isinstance(v, str) or not v.replace("_", "").isalnum()):
            raise ConfigError(f"{source}: key 's3.{k}' must be an environment variable NAME",
                              "put the secret in the environment, and its name here")
    return dict(cfg)


class S3Target:
    """One bucket + prefix. ``upload`` and ``verify`` raise OperationalError subclasses."""

    def __init__(self, cfg: dict, client: Any = None):
        self.cfg = validate_config(cfg)
        self.bucket = self.cfg["bucket"]
        self.prefix = (self.cfg.get("prefix") or "").strip("/")
        self.client = client or self._client()

    def _client(self) -> Any:
        boto3 = _boto3()
        from botocore.config import Config

        creds = {}
        for key, arg in (("access_key_env", "aws_access_key_id"), ("secret_key_env", "aws_secret_access_key")):
            name = self.cfg.get(key)
            if name:
                if not os.environ.get(name):
                    raise CredentialError(f"s3.{key} names ${name}, which is not set",
                                          f"export {name}=... in the shell that runs gpurun")
                creds[arg] = os.environ[name]
        return boto3.client("s3", endpoint_url=self.cfg.get("endpoint_url"),
                            region_name=self.cfg.get("region") or "us-east-1",
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 5, "mode": "standard"}),
                            **creds)

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p)

    def upload(self, local: Path, key: str, sha256: str) -> dict:
        """Multipart upload with per-part SHA-256 checksums the server validates; the whole
        file's hash rides along as metadata so a later verify needs no local copy."""
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        conf = TransferConfig(multipart_threshold=CHUNK, multipart_chunksize=CHUNK, max_concurrency=4)
        try:
            self.client.upload_file(str(local), self.bucket, key, Config=conf,
                                    ExtraArgs={"ChecksumAlgorithm": "SHA256",
                                               "Metadata": {"gpurun-sha256": sha256}})
        except (BotoCoreError, ClientError, OSError) as exc:
            raise OperationalError(f"S3 upload of {local.name} to s3://{self.bucket}/{key} failed: {exc}",
                                   "check s3.endpoint_url, the bucket and the credentials; re-run to retry",
                                   retryable=True) from exc
        return {"bucket": self.bucket, "key": key, "sha256": sha256, "size": local.stat().st_size}

    def verify(self, key: str, sha256: str, size: Optional[int] = None) -> dict:
        """Stream the object back and hash it; raises VerificationError on any difference."""
        from botocore.exceptions import BotoCoreError, ClientError

        h = hashlib.sha256()
        n = 0
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            for block in iter(lambda: body.read(CHUNK), b""):
                h.update(block)
                n += len(block)
        except (BotoCoreError, ClientError) as exc:
            raise VerificationError(f"s3://{self.bucket}/{key} could not be read back: {exc}",
                                    "re-run `gpurun pull --s3` to upload it again") from exc
        if h.hexdigest() != sha256 or (size is not None and n != size):
            raise VerificationError(f"s3://{self.bucket}/{key} differs from the verified local copy",
                                    "re-run `gpurun pull --s3` to upload it again")
        return {"key": key, "sha256": sha256, "size": n}

    def download(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, key, str(local))


def push_job(target: S3Target, rec: Any, marker: Path, host: str, job_dir: str,
             files: list[dict]) -> list[dict]:
    """Upload every verified file of a job not yet verified in the bucket, read each back,
    then the marker; records ``s3`` per file in the pull record. Returns what was pushed."""
    pushed = []
    for f in files:
        r = rec.files.get(f["path"], {})
        key = target.key(host, job_dir, f["path"])
        s3rec = r.get("s3") or {}
        if s3rec.get("sha256") == f["sha256"] and s3rec.get("key") == key and s3rec.get("verified"):
            continue
        target.upload(rec.final_path(f["path"]), key, f["sha256"])
        target.verify(key, f["sha256"], f["size"])
        rec.mark(f["path"], s3={"bucket": target.bucket, "key": key, "sha256": f["sha256"], "verified": True})
        rec.save()
        pushed.append({"path": f["path"], "key": key, "size": f["size"]})
    if marker.exists():
        body = marker.read_bytes()
        target.upload(marker, target.key(host, job_dir, marker.name), hashlib.sha256(body).hexdigest())
    return pushed
