"""This machine, as the controller sees it (psutil): its CPU / RAM line, and one process's
RSS / CPU / age, such as the local agent daemon's.

The box-side line (``health.system.host_load``) is read from /proc by the agent, which ships
without psutil. This module is the controller's side, where psutil is the right tool: it reads
any OS the controller runs on (a macOS laptop has no /proc) and any process by pid, including
one that is not ours. ``machine()`` has the same keys as ``host_load`` so one renderer shows both.

psutil is imported on first use (about 20 ms), never by a command that does not call this.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional

__all__ = ["machine", "process", "local_agent"]


def _psutil() -> Any:
    import psutil  # a base dependency; imported lazily for the cold CLI

    return psutil


def machine(sample_s: float = 0.2, *, ps: Any = None) -> Dict[str, Any]:
    """``{load: [1, 5, 15 min] | None, cpus, cpu_pct, mem_used_bytes, mem_total_bytes, mem_pct,
    mem_scope}`` of this machine, read now (CPU % over ``sample_s``; 0 asks psutil for the share
    since its last call, which is meaningless on a first call, so it gives None).

    Memory is the machine's (``mem_scope: "host"``): total less available, as ``free`` shows it.
    Unknown values are None, never an exception."""
    ps = ps or _psutil()
    out: Dict[str, Any] = {"load": None, "cpus": None, "cpu_pct": None, "mem_used_bytes": None,
                           "mem_total_bytes": None, "mem_pct": None, "mem_scope": None}
    try:
        out["load"] = [round(float(x), 2) for x in ps.getloadavg()]
    except (AttributeError, OSError):
        pass
    try:
        out["cpus"] = len(ps.Process().cpu_affinity())  # the CPUs we may run on
    except (AttributeError, OSError, ps.Error):
        out["cpus"] = ps.cpu_count() or None
    if sample_s > 0:
        try:
            out["cpu_pct"] = round(float(ps.cpu_percent(interval=sample_s)), 1)
        except (OSError, ps.Error):
            pass
    try:
        vm = ps.virtual_memory()
    except (OSError, ps.Error):
        vm = None
    if vm is not None and vm.total:
        used = int(vm.total - vm.available)
        out.update(mem_used_bytes=used, mem_total_bytes=int(vm.total),
                   mem_pct=round(100.0 * used / vm.total, 1), mem_scope="host")
    return out


def process(pid: int, sample_s: float = 0.1, *, ps: Any = None,
            now: Callable[[], float] = time.time) -> Optional[Dict[str, Any]]:
    """``{pid, name, alive, rss_bytes, cpu_pct, threads, started_at, age_s}`` of ``pid``, or None
    when no such process exists (or it is a zombie). CPU % is of one core over ``sample_s`` (0:
    None). Fields the OS does not let us read (another user's process) are None."""
    ps = ps or _psutil()
    try:
        p = ps.Process(int(pid))
        if p.status() == ps.STATUS_ZOMBIE:
            return None
    except (ps.NoSuchProcess, ValueError):
        return None
    except ps.AccessDenied:
        return {"pid": int(pid), "name": None, "alive": True, "rss_bytes": None, "cpu_pct": None,
                "threads": None, "started_at": None, "age_s": None}
    out: Dict[str, Any] = {"pid": p.pid, "name": None, "alive": True, "rss_bytes": None, "cpu_pct": None,
                           "threads": None, "started_at": None, "age_s": None}
    try:
        with p.oneshot():
            out["name"] = p.name()
            out["rss_bytes"] = int(p.memory_info().rss)
            out["threads"] = p.num_threads()
            started = float(p.create_time())
            out["started_at"] = started
            out["age_s"] = round(max(0.0, now() - started), 1)
        if sample_s > 0:
            out["cpu_pct"] = round(float(p.cpu_percent(interval=sample_s)), 1)
    except ps.NoSuchProcess:
        return None
    except ps.AccessDenied:
        pass
    return out


def local_agent(host: str = "local", sample_s: float = 0.1, *, ps: Any = None) -> Optional[Dict[str, Any]]:
    """The daemon of a host whose agent runs on this machine: ``process()`` of the pid holding
    its lock, plus ``build`` and ``state_dir``; None when no daemon runs there."""
    from orchestrator.agent.control import running_daemon
    from orchestrator.paths import local_state_dir

    state_dir = str(local_state_dir(host))
    if not os.path.isdir(state_dir):
        return None
    info = running_daemon(state_dir)
    if not info or not info.get("pid"):
        return None
    proc = process(info["pid"], sample_s, ps=ps)
    if proc is None:
        return None
    proc.update(build=info.get("build"), state_dir=state_dir)
    return proc
