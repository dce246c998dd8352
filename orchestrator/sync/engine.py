"""Pull one job's manifest home and verify it: stage, hash, rename, record, mark.

A file reaches its final name only after its SHA-256 matched the host's manifest, so a pull
killed at any point leaves either nothing, a partial under ``.gpurun-partial/``, or a
verified file. ``PULL_VERIFIED.json`` is written only when every kept file verified.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from orchestrator.errors import GpurunError, OperationalError, VerificationError
from orchestrator.sync.guards import NO_SPACE, disk_full, reverify_sample
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.marker import write_marker
from orchestrator.sync.state import PARTIAL_DIR, JobRecord, job_lock, safe_relpath
from orchestrator.sync.transfer import prefix_hasher

class ProgressSink(Protocol):
    def file_started(self, job: str, path: str, total: int, resumed_from: int) -> None: ...
    def file_progress(self, pos: int) -> None: ...
    def file_done(self, ok: bool) -> None: ...


class NullProgress:
    def file_started(self, job: str, path: str, total: int, resumed_from: int) -> None:
        pass

    def file_progress(self, pos: int) -> None:
        pass

    def file_done(self, ok: bool) -> None:
        pass


@dataclass
class JobPull:
    """What one pass did for one job; ``verified`` means the marker is written and current."""

    job_id: str
    root: Path
    pulled: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: list[dict] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)   # unsafe manifest paths, never written
    pending: int = 0
    bytes: int = 0
    wire_bytes: int = 0
    verified: bool = False
    complete: bool = False
    methods: list[str] = field(default_factory=list)  # how this pass's files came, in first-use order

    def used(self, method: str) -> None:
        if method and method not in self.methods:
            self.methods.append(method)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job_id, "dir": str(self.root), "pulled": self.pulled, "skipped": self.skipped,
                "failed": self.failed, "repaired": self.repaired, "superseded": self.superseded,
                "refused": self.refused, "pending": self.pending, "bytes": self.bytes, "wire_bytes": self.wire_bytes,
                "verified": self.verified, "complete": self.complete}


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


BATCH_FILE_MAX = 64 << 20  # files up to this size share one rsync per job; larger ones stream alone
SAVE_EVERY_S = 1.0          # the record is rewritten at most this often (write_marker always saves)
# rsync exit codes after which the files that did arrive are worth verifying one by one
# (23: some files failed, 24: some vanished); anything else (ssh down, protocol) is the link
_RSYNC_PARTIAL_OK = (0, 23, 24)
# ... and after which the link is worth one more try at once: 12 (the data stream broke), 10
# (socket I/O), 255 (ssh could not connect: a busy sshd drops new sessions past MaxStartups). A
# host that is down costs one more connect attempt; a timeout (30) already waited, no retry
_RSYNC_LINK_RETRY, LINK_RETRY_PAUSE_S = (10, 12, 255), 1.0


def _syncfs(path: Path) -> None:
    """Make everything written on ``path``'s filesystem durable: one ``syncfs`` for a whole
    batch instead of an fsync per file and per directory (falls back to ``os.sync``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0:
            return
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)
    os.sync()


def _tree_key(f: dict) -> Optional[tuple[str, str, str]]:
    """(remote base, local base, rel) with ``remote == remote_base/rel`` and
    ``path == local_base/rel``, the longest such ``rel`` below the manifest section; None
    when the remote path does not end with the manifest path's tail."""
    parts = f["path"].split("/")
    remote = f.get("remote") or ""
    for k in range(len(parts) - 1, 0, -1):
        rel = "/".join(parts[-k:])
        if remote.endswith("/" + rel) and len(remote) > len(rel) + 1:
            return remote[:-len(rel) - 1], "/".join(parts[:-k]), rel
    return None


def _local_ok(rec: JobRecord, f: dict, rehash: bool) -> Optional[bool]:
    """True: the local copy is the manifest's file; False: it exists but differs (bit flip,
    edit); None: there is no local copy."""
    final = rec.final_path(f["path"])
    try:
        st = final.stat()
    except OSError:
        return None  # absent, or a name this filesystem cannot even look up: fetch it (and fail there)
    r = rec.files.get(f["path"], {})
    if (not rehash and r.get("state") == "verified" and r.get("sha256") == f["sha256"]
            and r.get("size") == st.st_size and r.get("mtime_ns") == st.st_mtime_ns):
        return True
    if st.st_size != f["size"]:
        return False
    digest = prefix_hasher(final, st.st_size).hexdigest()
    if digest == f["sha256"]:
        rec.mark(f["path"], state="verified", sha256=digest, size=st.st_size,
                 mtime_ns=st.st_mtime_ns, verified_at=time.time())
        return True
    return False


def _fetch_one(fetcher: Any, rec: JobRecord, f: dict, job_id: str, progress: ProgressSink,
               result: JobPull) -> bool:
    partial = rec.partial_path(f["path"])
    for attempt in (1, 2):
        have = partial.stat().st_size if partial.exists() else 0
        progress.file_started(job_id, f["path"], f["size"], have)
        try:
            got = fetcher.fetch(f["remote"], partial, f["size"], progress.file_progress)
        except OSError as exc:
            progress.file_done(False)
            if exc.errno in NO_SPACE:
                raise  # a full disk here is full for every other file too: pull_job says so once
            result.failed.append({"path": f["path"], "reason": local_refusal(exc, rec.root)})
            return False
        except GpurunError as exc:
            progress.file_done(False)
            result.failed.append({"path": f["path"], "reason": str(exc)})
            return False
        result.wire_bytes += got.wire_bytes
        ok = got.size == f["size"] and got.sha256 == f["sha256"]
        if not ok and got.size == f["size"]:
            # the streaming hash can miss an in-place rewrite; one full read settles it
            ok = prefix_hasher(partial, got.size).hexdigest() == f["sha256"]
        progress.file_done(ok)
        if ok:
            _fsync_path(partial)
            final = rec.final_path(f["path"])
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(partial, final)
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    raise
                result.failed.append({"path": f["path"], "reason": local_refusal(exc, rec.root)})
                return False  # the verified partial stays: once the obstacle is gone it lands
            _fsync_path(final.parent)
            st = final.stat()
            rec.mark(f["path"], state="verified", sha256=f["sha256"], size=st.st_size,
                     mtime_ns=st.st_mtime_ns, verified_at=time.time(), method=got.method or fetcher.method)
            result.used(got.method or fetcher.method)
            _save_soon(rec)
            result.bytes += f["size"]
            return True
        partial.unlink(missing_ok=True)  # a bad prefix would poison every resume: start over
    result.failed.append({"path": f["path"], "reason": "hash differs from the host's manifest "
                          "(the file changed on the host after it was listed?)"})
    return False


def local_refusal(exc: OSError, root: Path) -> str:
    """Why one file could not be copied (the destination refuses its name, a file stands where
    its folder should be, the source vanished): that file fails, the pull goes on."""
    where = str(exc.filename or "")
    if where.startswith(str(root)):
        return (f"cannot write it here: {exc.strerror or exc} (errno {exc.errno}); the destination "
                "refuses this name or path (another filesystem, a file where a folder should be)")
    return f"cannot read it: {exc.strerror or exc} (errno {exc.errno})"


def _save_soon(rec: JobRecord) -> None:
    """Rewrite the record at most every SAVE_EVERY_S: a record that lags behind only costs a
    re-hash of files already verified under their final names (never a wrong marker)."""
    now = time.monotonic()
    if now - getattr(rec, "_saved_at", 0.0) >= SAVE_EVERY_S:
        rec.save()
        rec._saved_at = now  # type: ignore[attr-defined]


def _fetch_batch(fetcher: Any, rec: JobRecord, files: list[dict], job_id: str,
                 progress: ProgressSink, result: JobPull) -> tuple[list[dict], list[dict]]:
    """One ``fetcher.fetch_tree`` per source dir for many small files, into the staging
    area; then each partial is hashed against the manifest, all of them made durable with
    one syncfs, renamed, and recorded with one save. Returns (pulled, left): ``left`` are
    files to try one by one (did not arrive or did not verify: their partials are gone)."""
    groups: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    left: list[dict] = []
    for f in files:
        key = _tree_key(f)
        if key is None:
            left.append(f)
            continue
        partial = rec.partial_path(f["path"])
        try:
            if partial.stat().st_size > f["size"]:
                partial.unlink()  # the remote file shrank or was replaced: useless prefix
        except FileNotFoundError:
            pass
        groups.setdefault(key[:2], []).append((key[2], f))
    good: list[dict] = []
    for (remote_base, local_base), items in groups.items():
        dest = rec.root / PARTIAL_DIR / local_base if local_base else rec.root / PARTIAL_DIR
        total = sum(f["size"] for _, f in items)
        # one progress line per batch; files that miss it are retried (and shown) one by one
        progress.file_started(job_id, f"{len(items)} files under {local_base or '.'}/", total, 0)
        code, wire, err = fetcher.fetch_tree(remote_base, [rel for rel, _ in items], dest)
        if code in _RSYNC_LINK_RETRY:
            result.wire_bytes += wire
            time.sleep(LINK_RETRY_PAUSE_S)  # rsync resumes what arrived (--partial into staging)
            code, wire, err = fetcher.fetch_tree(remote_base, [rel for rel, _ in items], dest)
        result.wire_bytes += wire
        arrived = 0
        for _rel, f in items:
            partial = rec.partial_path(f["path"])
            try:
                size = partial.stat().st_size
            except FileNotFoundError:
                size = -1
            ok = size == f["size"] and prefix_hasher(partial, size).hexdigest() == f["sha256"]
            if ok:
                arrived += size
                good.append(f)
                continue
            if size == f["size"]:
                partial.unlink(missing_ok=True)  # complete but wrong: a bad prefix poisons resumes
            if code in _RSYNC_PARTIAL_OK:
                left.append(f)
            else:  # the link itself failed: the next pass resumes, no point trying file by file
                result.failed.append({"path": f["path"], "reason": f"rsync failed (exit {code}): {err}"})
        progress.file_progress(arrived)
        progress.file_done(arrived == total)
    if not good:
        return [], left
    _syncfs(rec.root)  # every verified partial's bytes are on disk before any rename
    made: set[Path] = set()
    placed: list[dict] = []
    for f in good:
        final = rec.final_path(f["path"])
        try:
            if final.parent not in made:
                final.parent.mkdir(parents=True, exist_ok=True)
                made.add(final.parent)
            os.replace(rec.partial_path(f["path"]), final)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise
            result.failed.append({"path": f["path"], "reason": local_refusal(exc, rec.root)})
            continue
        placed.append(f)
    good = placed
    _syncfs(rec.root)  # and the renames, before the record says so
    now = time.time()
    for f in good:
        st = rec.final_path(f["path"]).stat()
        rec.mark(f["path"], state="verified", sha256=f["sha256"], size=st.st_size,
                 mtime_ns=st.st_mtime_ns, verified_at=now, method=fetcher.method)
        result.bytes += f["size"]
        result.used(fetcher.method)
    _save_soon(rec)
    return good, left


def pull_job(job: dict, root: Path, fetcher: Any, policy: KeepPolicy, *, host: str,
             progress: Optional[ProgressSink] = None, rehash: bool = False, reverify: int = 0,
             only: Optional[set[str]] = None) -> JobPull:
    """Bring one job's manifest files into ``root`` and write its marker when all verify.

    ``rehash`` re-reads every local copy; ``reverify`` N re-reads the 1/N of them checked
    longest ago (:func:`reverify_sample`), so a bit flip whose mtime was put back is found
    within N pulls. Corrupt copies are re-pulled and listed in ``repaired``. ``only`` limits
    the transfers to those paths (the marker still covers the whole manifest).

    A path the box may not choose (``..``, absolute) is refused for that file alone
    (``refused`` and ``failed``; no marker), never for the job or the host. A full
    destination raises DiskFull (partials kept for the resume); other transfer failures are
    reported in the result (the next pass resumes them), never raised."""
    progress = progress or NullProgress()
    unsafe: dict[str, str] = {}
    for f in job["files"]:
        try:
            safe_relpath(f["path"])
        except VerificationError as exc:
            unsafe[f["path"]] = str(exc)
    try:
        with job_lock(root, on_wait=getattr(progress, "note", None)):
            return _pull_locked(job, root, fetcher, policy, host, progress, rehash, reverify, only, unsafe)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise disk_full(root, job, unsafe) from None
        # the job folder itself cannot be written (read-only mount, no permission): one line
        raise OperationalError(f"cannot write in {root}: {exc.strerror or exc}",
                               "pull somewhere writable with --dest (or pull.dest in config.yaml)") from None


def _pull_locked(job: dict, root: Path, fetcher: Any, policy: KeepPolicy, host: str,
                 progress: ProgressSink, rehash: bool, reverify: int, only: Optional[set[str]],
                 unsafe: dict[str, str]) -> JobPull:
    rec = JobRecord(root)
    rec._saved_at = time.monotonic()  # type: ignore[attr-defined]  # a short pass saves once, in write_marker
    rec.data["job"] = {"id": job["id"], "name": job.get("name"), "state": job.get("state"), "host": host}
    result = JobPull(job_id=job["id"], root=root, pending=len(job.get("pending") or []))
    for path, why in unsafe.items():
        result.refused.append(path)
        result.failed.append({"path": path, "reason": why})
    safe = [f for f in job["files"] if f["path"] not in unsafe]
    metrics_files = [f for f in safe if f.get("kind") == "metrics"]
    metrics_paths = [rec.final_path(f["path"]) for f in metrics_files]
    recheck = ({f["path"] for f in safe} if rehash else reverify_sample(rec, safe, reverify))
    recheck |= only or set()  # asked for by name: the record's word is not enough

    def ensure(files: list[dict]) -> None:
        todo: list[dict] = []
        for f in files:
            state = _local_ok(rec, f, f["path"] in recheck)
            if state is True:
                result.skipped += 1
                continue
            if only is not None and f["path"] not in only:
                continue
            if state is False:
                result.repaired.append(f["path"])
            todo.append(f)
        if callable(getattr(fetcher, "fetch_tree", None)):
            small = [f for f in todo if f["size"] <= BATCH_FILE_MAX]
            if len(small) > 1:
                pulled, left = _fetch_batch(fetcher, rec, small, job["id"], progress, result)
                result.pulled.extend(f["path"] for f in pulled)
                done = {f["path"] for f in pulled}
                retry = {f["path"] for f in left}
                todo = [f for f in todo if f["path"] not in done
                        and (f["size"] > BATCH_FILE_MAX or f["path"] in retry)]
        for f in todo:
            if _fetch_one(fetcher, rec, f, job["id"], progress, result):
                result.pulled.append(f["path"])

    ensure(metrics_files)  # first: the best-checkpoint choice reads them
    keep, gone, why = policy.split(job["files"], metrics_paths)
    ensure([f for f in keep if f.get("kind") != "metrics" and f["path"] not in unsafe])
    for f in gone:
        if f["path"] in unsafe:
            continue  # never had a place at home
        final = rec.final_path(f["path"])
        if final.exists():
            final.unlink()  # local copy only, and only one the policy superseded
        rec.mark(f["path"], state="superseded", sha256=f["sha256"], size=f["size"])
        result.superseded.append(f["path"])
    result.verified, result.complete = write_marker(job, rec, keep, gone, why, host, unsafe)
    return result
