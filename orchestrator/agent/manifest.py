"""The remote artifact manifest: per job, every declared file with size, mtime and SHA-256.

Runs on the GPU box (stdlib only, Python >= 3.8). Hashes are streamed in 4 MiB chunks and
cached by (size, mtime_ns, inode) under the state dir, so a 10 GB checkpoint is hashed once
(and a file replaced by another of the same size and mtime is hashed again). A file enters the
manifest only when it is finished: its job is terminal, or its size and mtime did not change
between two polls at least ``settle_s`` apart. The wait between the two polls is not idle: the
files that look quiet already are hashed during it, and the hash is kept when the second poll
finds them unchanged, so a pull does not wait for the settle and then for the hash. Temp names
never enter it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import time
from typing import Any, Dict, Iterator, List, Tuple

from orchestrator.agent.states import TERMINAL

try:  # fcntl is POSIX-only; the agent runs on Linux, tests may not.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore

CHUNK = 4 << 20  # fewer reads per GB; memory stays at one chunk
SCHEMA = "gpurun/MANIFEST/v1"
# Writers use these while a file is incomplete; a crashed job may leave them behind. They
# are never artifacts, even once the job has ended.
TEMP_PATTERNS = ("*.tmp", "*.partial", ".*.swp", ".tmp*", "*.part", ".gpurun-partial")
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
METRIC_SUFFIXES = (".jsonl", ".csv", ".tfevents")


def sha256_file(path: str, chunk: int = CHUNK) -> str:
    """Streamed SHA-256 of a file; memory stays at one chunk whatever the size."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _sig(st: os.stat_result) -> Tuple[int, int, int]:
    """What says "the same file, unchanged" without reading it: size, mtime and inode (a
    file replaced by a rename keeps neither its inode nor, usually, its hash)."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def is_temp_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in TEMP_PATTERNS)


class HashCache:
    """JSON cache ``abs path -> {size, mtime_ns, sha256, obs}`` guarded by an flock, so two
    concurrent manifest calls neither hash twice nor lose each other's observations."""

    def __init__(self, state_dir: str):
        self.dir = os.path.join(state_dir, "sync")
        os.makedirs(self.dir, exist_ok=True)
        self.path = os.path.join(self.dir, "hash-cache.json")
        self._lock_fh = None
        self.data: Dict[str, Dict[str, Any]] = {}

    def __enter__(self) -> "HashCache":
        self._lock_fh = open(os.path.join(self.dir, "hash-cache.lock"), "a")
        if fcntl is not None:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_EX)
        try:
            with open(self.path, "r", encoding="utf-8") as fh:
                loaded = json.load(fh)
            self.data = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self.data = {}  # a lost cache only costs re-hashing
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.data, fh, separators=(",", ":"))
            os.replace(tmp, self.path)
        finally:
            if self._lock_fh is not None:
                self._lock_fh.close()  # closing drops the flock


def _walk(root: str) -> Iterator[Tuple[str, str]]:
    """Yield (abs path, path relative to root) for every entry under a dir, sorted, not
    following symlinks; a root that is a file yields itself under its basename."""
    if os.path.isfile(root) or os.path.islink(root):
        yield root, os.path.basename(root)
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not is_temp_name(d))
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            full = os.path.join(dirpath, name)
            yield full, os.path.relpath(full, root).replace(os.sep, "/")


def _kind(section: str, rel: str) -> str:
    if section == "checkpoints":
        return "checkpoint"
    if section == "metrics":
        return "metrics"
    low = rel.lower()
    if low.endswith(LOG_SUFFIXES) or "/logs/" in "/" + low:
        return "log"
    if low.endswith(METRIC_SUFFIXES) or "metrics" in os.path.basename(low):
        return "metrics"
    return "evidence"


def job_roots(job: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The declared artifact roots of a job as (section, abs path); missing ones skipped."""
    roots: List[Tuple[str, str]] = []
    for section, key in (("checkpoints", "checkpoints"), ("run", "run_dir"), ("metrics", "metrics")):
        path = job.get(key)
        if path and os.path.exists(path):
            roots.append((section, os.path.abspath(path)))
    return roots


class _Scan:
    """One job's scan: classifies every file as ready, pending (still changing) or skipped."""

    def __init__(self, job: Dict[str, Any], cache: HashCache, now: float, settle_s: float):
        self.job = job
        self.cache = cache
        self.now = now
        self.settle_s = settle_s
        self.terminal = job.get("state") in TERMINAL
        self.roots = job_roots(job)
        self.ckpt_root_is_file = os.path.isfile(job.get("checkpoints") or "")
        self.files: List[Dict[str, Any]] = []
        self.pending: List[Dict[str, Any]] = []
        self.skipped: List[Dict[str, Any]] = []
        self.unsettled: List[Tuple[str, str, str, str]] = []
        self.prehashed: Dict[str, Tuple[Tuple[int, int, int], str]] = {}
        self.seen: set = set()

    def run(self) -> None:
        for section, root in self.roots:
            for full, rel in _walk(root):
                real = full if os.path.islink(full) else os.path.realpath(full)
                if real in self.seen:
                    continue  # checkpoints inside the run dir are listed once, as checkpoints
                self.seen.add(real)
                path = section + "/" + rel
                if os.path.islink(full):
                    self.skipped.append({"path": path, "reason": "symlink"})
                elif is_temp_name(os.path.basename(full)) or any(is_temp_name(p) for p in rel.split("/")[:-1]):
                    self.skipped.append({"path": path, "reason": "temp name"})
                else:
                    self._consider(full, path, section, rel)

    def _consider(self, full: str, path: str, section: str, rel: str) -> None:
        try:
            st = os.stat(full)
        except OSError:
            return  # vanished between listing and stat: a writer's rename, next pass sees it
        entry = self.cache.data.setdefault(full, {})
        obs = entry.get("obs")
        sig = [st.st_size, st.st_mtime_ns]
        if self.terminal or (obs and obs[:2] == sig and self.now - obs[2] >= self.settle_s):
            self._ready(full, path, section, rel, st)
            return
        if not obs or obs[:2] != sig:
            entry["obs"] = sig + [self.now]
        self.unsettled.append((full, path, section, rel))

    def prehash(self, budget_end: float, clock) -> None:
        """During the settle wait: hash the unsettled files that look quiet (not modified for
        ``settle_s`` already, not hashed under this signature before), oldest first, until
        ``budget_end``. A hash is kept only if the file did not change while it was read; the
        second poll then decides, as without it, whether the file is listed."""
        quiet = []
        for full, _path, _section, _rel in self.unsettled:
            try:
                st = os.stat(full)
            except OSError:
                continue
            entry = self.cache.data.get(full, {})
            cached = (entry.get("size"), entry.get("mtime_ns"), entry.get("ino")) == _sig(st) and entry.get("sha256")
            if not cached and self.now - st.st_mtime_ns / 1e9 >= self.settle_s:
                quiet.append((st.st_mtime_ns, full, st))
        for _mtime, full, st in sorted(quiet):
            if clock() >= budget_end:
                return
            try:
                digest = sha256_file(full)
                after = os.stat(full)
            except OSError:
                continue
            if _sig(after) == _sig(st):
                self.prehashed[full] = (_sig(st), digest)

    def settle(self, now: float) -> None:
        """Second poll for files seen changing or seen for the first time."""
        self.now = now
        todo, self.unsettled = self.unsettled, []
        for full, path, section, rel in todo:
            try:
                st = os.stat(full)
            except OSError:
                continue
            obs = self.cache.data.get(full, {}).get("obs")
            if obs and obs[:2] == [st.st_size, st.st_mtime_ns] and now - obs[2] >= self.settle_s:
                self._ready(full, path, section, rel, st)
            else:
                self.cache.data.setdefault(full, {})["obs"] = [st.st_size, st.st_mtime_ns, now]
                self.pending.append({"path": path, "size": st.st_size, "reason": "still changing"})

    def _ready(self, full: str, path: str, section: str, rel: str, st: os.stat_result) -> None:
        entry = self.cache.data.setdefault(full, {})
        if (entry.get("size"), entry.get("mtime_ns"), entry.get("ino")) != _sig(st) or not entry.get("sha256"):
            pre = self.prehashed.get(full)
            if pre is not None and pre[0] == _sig(st):
                digest = pre[1]  # hashed during the settle wait, unchanged since
            else:
                digest = sha256_file(full)
                after = os.stat(full)
                if _sig(after) != _sig(st):
                    entry["obs"] = [after.st_size, after.st_mtime_ns, time.time()]
                    self.pending.append({"path": path, "size": after.st_size, "reason": "changed while hashing"})
                    return
            entry.update(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino, sha256=digest)
        item = {"path": path, "remote": full, "kind": _kind(section, rel), "size": st.st_size,
                "mtime": st.st_mtime_ns / 1e9, "sha256": entry["sha256"]}
        if section == "checkpoints":
            item["unit"] = rel if self.ckpt_root_is_file else rel.split("/")[0]
        self.files.append(item)

    def result(self) -> Dict[str, Any]:
        self.files.sort(key=lambda f: f["path"])
        return {
            "id": self.job.get("id"), "name": self.job.get("name"), "state": self.job.get("state"),
            "terminal": self.terminal, "roots": dict(self.roots),
            "files": self.files, "pending": self.pending, "skipped": self.skipped,
            "complete": self.terminal and not self.pending,
            "bytes": sum(f["size"] for f in self.files),
        }


def build_manifest(state_dir: str, jobs: List[Dict[str, Any]], settle_s: float = 2.0,
                   clock=time.time, sleep=time.sleep) -> Dict[str, Any]:
    """Manifest of ``jobs`` (store job dicts). Files seen changing or seen for the first
    time get one second poll after ``settle_s`` within this call; still changing, they are
    listed as ``pending`` for the next pass. Raises OSError only for an unusable state dir."""
    with HashCache(state_dir) as cache:
        scans = [_Scan(job, cache, clock(), settle_s) for job in jobs]
        for scan in scans:
            scan.run()
        if any(s.unsettled for s in scans):
            start = clock()
            for scan in scans:  # the wait is spent hashing what will most likely be listed
                scan.prehash(start + settle_s, clock)
            left = settle_s - (clock() - start)
            if left > 0:
                sleep(left)
            now = clock()
            for scan in scans:
                scan.settle(now)
        # forget files that no longer exist so the cache does not grow without bound
        known_roots = [r for s in scans for _, r in s.roots]
        for path in list(cache.data):
            if any(path.startswith(r) for r in known_roots) and not os.path.exists(path):
                del cache.data[path]
        return {"schema": SCHEMA, "host_time": clock(), "jobs": [s.result() for s in scans]}
