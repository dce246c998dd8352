"""Code sync use case: send a project tree to a host and record its content hash there
(``<state_dir>/code_hash``) and here, so a submit can warn that the box runs other code.

The hash covers sorted relative paths, sizes and sha256 of every kept file, so it is the
same on any machine for the same tree (stdlib only, reproducible on the box).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from orchestrator import paths
from orchestrator.errors import BadInput
from orchestrator.transport.excludes import DEFAULT_EXCLUDES, Matcher, read_ignore_file, walk

IGNORE_FILE = ".gpurunignore"
HASH_FILE = "code_hash"


def ignore_patterns(project_dir: str | os.PathLike) -> list[str]:
    """Default excludes plus the project's ``.gpurunignore`` (BadInput names a bad line)."""
    return list(DEFAULT_EXCLUDES) + read_ignore_file(Path(project_dir) / IGNORE_FILE)


def local_tree_hash(project_dir: str | os.PathLike,
                    ignore: Sequence[str] | None = None) -> dict[str, Any]:
    """``{"hash": "sha256:...", "files": N, "bytes": B}`` for the tree as ``push`` sends it.

    ``ignore`` defaults to :func:`ignore_patterns` of the directory."""
    root = Path(project_dir)
    if not root.is_dir():
        raise BadInput(f"{project_dir}: not a directory", hint="give the project directory to push")
    matcher = Matcher(ignore_patterns(root) if ignore is None else ignore)
    outer = hashlib.sha256()
    files = total = 0
    for rel, path in walk(root, matcher):
        if path.is_symlink():
            outer.update(f"L {rel} {os.readlink(path)}\n".encode())
            continue
        inner = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                inner.update(block)
        size = path.stat().st_size
        outer.update(f"F {rel} {size} {inner.hexdigest()}\n".encode())
        files += 1
        total += size
    return {"hash": "sha256:" + outer.hexdigest(), "files": files, "bytes": total}


def _local_record(host_name: str) -> Path:
    return paths.data_home() / "hosts" / host_name / HASH_FILE


LOCAL_NOTE = ("jobs on this machine run in the directory you submit them from: `gpurun queue submit` "
              "from your project (or pass --to PATH to copy it somewhere)")


def remote_dir_for(host: dict, remote_dir: str | None) -> str:
    """Where the code goes: ``--to`` if given, else the host's workdir."""
    target = remote_dir or host.get("workdir")
    if not target:
        raise BadInput(f"host {host.get('name')!r} has no workdir",
                       hint="pass --to PATH, or set a workdir for the host")
    return str(target)


def _runs_in_place(entry: dict, remote_dir: str | None) -> bool:
    """The built-in ``local`` host: its jobs run where they are submitted, it has no workdir."""
    return entry.get("kind", "local") == "local" and not remote_dir and not entry.get("workdir")


def push(session: Any, project_dir: str | os.PathLike, remote_dir: str | None = None) -> dict:
    """Sync ``project_dir`` to the host and record the pushed tree's hash.

    Returns ``{host, local_dir, remote_dir, method, files, bytes, code_hash,
    fallback_reason}``: ``files``/``bytes`` are what was sent (rsync sends only changes), or
    the kept tree's own count where the transport cannot say (``.gitignore`` and
    ``.gpurunignore`` honoured). Raises BadInput for a bad directory or ignore file, TransportError /
    ConnectError when the host cannot be reached."""
    root = Path(project_dir).resolve()
    patterns = ignore_patterns(root)
    tree = local_tree_hash(root, patterns)
    host = session.host
    target = remote_dir_for(host, remote_dir)
    stats = session.transport.sync(str(root), target, excludes=patterns)
    record = {"hash": tree["hash"], "files": tree["files"], "bytes": tree["bytes"],
              "local_dir": str(root), "remote_dir": stats.get("remote_dir", target),
              "method": stats.get("method"), "pushed_at": time.time()}
    _write_remote_record(session, record)
    local = _local_record(host["name"])
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, local)
    # files/bytes: what went over (rsync sends only changes); the tree's own count where the
    # transport could not say, so the user never reads "?"
    sent_files, sent_bytes = stats.get("files"), stats.get("bytes")
    return {"host": host["name"], "local_dir": str(root), "remote_dir": record["remote_dir"],
            "method": stats.get("method"), "files": tree["files"] if sent_files is None else sent_files,
            "bytes": tree["bytes"] if sent_bytes is None else sent_bytes, "code_hash": tree["hash"],
            "fallback_reason": stats.get("fallback_reason")}


def push_tree(directory: str, host: str | None = None, remote_dir: str | None = None, *,
              dry_run: bool = False) -> dict:
    """``gpurun push``: send ``directory`` to ``host`` (default: local, or $GPURUN_HOST), or with
    ``dry_run`` only say what would be sent and where, touching nothing on the host.

    Returns :func:`push`'s dict plus ``dry_run``. The built-in ``local`` host sends nothing:
    its jobs run where they are submitted (``method: "none"``, ``remote_dir: null``; :data:`LOCAL_NOTE`). Raises BadInput for a bad directory,
    HostError for an unknown host, TransportError / ConnectError when it cannot be reached."""
    from orchestrator import hosts as hostinv

    if not os.path.isdir(directory):
        raise BadInput(f"{directory}: no such directory", hint="give the project directory to push")
    entry = hostinv.get_host(host)
    if dry_run or _runs_in_place(entry, remote_dir):
        tree = local_tree_hash(directory)
        in_place = _runs_in_place(entry, remote_dir)
        return {"host": entry["name"], "local_dir": os.path.abspath(directory),
                "remote_dir": None if in_place else remote_dir_for(entry, remote_dir),
                "method": "none" if in_place else None,
                "files": 0 if in_place else tree["files"], "bytes": 0 if in_place else tree["bytes"],
                "code_hash": tree["hash"], "fallback_reason": None, "dry_run": dry_run}
    from orchestrator.core.session import open_session

    with open_session(host=entry) as session:
        return {**push(session, directory, remote_dir), "dry_run": False}


def _state_dir(session: Any) -> str:
    return str(getattr(session, "state_dir", None) or session.host.get("state_dir") or "~/.gpurun")


def _write_remote_record(session: Any, record: dict) -> None:
    state = _state_dir(session)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(record, fh)
        name = fh.name
    try:
        session.transport.put(name, f"{state.rstrip('/')}/{HASH_FILE}")
    finally:
        os.unlink(name)


def remote_code_info(session: Any) -> dict | None:
    """The record of the last push to this host as stored on the box, or None."""
    from orchestrator.transport.base import rpath

    path = f"{_state_dir(session).rstrip('/')}/{HASH_FILE}"
    res = session.transport.run(f"cat {rpath(path)} 2>/dev/null || true", timeout=60)
    # A noisy .bashrc may print before the JSON; the record is the last line that parses.
    for line in reversed(res.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def remote_code_hash(session: Any) -> str | None:
    """``"sha256:..."`` of the code last pushed to the host, or None if never pushed."""
    info = remote_code_info(session)
    return info.get("hash") if info else None


def last_local_record(host_name: str) -> dict | None:
    """What this machine last pushed to ``host_name`` (no network)."""
    try:
        return json.loads(_local_record(host_name).read_text())
    except (OSError, ValueError):
        return None


def never_pushed_warning(host: dict, remote: dict | None, jobs: list[dict]) -> str | None:
    """A one-line warning when nothing was ever pushed to an SSH ``host`` (``remote`` is the
    box's push record, None) and one of ``jobs`` (those just added) runs in its workdir, else
    None. A new user's first ``python train.py`` on a fresh box otherwise fails with a bare
    ``exit code 2``: the agent is sent on first use, the project is not."""
    workdir = host.get("workdir")
    if host.get("kind", "local") == "local" or remote or not workdir:
        return None
    inside = [j for j in jobs if j.get("cwd") == workdir or str(j.get("cwd") or "").startswith(workdir.rstrip("/") + "/")]
    if not inside:
        return None
    name = host["name"]
    return (f"nothing was pushed to {name} yet: job(s) run in its workdir {workdir}, which has none of "
            f"your files; if they need them, run `gpurun push --host {name} .`, then "
            f"`gpurun queue retry NAME --host {name}` for a job that failed")


def code_differs_warning(host: dict, remote: dict | None) -> str | None:
    """A one-line warning when the code last pushed to ``host`` differs from the tree it was
    pushed from, else None.

    ``remote`` is the record the box holds (``submit`` replies carry it, so the check costs
    no extra round trip; :func:`remote_code_info` reads it otherwise). The local tree is
    the one this machine last pushed from, or the record's own ``local_dir``."""
    if host.get("kind") == "local" or not remote:
        return None
    rec = last_local_record(host["name"])
    local_dir = (rec or {}).get("local_dir") or remote.get("local_dir")
    if not local_dir or not os.path.isdir(local_dir):
        return None
    if local_tree_hash(local_dir)["hash"] == remote.get("hash"):
        return None
    return (f"the code on {host['name']} ({remote.get('remote_dir')}) differs from {local_dir}; "
            f"run `gpurun push --host {host['name']} {local_dir}` to update it")
