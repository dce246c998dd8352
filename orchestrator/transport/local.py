"""LocalTransport: the Transport contract on this machine (the embedded ``local`` host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from orchestrator.errors import TransportError
from orchestrator.transport.base import RunResult


class LocalTransport:
    name = "local"

    def __init__(self, host: dict | None = None):
        self.host = host or {"name": "local"}

    def run(self, command: str, *, input: str | bytes | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None) -> RunResult:
        full_env = dict(os.environ, **env) if env else None
        data = input.encode() if isinstance(input, str) else input
        try:
            proc = subprocess.run(["/bin/sh", "-c", command], input=data, capture_output=True,
                                  timeout=timeout, env=full_env)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"local command timed out after {timeout}s",
                                 "the command may still be running; check with `gpurun queue status`") from exc
        return RunResult(proc.returncode, proc.stdout.decode("utf-8", "replace"),
                         proc.stderr.decode("utf-8", "replace"))

    def put(self, local_path: str, remote_path: str) -> None:
        remote_path = os.path.expanduser(remote_path)
        os.makedirs(os.path.dirname(remote_path) or ".", exist_ok=True)
        tmp = f"{remote_path}.{os.getpid()}.tmp"
        shutil.copyfile(local_path, tmp)
        os.replace(tmp, remote_path)

    def get(self, remote_path: str, local_path: str) -> None:
        self.put(os.path.expanduser(remote_path), local_path)

    def sync(self, local_dir: str, remote_dir: str, *, excludes: Sequence[str] = ()) -> dict:
        src, dst = os.path.abspath(local_dir), os.path.abspath(remote_dir)
        if src == dst:
            return {"method": "none", "files": 0, "bytes": 0}
        from orchestrator.transport.excludes import RSYNC_GITIGNORE_FILTER, Matcher, walk
        from orchestrator.transport.ssh_sync import rsync_stats

        if shutil.which("rsync"):
            args = (["rsync", "-a", "--delete", "--stats"] + [f"--exclude={e}" for e in excludes]
                    + [RSYNC_GITIGNORE_FILTER, src + "/", dst + "/"])
            os.makedirs(dst, exist_ok=True)
            proc = subprocess.run(args, capture_output=True, text=True)
            if proc.returncode != 0:
                raise TransportError(f"rsync failed: {proc.stderr.strip()[:300]}")
            return {"method": "rsync", **rsync_stats(proc.stdout)}
        # the same paths as rsync would send (excludes and .gitignore), counted
        files = total = 0
        for rel, path in walk(Path(src), Matcher(excludes)):
            target = Path(dst) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():
                if target.is_symlink() or target.exists():
                    target.unlink()
                os.symlink(os.readlink(path), target)
                continue
            shutil.copy2(path, target)
            files += 1
            total += path.stat().st_size
        return {"method": "copy", "files": files, "bytes": total}

    def check(self) -> None:
        return None

    def close(self) -> None:
        return None
