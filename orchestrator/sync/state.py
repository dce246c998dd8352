"""The local side of a pull: where a job's files land and what is known about them.

``<dest>/<host>/<job name>-<short id>/`` (see :func:`job_root`; pulls made before names were
used live in ``<dest>/<host>/<job id>/`` and keep being used) holds the artifacts under their
manifest paths, a staging area ``.gpurun-partial/`` for transfers in flight, the pull record
``.gpurun-pull.json`` (so an interrupted pull resumes) and ``PULL_VERIFIED.json`` once
everything checked out.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from orchestrator.errors import VerificationError

PARTIAL_DIR = ".gpurun-partial"
RECORD = ".gpurun-pull.json"
VERIFIED = "PULL_VERIFIED.json"
LOCK = ".gpurun-pull.lock"
CONTROL_NAMES = frozenset({PARTIAL_DIR, RECORD, VERIFIED, LOCK})
_SAFE_DIR = re.compile(r"[^A-Za-z0-9._-]+")


SHORT_ID = 6      # hex digits of the job id after its name: unique among a host's jobs in practice
NAME_MAX = 60     # characters of the name kept in a folder name (whole names can be a command line)


def job_dir_name(job_id: str, name: str | None = None) -> str:
    """A folder name: ``<name>-<short id>`` when a job name is given (what users look for,
    e.g. ``toy-lr3-1a2b3c``), else the id alone (host folders, and pulls made before names
    were used). Anything unusual is replaced, never interpreted."""
    ident = _SAFE_DIR.sub("_", str(job_id)).strip("._") or "job"
    ident = ident[:120]
    slug = re.sub(r"-{2,}", "-", _SAFE_DIR.sub("-", str(name or ""))).strip("._-")[:NAME_MAX].rstrip("._-")
    if not slug or slug == ident or slug.endswith(ident[:SHORT_ID]):
        return ident
    return f"{slug}-{ident[:SHORT_ID]}"


def _owner(root: Path) -> str | None:
    """The job id recorded in a job folder's pull record (None when there is none)."""
    try:
        data = json.loads((root / RECORD).read_text(encoding="utf-8"))
        return str((data.get("job") or {}).get("id") or "") or None
    except (OSError, ValueError, AttributeError):
        return None


def find_job_root(host_dir: Path, job_id: str) -> Path | None:
    """The folder already holding a pull of ``job_id`` under ``host_dir``, by name or by id
    (the pull record says whose it is), or None. Reads no file when the id folder exists."""
    legacy = host_dir / job_dir_name(job_id)
    if legacy.is_dir():
        return legacy
    try:
        names = sorted(os.listdir(host_dir))
    except OSError:
        return None
    ident = job_dir_name(job_id)
    tails = ("-" + ident[:SHORT_ID], "-" + ident)
    for n in names:
        if n.endswith(tails) and _owner(host_dir / n) == str(job_id):
            return host_dir / n
    return None


def job_root(host_dir: Path, job_id: str, name: str | None) -> Path:
    """Where ``job_id``'s files live under ``host_dir`` (the one rule for pull, ``down`` and
    ``recover``): the folder that already holds its pulls (an id-named one from before names
    were used is kept as it is: moving a tree a shell or a file manager may have open is a
    risk for no gain), else ``<name>-<short id>``; when that name belongs to another job (a
    short-id clash) the full id is used. Creates nothing."""
    found = find_job_root(host_dir, job_id)
    if found is not None:
        return found
    named = host_dir / job_dir_name(job_id, name)
    if named.is_dir() and _owner(named) not in (None, str(job_id)):
        ident = job_dir_name(job_id)
        return host_dir / f"{job_dir_name(job_id, name)[:-SHORT_ID]}{ident}"
    return named


def safe_relpath(path: str) -> str:
    """Validate a manifest path from the box: relative, no ``..``, no control names.

    Any name a POSIX filesystem allows is fine (``模型.pt``, ``it's.pt``, ``a;b``, ``*``,
    a newline, a leading ``-``, undecodable bytes as surrogates): the name is only ever joined
    under the job dir and handed to the OS or to rsync as one argv element / NUL-separated
    list entry, never to a shell. What is refused is where a file would land outside the job
    dir or on a control file: absolute, ``.``/``..``/empty components, NUL, and a first
    component that is one of gpurun's own names. Raises VerificationError naming the path:
    the box is not trusted to choose where files land (callers refuse that one file)."""
    parts = path.split("/")
    if (not path or path.startswith("/") or "\x00" in path
            or any(p in ("", ".", "..") for p in parts) or parts[0] in CONTROL_NAMES):
        raise VerificationError(f"unsafe artifact path from host manifest: {show_path(path)}",
                                "that file was refused (it would land outside the job folder); "
                                "rename it on the box, the others were pulled")
    return path


def is_safe_relpath(path: str) -> bool:
    """:func:`safe_relpath` as a question (for readers that skip a refused file)."""
    try:
        safe_relpath(path)
    except VerificationError:
        return False
    return True


def show_path(path: str) -> str:
    """A path for one line of output: as is when printable, else ``ascii()``-quoted so a
    newline or an escape sequence in a file name cannot break or forge a line."""
    return path if path.isprintable() else ascii(path)


def manifest_digest(files: list[dict]) -> str:
    """SHA-256 over the sorted (path, size, sha256) roster: binds a marker to one manifest."""
    rows = sorted((f["path"], int(f["size"]), f["sha256"]) for f in files)
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp-%d" % os.getpid())
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # a full disk (or a kill) half-way: the old file stays whole, and no .tmp-PID is left
        # for local_roster or a user to stumble on
        tmp.unlink(missing_ok=True)
        raise


class JobRecord:
    """``.gpurun-pull.json``: per file the hash it was verified against, and the job's last
    remote manifest. Only files whose bytes were hashed locally are ever marked verified."""

    def __init__(self, root: Path):
        self.root = root
        self.path = root / RECORD
        self.data: dict[str, Any] = {"schema": "gpurun/PULL-RECORD/v1", "files": {}, "job": {}}
        if self.path.exists():
            try:
                loaded = json.loads(self.path.read_text(encoding="utf-8"))
                if isinstance(loaded, dict) and isinstance(loaded.get("files"), dict):
                    self.data = loaded
            except (OSError, ValueError):
                pass  # a torn record only costs re-verification: files are re-hashed

    @property
    def files(self) -> dict[str, dict]:
        return self.data["files"]

    def mark(self, path: str, **fields: Any) -> None:
        rec = self.files.setdefault(path, {})
        rec.update(fields)
        rec["updated_at"] = time.time()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def final_path(self, rel: str) -> Path:
        return self.root / safe_relpath(rel)

    def partial_path(self, rel: str) -> Path:
        return self.root / PARTIAL_DIR / safe_relpath(rel)


@contextmanager
def job_lock(root: Path, on_wait: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Exclusive lock on a job dir (its staging area included) for one pull at a time.

    A second pull of the same job waits, and says so through ``on_wait`` with the holder's
    pid (written into the lock file once held). The kernel drops a flock when its holder
    dies, ``kill -9`` included, so a dead pull never blocks the next one; its rsync group
    is killed with it (``procgroup.TransferGroup``), so nothing writes behind the lock."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read(32).strip() or "?"
            if on_wait is not None:
                on_wait(f"another pull of {root.name} is running (pid {holder}); waiting for it")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
        except OSError:
            pass  # a full disk: the lock holds without the note; the pull then says what is full
        yield


def local_roster(root: Path) -> set[str]:
    """Every artifact file under a job dir (control files and staging excluded)."""
    out: set[str] = set()
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in CONTROL_NAMES]
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            if rel in CONTROL_NAMES or rel.startswith(RECORD + ".tmp") or rel.startswith(VERIFIED + ".tmp"):
                continue
            out.add(rel)
    return out
