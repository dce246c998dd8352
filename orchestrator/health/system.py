"""Host facts the watchdog trusts inside containers: cgroup v1/v2 memory and ``oom_kill``,
disk and inode use per storage path, boot id and boot time; and ``host_load``, the CPU / RAM
line of ``gpurun watch``.

Host-wide ``free``/``uptime`` describe the whole machine, not our container, so the watchdog's
facts never use them (``host_load`` prefers the cgroup's memory and says which it used). Root paths are parameters so tests can point them at a fake tree. The process
table (stat, environ, children, the job marker) lives in ``procs``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from .procs import children_map  # noqa: F401  (agent/watchdog_hook reads it from here)

_V1_UNLIMITED = 1 << 60  # v1 reports "no limit" as a page-rounded LLONG_MAX


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _int(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _kv(text: Optional[str]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _own_cgroup(proc: str) -> Dict[str, str]:
    """controller -> path from /proc/self/cgroup ("" key for the v2 unified entry)."""
    out: Dict[str, str] = {}
    for line in (_read(os.path.join(proc, "self", "cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctl in parts[1].split(",") if parts[1] else [""]:
                out[ctl] = parts[2]
    return out


def _first_dir(root: str, rel: str) -> str:
    """Our cgroup's dir if visible, else the mount root (a cgroup namespace shows us as '/')."""
    cand = os.path.join(root, rel.lstrip("/"))
    return cand if rel and os.path.isdir(cand) else root


def cgroup_memory(root: str = "/sys/fs/cgroup", proc: str = "/proc") -> Dict[str, Any]:
    """``{version, limit_bytes, usage_bytes, pct, oom_kill, oom}``; unknown values are None.

    ``limit_bytes`` is None when unlimited. ``oom_kill`` counts kills by the cgroup OOM killer
    (v2 ``memory.events``; v1 ``memory.oom_control`` on kernels >= 4.13).
    """
    own = _own_cgroup(proc)
    out: Dict[str, Any] = {"version": None, "limit_bytes": None, "usage_bytes": None,
                           "pct": None, "oom_kill": None, "oom": None}
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        d = _first_dir(root, own.get("", "/"))
        out["version"] = 2
        out["limit_bytes"] = _int(_read(os.path.join(d, "memory.max")))
        out["usage_bytes"] = _int(_read(os.path.join(d, "memory.current")))
        events = _kv(_read(os.path.join(d, "memory.events")))
    else:
        base = os.path.join(root, "memory")
        if not os.path.isdir(base):
            return out
        d = _first_dir(base, own.get("memory", "/"))
        out["version"] = 1
        limit = _int(_read(os.path.join(d, "memory.limit_in_bytes")))
        out["limit_bytes"] = limit if limit is not None and limit < _V1_UNLIMITED else None
        out["usage_bytes"] = _int(_read(os.path.join(d, "memory.usage_in_bytes")))
        events = _kv(_read(os.path.join(d, "memory.oom_control")))
    out["oom_kill"] = events.get("oom_kill")
    out["oom"] = events.get("oom")
    if out["limit_bytes"] and out["usage_bytes"] is not None:
        out["pct"] = round(100.0 * out["usage_bytes"] / out["limit_bytes"], 2)
    return out


def disk_usage(paths: Iterable[str], statvfs: Callable[[str], Any] = os.statvfs) -> List[Dict[str, Any]]:
    """Bytes and inode use per path, one row per filesystem (first path naming it wins).

    Paths that do not exist are skipped. Percentages count reserved blocks as used, like df.
    """
    rows: List[Dict[str, Any]] = []
    seen = set()
    for path in paths:
        if not path:
            continue
        try:
            st = statvfs(path)
        except OSError:
            continue
        key = (getattr(st, "f_fsid", None), st.f_blocks, st.f_files)
        if key in seen and key[0]:
            continue
        seen.add(key)
        total = st.f_blocks * st.f_frsize
        avail = st.f_bavail * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        denom = used + avail
        inodes_used = st.f_files - st.f_ffree
        rows.append({
            "path": path,
            "bytes_total": total,
            "bytes_used": used,
            "bytes_free": avail,
            "pct": round(100.0 * used / denom, 2) if denom else None,
            "inodes_total": st.f_files,
            "inodes_used": inodes_used,
            "inodes_pct": round(100.0 * inodes_used / st.f_files, 2) if st.f_files else None,
        })
    return rows


def boot_id(proc: str = "/proc") -> Optional[str]:
    """The kernel's boot id, which changes on every reboot; where it is hidden (some
    sandboxes) ``btime-<boot time>`` stands in, which changes on reboot too. None only when
    neither is readable. The agent's reconcile and the watchdog's reboot check both use this."""
    text = _read(os.path.join(proc, "sys", "kernel", "random", "boot_id"))
    if text and text.strip():
        return text.strip()
    bt = boot_time(proc)
    return "btime-%d" % int(bt) if bt is not None else None


def boot_time(proc: str = "/proc") -> Optional[float]:
    for line in (_read(os.path.join(proc, "stat")) or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def _cpu_times(proc: str) -> Optional[List[int]]:
    """``(busy, total)`` jiffies of the aggregate ``cpu`` line of /proc/stat."""
    for line in (_read(os.path.join(proc, "stat")) or "").splitlines():
        if line.startswith("cpu "):
            vals = [int(x) for x in line.split()[1:] if x.isdigit()]
            if len(vals) < 4:
                return None
            # idle + iowait are the time no task ran; guest time is already inside user/nice
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
            total = sum(vals[:8])
            return [total - idle, total]
    return None


def _meminfo(proc: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for line in (_read(os.path.join(proc, "meminfo")) or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024  # /proc/meminfo counts kB
    return out


def host_load(proc: str = "/proc", sys_cgroup: str = "/sys/fs/cgroup", sample_s: float = 0.2,
              sleep: Callable[[float], None] = time.sleep) -> Dict[str, Any]:
    """The CPU / RAM line of ``gpurun watch``, read now:
    ``{load: [1, 5, 15 min] | None, cpus, cpu_pct, mem_used_bytes, mem_total_bytes, mem_pct, mem_scope}``.

    CPU % is the busy share of all CPUs over ``sample_s`` (two /proc/stat reads: one verb is
    one process, so there is no earlier sample to compare with). Load average is the kernel's,
    which inside a container is the whole machine's. Memory is the container's cgroup use and
    limit when it has a limit (what the OOM killer judges, ``mem_scope: "cgroup"``), else the
    machine's total less ``MemAvailable`` (``mem_scope: "host"``). Unknown values are None.
    """
    load: Optional[List[float]] = None
    fields = (_read(os.path.join(proc, "loadavg")) or "").split()
    try:
        load = [float(x) for x in fields[:3]] if len(fields) >= 3 else None
    except ValueError:
        load = None
    try:
        cpus = len(os.sched_getaffinity(0))  # the CPUs we may run on, not the machine's count
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    cpu_pct: Optional[float] = None
    first = _cpu_times(proc)
    if first is not None and sample_s > 0:
        sleep(sample_s)
        second = _cpu_times(proc)
        if second is not None and second[1] > first[1]:
            cpu_pct = round(100.0 * (second[0] - first[0]) / (second[1] - first[1]), 1)
    out: Dict[str, Any] = {"load": load, "cpus": cpus or None, "cpu_pct": cpu_pct, "mem_used_bytes": None,
                           "mem_total_bytes": None, "mem_pct": None, "mem_scope": None}
    cg = cgroup_memory(sys_cgroup, proc)
    if cg["limit_bytes"] and cg["usage_bytes"] is not None:
        out.update(mem_used_bytes=cg["usage_bytes"], mem_total_bytes=cg["limit_bytes"], mem_scope="cgroup")
    else:
        mi = _meminfo(proc)
        total, avail = mi.get("MemTotal"), mi.get("MemAvailable", mi.get("MemFree"))
        if total and avail is not None:
            out.update(mem_used_bytes=total - avail, mem_total_bytes=total, mem_scope="host")
    if out["mem_total_bytes"]:
        out["mem_pct"] = round(100.0 * out["mem_used_bytes"] / out["mem_total_bytes"], 1)
    return out
