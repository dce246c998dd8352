"""Agent daemon use cases: what the daemon on a host is doing (``status``) and stopping it
(``stop``), without ever starting one (the ``agent_info`` and ``agent_stop`` verbs do not ensure).

Stopping the daemon leaves running jobs alone: they run detached in their own sessions and the
next daemon (started by the next gpurun command for that host) re-adopts them by marker. What
nobody does meanwhile is watch them, enforce timeouts, retry them or start queued jobs, so a
stop with running jobs needs the caller's confirmation (``confirm``) or ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from orchestrator import hosts as hostinv

__all__ = ["AgentStatus", "StopResult", "status", "stop"]


@dataclass(frozen=True)
class AgentStatus:
    """The daemon of one host as ``gpurun agent status`` shows it."""

    host: str
    running: bool
    pid: Optional[int]
    build: Optional[str]
    agent: str                    # the agent version that answered
    started_at: Optional[float]
    uptime_s: Optional[float]
    queued: int
    running_jobs: int
    state_dir: str
    idle_exit_minutes: Optional[float]
    last_activity: Optional[float]
    process: Optional[dict] = None  # this machine's daemon only: {rss_bytes, cpu_pct, threads} (psutil)
    disk: Optional[dict] = None     # while the state dir's disk is full: {full, since, message, hint, free_bytes}
    scheduler: Optional[str] = None  # "slurm": a host whose agent never runs a daemon (Slurm is the queue)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "running": self.running, "pid": self.pid, "build": self.build,
                "agent": self.agent, "started_at": self.started_at, "uptime_s": self.uptime_s,
                "jobs": {"queued": self.queued, "running": self.running_jobs}, "state_dir": self.state_dir,
                "idle_exit_minutes": self.idle_exit_minutes, "last_activity": self.last_activity,
                "process": self.process, "disk": self.disk, "scheduler": self.scheduler}


@dataclass(frozen=True)
class StopResult:
    """What ``stop`` did: ``stopped`` is False when no daemon was running."""

    host: str
    stopped: bool
    pid: Optional[int]
    running: list[dict]           # {id, name, seq}: still running, unwatched until the next start
    queued: int                   # start when the next command starts the agent

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "stopped": self.stopped, "pid": self.pid,
                "running_jobs": self.running, "queued": self.queued}


def _status(name: str, info: dict) -> AgentStatus:
    d = info.get("daemon") or {}
    jobs = info.get("jobs") or {}
    return AgentStatus(name, bool(info.get("daemon")), d.get("pid"), d.get("build"), str(info.get("agent")),
                       d.get("started_at"), d.get("uptime_s"), int(jobs.get("queued", 0)),
                       int(jobs.get("running", 0)), info["state_dir"], info.get("idle_exit_minutes"),
                       info.get("last_activity"), disk=info.get("disk"))


def status(host: Optional[str] = None) -> AgentStatus:
    """The daemon of ``host`` (default: local, or $GPURUN_HOST); starts nothing."""
    from orchestrator.core.session import open_session

    entry = hostinv.get_host(host)
    with open_session(host=entry) as s:
        st = _status(entry["name"], dict(s.agent_info()))
    if entry.get("profile") and entry.get("kind") == "ssh":
        from dataclasses import replace

        from orchestrator.core.client import host_config
        st = replace(st, scheduler=host_config(entry).get("scheduler"))
    if entry.get("kind", "local") == "local" and st.running and st.pid:
        # the daemon runs on this machine: what it costs, read by psutil (a remote box has no psutil)
        from dataclasses import replace

        from orchestrator.core.localhost import process
        proc = process(st.pid)
        if proc is not None:
            st = replace(st, process={k: proc[k] for k in ("rss_bytes", "cpu_pct", "threads")})
    return st


def stop(host: Optional[str] = None, *, force: bool = False,
         confirm: Optional[Callable[[str, list[dict]], None]] = None) -> StopResult:
    """Stop the daemon of ``host``. With running jobs and no ``force``, ``confirm(host, running)``
    is asked (it raises to refuse); without ``confirm`` the agent refuses (``BadInput``)."""
    from orchestrator.core.session import open_session

    entry = hostinv.get_host(host)
    with open_session(host=entry) as s:
        info = s.agent_info()
        if info["daemon"] is None:
            return StopResult(entry["name"], False, None, list(info["running"]), int(info["jobs"].get("queued", 0)))
        if info["running"] and not force and confirm is not None:
            confirm(entry["name"], list(info["running"]))
            force = True
        res = s.agent_stop(force)
    return StopResult(entry["name"], bool(res["stopped"]), res["pid"], list(res["running"]), int(res["queued"]))
