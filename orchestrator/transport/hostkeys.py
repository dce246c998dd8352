"""gpurun's own known_hosts: verify SSH host keys, record them on first contact only.

Verification is the default everywhere; trust-on-first-use happens only through
``first_contact`` (called by ``gpurun host add``, which shows the fingerprint to the user).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path

from orchestrator import paths
from orchestrator.errors import HostKeyError

_lock = threading.Lock()


def default_known_hosts() -> Path:
    return paths.data_home() / "known_hosts"


def fingerprint(key) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a paramiko key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load(path: Path):
    import paramiko

    keys = paramiko.HostKeys()
    if path.is_file():
        try:
            keys.load(str(path))
        except Exception as exc:
            raise HostKeyError(f"{path}: unreadable known_hosts file: {exc}",
                               hint="fix or remove the damaged line") from None
    return keys


def record(path: Path, name: str, key) -> None:
    """Append ``name key`` to ``path`` unless the same key is already there."""
    with _lock:
        existing = load(path)
        if existing.check(name, key):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(line)


def _line_of(path: Path, name: str) -> int | None:
    if not path.is_file():
        return None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.split(" ", 1)[0].split(",").count(name):
            return n
    return None


def make_policy(path: Path, *, tofu: bool, seen: list):
    """A paramiko MissingHostKeyPolicy: record (``tofu``) or refuse unknown keys.

    Every key the server offers is appended to ``seen`` so callers can report it."""
    import paramiko

    class _Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko API
            seen.append((hostname, key))
            if tofu:
                record(path, hostname, key)
                client.get_host_keys().add(hostname, key.get_name(), key)
                return
            raise HostKeyError(
                f"host key of {hostname} is not recorded ({key.get_name()} {fingerprint(key)})",
                hint="record it once with `gpurun host add` (it shows the fingerprint), "
                     "or pass --insecure-host-key to skip verification")

    return _Policy()


def changed_key_error(path: Path, name: str, offered, expected) -> HostKeyError:
    line = _line_of(path, name)
    where = f"{path}:{line}" if line else str(path)
    return HostKeyError(
        f"host key of {name} CHANGED: recorded {fingerprint(expected)} ({where}), "
        f"offered {fingerprint(offered)}; refusing to connect",
        hint=f"if the box was re-created this is expected: run "
             f"`ssh-keygen -R '{name}' -f {path}` and `gpurun host add` again; "
             "otherwise someone may be intercepting the connection")
