"""VRAM orphan reaper: find processes holding ``/dev/nvidia*`` that no live job owns, then
(only when asked) end them with TERM, then KILL after a grace.

"Orphan" here is a *running* process whose job is gone; the CLI calls these "VRAM zombies".
A kernel zombie (state ``Z``) holds no device and is never a candidate; both words are
defined once in ``procs``.

Holders come from ``/proc/*/fd`` (NVML pids are host pids inside containers, so they cannot be
trusted); live jobs' process trees, system daemons, ourselves, other users' processes (unless
asked) and processes younger than the threshold are never candidates. ``plan()`` is pure
reading; ``execute()`` re-checks each pid's start time first so a reused pid is never hit.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import re
import signal
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from . import procs, system

DEVICE_GLOB = ("/dev/nvidia*",)
GLOB_ENV = "GPURUN_FAKE_DEVICE_GLOB"  # test seam: ':'-separated globs standing in for /dev/nvidia*
MIN_AGE_S = 120.0
SYSTEM_DAEMONS = ("nvidia-persistenced", "nvidia-persiste", "Xorg", "X", "Xwayland", "nv-hostengine",
                  "dcgm", "dcgmi", "dcgm-exporter", "nvidia-fabricmanager", "nv-fabricmanager",
                  "nvidia-smi", "gnome-shell", "kwin_x11", "kwin_wayland")
_DEV_MINOR = re.compile(r"nvidia(\d+)$")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _is_daemon(comm: str) -> bool:
    return comm in SYSTEM_DAEMONS or comm.startswith("dcgm") or comm.startswith("nvidia-persist")


def default_glob() -> Sequence[str]:
    fake = os.environ.get(GLOB_ENV)
    return tuple(g for g in fake.split(":") if g) if fake else DEVICE_GLOB


def scan_holders(device_glob: Optional[Sequence[str]] = None, proc: str = "/proc") -> List[Dict[str, Any]]:
    """Every visible process with an fd on a path matching ``device_glob``."""
    device_glob = device_glob or default_glob()
    out = []
    for pid in procs.all_pids(proc):
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's and we are not root
            continue
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if any(fnmatch.fnmatchcase(target, g) for g in device_glob):
                devices.add(target)
        if devices:
            try:
                uid = os.stat(os.path.join(proc, str(pid))).st_uid
            except OSError:
                continue
            out.append({"pid": pid, "uid": uid, "devices": sorted(devices)})
    return out


def _cmdline(pid: int, proc: str) -> str:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _ancestors(pid: int, proc: str) -> set:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = procs.proc_stat(pid, proc)
        if not st:
            break
        pid = st["ppid"]
    return out


def plan(live_job_ids: Iterable[str] = (), protected_pids: Iterable[int] = (), *,
         device_glob: Optional[Sequence[str]] = None, min_age_s: float = MIN_AGE_S,
         all_users: bool = False, proc: str = "/proc", now: Optional[float] = None) -> Dict[str, Any]:
    """What a reap would do. ``live_job_ids``: running jobs as ids (any attempt protected)
    or markers ``<id>:<attempt>`` (only that attempt: a leftover of an earlier attempt is an
    orphan), matched against each process's ``GPURUN_JOB_TOKEN``; ``protected_pids``: their
    recorded pids (covers unreadable environments).
    Returns ``{candidates, skipped, device_glob, min_age_s, all_users}``."""
    now = time.time() if now is None else now
    device_glob = list(device_glob or default_glob())
    live = {str(j) for j in live_job_ids}
    btime = system.boot_time(proc)
    holders = scan_holders(device_glob, proc)
    kids = procs.children_map(proc) if holders else {}
    roots = set(int(p) for p in protected_pids if p)
    envs: Dict[int, Optional[Dict[str, str]]] = {}
    for h in holders:  # a holder whose env names a live job protects its whole tree
        env = envs[h["pid"]] = procs.proc_environ(h["pid"], proc)
        if procs.marker_of(env) in live or procs.job_of(env) in live:
            roots.add(h["pid"])
    protected = procs.descendants(roots, kids)
    mine = _ancestors(os.getpid(), proc)
    me = os.getuid()
    candidates, skipped = [], []
    for h in holders:
        pid = h["pid"]
        st = procs.proc_stat(pid, proc)
        if not procs.is_running(st):
            continue  # gone, or a kernel zombie: it holds nothing any more
        age = procs.process_age(st["start_ticks"], now, btime)
        row = {"pid": pid, "uid": h["uid"], "user": _user(h["uid"]), "comm": st["comm"],
               "cmdline": _cmdline(pid, proc)[:300], "age_s": round(age, 1) if age is not None else None,
               "devices": h["devices"], "start_ticks": st["start_ticks"],
               "job_id": procs.job_of(envs.get(pid))}
        why = None
        if pid in protected:
            why = "part of live job %s" % (row["job_id"] or "tree")
        elif pid in mine:
            why = "gpurun itself"
        elif _is_daemon(st["comm"]):
            why = "system daemon"
        elif h["uid"] != me and not all_users:
            why = "another user's process (use --all-users)"
        elif age is None or age < min_age_s:
            why = "younger than %.0f s" % min_age_s
        if why:
            row["reason"] = why
            skipped.append(row)
        else:
            candidates.append(row)
    return {"candidates": candidates, "skipped": skipped, "device_glob": list(device_glob),
            "min_age_s": min_age_s, "all_users": all_users}


def _alive(row: Dict[str, Any], proc: str) -> bool:
    st = procs.proc_stat(row["pid"], proc)
    return procs.is_running(st) and st["start_ticks"] == row["start_ticks"]


def execute(the_plan: Dict[str, Any], grace: float = 10.0, *, proc: str = "/proc",
            kill: Callable[[int, int], None] = os.kill) -> List[Dict[str, Any]]:
    """TERM every candidate, wait up to ``grace`` s, KILL survivors. One result per pid:
    ``outcome`` is ``terminated`` | ``killed`` | ``gone`` | ``failed`` (with ``error``)."""
    results: Dict[int, Dict[str, Any]] = {}
    pending = []
    for row in the_plan.get("candidates", []):
        pid = row["pid"]
        if not _alive(row, proc):
            results[pid] = {"pid": pid, "outcome": "gone"}
            continue
        try:
            kill(pid, signal.SIGTERM)
            pending.append(row)
        except ProcessLookupError:
            results[pid] = {"pid": pid, "outcome": "gone"}
        except OSError as err:
            results[pid] = {"pid": pid, "outcome": "failed", "error": err.strerror or str(err)}
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        still = []
        for r in pending:
            if _alive(r, proc):
                still.append(r)
            else:
                results[r["pid"]] = {"pid": r["pid"], "outcome": "terminated"}
        pending = still
        if pending:
            time.sleep(0.05)
    for row in pending:
        pid = row["pid"]
        try:
            kill(pid, signal.SIGKILL)
            results[pid] = {"pid": pid, "outcome": "killed"}
        except ProcessLookupError:
            results[pid] = {"pid": pid, "outcome": "terminated"}
        except OSError as err:
            results[pid] = {"pid": pid, "outcome": "failed", "error": err.strerror or str(err)}
    return [results[r["pid"]] for r in the_plan.get("candidates", []) if r["pid"] in results]


def orphans_by_gpu(the_plan: Dict[str, Any], samples: List[Any]) -> Dict[int, List[int]]:
    """GPU index -> candidate pids holding its ``/dev/nvidiaN`` (N = the GPU's minor number)."""
    by_minor = {(s.minor if s.minor is not None else s.index): s.index for s in samples}
    out: Dict[int, List[int]] = {}
    for row in the_plan.get("candidates", []):
        for dev in row["devices"]:
            m = _DEV_MINOR.search(dev)
            if m and int(m.group(1)) in by_minor:
                out.setdefault(by_minor[int(m.group(1))], []).append(row["pid"])
    return out


def free_after_reap(the_plan: Dict[str, Any], samples: List[Any]) -> Dict[int, Optional[float]]:
    """Admission check for the runner: MiB free per GPU if the plan's candidates were reaped.

    Uses NVML's per-process memory where the pid matches (outside containers); inside
    containers it is the plain free figure, so callers should reap then re-sample."""
    orphans = orphans_by_gpu(the_plan, samples)
    out: Dict[int, Optional[float]] = {}
    for s in samples:
        free = s.mem_free_mib
        if free is not None:
            pids = set(orphans.get(s.index, []))
            free += sum(p.used_mib or 0.0 for p in (s.processes or []) if p.pid in pids)
        out[s.index] = free
    return out

