"""The controller's client of the agent: one typed method per verb of ``orchestrator.agent.protocol``.

A call is one round trip: it runs the agent zipapp on the host (ensuring the daemon, with
this host's config, on the client's first call) and decodes the sentinel-framed envelope.
If the zipapp is missing it is pushed and the call repeated; nothing had run, so the repeat
is safe. Several threads may call verbs on one client at once: the push is done once, under
``_push_lock``, and a thread that found the agent missing meanwhile waits for it rather than
pushing again. An error reply becomes the matching ``GpurunError`` (``errors.from_agent``); a
reply of the wrong shape, or an unknown verb, is an ``AgentProtocolError`` naming both builds.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from typing import Any, List, Optional, cast

from orchestrator import __version__
from orchestrator.agent import AGENT_VERSION
from orchestrator.agent import protocol as P
from orchestrator.errors import AgentError, AgentProtocolError, from_agent
from orchestrator.transport.base import rpath as rq
from orchestrator.transport.framing import unframe

NO_AGENT = 97
# profile sections the agent runs with, and the host's own settings that win over them
PROFILE_KEYS = ("watchdog", "quality", "autostop", "paths", "detach", "recovery", "reap", "notify", "agent")
HOST_KEYS = ("expect_gpus", "gpus", "notify", "instance", "workdir", "min_free_mib")


def host_config(host: dict) -> dict:
    """The config the agent runs with: profile sections plus host overrides."""
    from orchestrator.profiles import load_profile
    cfg: dict[str, Any] = {"host": host["name"], "profile": host.get("profile"), "slots": host.get("slots") or 1}
    prof = load_profile(host.get("profile") or "local")
    for key in PROFILE_KEYS:
        val = prof.get(key)
        if val is not None:
            cfg[key] = val
    for key in HOST_KEYS:
        if host.get(key) is not None:
            cfg[key] = host[key]
    cfg["provider"] = (host.get("instance") or {}).get("provider") or host.get("profile")
    if prof.get("kind") == "slurm":  # no daemon: each job is an sbatch job (agent/slurm.py)
        cfg["scheduler"] = "slurm"
        cfg["slurm"] = {**(prof.get("slurm") or {}), **(host.get("slurm") or {})}
    return cfg


class AgentClient:
    """A host's inventory entry, its transport, and the agent's verbs as methods."""

    def __init__(self, host: dict, transport: Any):
        self.host = host
        self.transport = transport
        self.ensured = False
        self.state_dir = host.get("state_dir") or "~/.gpurun"
        self.python = sys.executable if host.get("kind") == "local" else host.get("python", "python3")
        self._push_lock = threading.Lock()
        self._pushed: Optional[str] = None  # the agent build this client put on the host

    # --- the verbs -------------------------------------------------------------------------
    def submit(self, jobs: List[P.JobSpec]) -> P.SubmitReply:
        res = cast(P.SubmitReply, self._call(P.SUBMIT, {"jobs": jobs}))
        self._remember({"jobs": jobs}, res, "submit")
        return res

    def status(self, jobs: Optional[List[str]] = None, *, timeout: float = 120, table: bool = False) -> P.StatusReply:
        """``table``: every job with only the table's columns (an older agent sends whole jobs)."""
        req: P.StatusRequest = {"jobs": jobs} if jobs else ({"table": True} if table else {})
        res = cast(P.StatusReply, self._call(P.STATUS, req, timeout=timeout))
        self._remember(req, res, "status")
        return res

    def logs(self, job: str, offset: int = -1, tail_bytes: int = 64 * 1024, *,
             tail_lines: Optional[int] = None) -> P.LogsReply:
        """From ``offset``, or with -1 the tail: the last ``tail_lines`` whole lines when given,
        else the last ``tail_bytes`` (moved to the next line start)."""
        req: P.LogsRequest = {"job": job, "offset": offset, "tail_bytes": tail_bytes}
        if tail_lines is not None:
            req["tail_lines"] = tail_lines
        return cast(P.LogsReply, self._call(P.LOGS, req))

    def cancel(self, jobs: List[str], all_: bool = False) -> P.CancelReply:
        return cast(P.CancelReply, self._call(P.CANCEL, {"jobs": jobs, "all": all_}))

    def release(self, ids: List[str], to: str) -> P.ReleaseReply:
        """Let queued jobs go to fleet host ``to`` (compare-and-set; a started job is refused)."""
        return cast(P.ReleaseReply, self._call(P.RELEASE, {"jobs": ids, "to": to}))

    def retry(self, job: str, force: bool = False) -> P.RetryReply:
        return cast(P.RetryReply, self._call(P.RETRY, {"job": job, "force": force}))

    def events(self, job: Optional[str] = None, limit: int = 1000, *, newest: bool = False,
               since_id: int = 0) -> P.EventsReply:
        req: P.EventsRequest = {"job": job, "limit": limit, "newest": newest, "since_id": since_id}
        return cast(P.EventsReply, self._call(P.EVENTS, req))

    def gpu(self, expect_gpus: Optional[int] = None) -> P.GpuReply:
        req: P.GpuRequest = {} if expect_gpus is None else {"expect_gpus": expect_gpus}
        return cast(P.GpuReply, self._call(P.GPU, req))

    def reap(self, req: P.ReapRequest, *, timeout: float = 120) -> P.ReapReply:
        return cast(P.ReapReply, self._call(P.REAP, req, timeout=timeout))

    def snapshot(self, *, timeout: float = 120, finished: Optional[int] = None) -> P.SnapshotReply:
        req: P.SnapshotRequest = {} if finished is None else {"finished": finished}
        return cast(P.SnapshotReply, self._call(P.SNAPSHOT, req, timeout=timeout))

    def check(self, req: P.CheckRequest) -> P.CheckReply:
        return cast(P.CheckReply, self._call(P.CHECK, req))

    def manifest(self, jobs: Optional[List[str]] = None, settle_s: float = 2.0) -> P.ManifestReply:
        # hashing a new multi-GB checkpoint on the box can take a while: a generous timeout
        return cast(P.ManifestReply, self._call(P.MANIFEST, {"jobs": jobs, "settle_s": settle_s}, timeout=3600))

    def mark_pulled(self, job: str, files: List[dict], where: str = "home") -> P.MarkPulledReply:
        req: P.MarkPulledRequest = {"job": job, "files": files, "at": time.time(), "where": where}
        return cast(P.MarkPulledReply, self._call(P.MARK_PULLED, req))

    def agent_info(self) -> P.AgentInfoReply:
        return cast(P.AgentInfoReply, self._call(P.AGENT_INFO, {}))

    def agent_stop(self, force: bool = False) -> P.AgentStopReply:
        return cast(P.AgentStopReply, self._call(P.AGENT_STOP, {"force": force}))

    def secret_set(self, name: str, value: str) -> P.SecretSetReply:
        """The value travels only in this request's body (the channel's stdin): never in argv,
        and never recorded (no ``_remember``, no log)."""
        return cast(P.SecretSetReply, self._call(P.SECRET_SET, {"name": name, "value": value}))

    def secret_ls(self) -> P.SecretLsReply:
        return cast(P.SecretLsReply, self._call(P.SECRET_LS, {}))

    def secret_rm(self, name: str) -> P.SecretRmReply:
        return cast(P.SecretRmReply, self._call(P.SECRET_RM, {"name": name}))

    def close(self) -> None:
        self.transport.close()

    # --- the round trip ----------------------------------------------------------------------
    def _remember(self, req: Any, res: Any, verb: str) -> None:
        """Keep the controller-side copy of the job table for `gpurun recover`."""
        from orchestrator.core import snapshot
        snapshot.record(self.host, verb, req, res)

    def _detach(self, cfg: dict) -> str:
        d = cfg.get("detach")
        return (d.get("method") if isinstance(d, dict) else d) or "setsid"

    def _call(self, verb: P.Verb, payload: Any, *, timeout: Optional[float] = 120) -> dict:
        from orchestrator.core import agentship
        build, pyz = agentship.build()
        rpyz = f"{self.state_dir}/bin/agent-{build}.pyz"
        rdir = f"{self.state_dir}/bin/agent-{build}"
        req = dict(payload or {})
        py = shlex.quote(self.python)
        args = f"{shlex.quote(verb.name)} --state-dir {rq(self.state_dir)}"
        # the unpacked copy (bytecode cached) when present, else the zipapp, else ask for it
        cmd = (f"if [ -f {rq(rdir + '/__main__.py')} ]; then exec {py} {rq(rdir + '/__main__.py')} {args}; "
               f"elif [ -f {rq(rpyz)} ]; then exec {py} {rq(rpyz)} {args}; "
               f"else echo GPURUN-NO-AGENT; exit {NO_AGENT}; fi")
        ensuring = not self.ensured and verb.starts_daemon
        if ensuring:
            cfg = host_config(self.host)
            req["_config"] = cfg
            cmd = cmd.replace(args, f"{args} --ensure {build} --detach {shlex.quote(self._detach(cfg))}")
        body = json.dumps(req)
        res = self.transport.run(cmd, input=body, timeout=timeout)
        if res.exit_code == NO_AGENT and "GPURUN-NO-AGENT" in res.stdout:
            self._push(build, str(pyz), rpyz)
            res = self.transport.run(cmd, input=body, timeout=timeout)
        try:
            envelope = unframe(res.stdout)
        except ValueError:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            hint = "is python3 (>= 3.8) installed on the host?" if res.exit_code == 127 else \
                "see the agent log in the host's state dir (agent.log)"
            raise AgentError(f"agent on {self.host['name']} gave no reply to {verb.name!r} (exit {res.exit_code}): "
                             + " | ".join(tail)[:400], hint) from None
        self.ensured = self.ensured or ensuring
        if not isinstance(envelope, dict) or ("ok" not in envelope):
            raise self._mismatch(verb, envelope, "an envelope without 'ok'")
        if not envelope["ok"]:
            err = envelope.get("error") or {}
            kind, msg = str(err.get("kind")), str(err.get("message") or "agent error")
            if kind == P.UNKNOWN_VERB:
                raise self._mismatch(verb, envelope, msg)
            hint, name = err.get("hint") or None, self.host["name"]
            if kind == P.NOT_FOUND and name != "local":  # the agent cannot know the name it has here
                msg, hint = self._not_found(err, msg)
            raise from_agent(kind, msg, hint, host=name)
        result = envelope.get("result")
        missing = verb.missing_keys(result)
        if missing:
            raise self._mismatch(verb, envelope, "a reply without " + ", ".join(missing))
        return result

    def _not_found(self, err: dict, msg: str) -> tuple[str, str]:
        """A ``not_found`` reply in this host's words, from its ``job`` field; an agent from
        before the field gets its own message, prefixed with the host it came from."""
        name = self.host["name"]
        hint = f"see `gpurun queue status --host {name}` for job names, ids and numbers"
        ref = err.get("job")
        if isinstance(ref, str):
            return f"no job {ref!r} on {name}", hint
        return f"{name}: {msg}", hint

    def _push(self, build: str, pyz: str, rpyz: str) -> None:
        """Put the agent zipapp on the host, once per client and build: a second verb that
        found it missing while the first was pushing waits here, then finds it there."""
        with self._push_lock:
            if self._pushed == build:
                return
            self.transport.run(f"mkdir -p {rq(self.state_dir + '/bin')}", timeout=60)
            self.transport.put(pyz, rpyz)
            self._pushed = build

    def _mismatch(self, verb: P.Verb, envelope: Any, what: str) -> AgentProtocolError:
        theirs = envelope if isinstance(envelope, dict) else {}
        return AgentProtocolError(
            f"agent on {self.host['name']} answered {verb.name!r} with {what} (controller gpurun {__version__}, "
            f"agent {AGENT_VERSION}, protocol {P.PROTOCOL_VERSION}; box agent {theirs.get('agent', 'unknown')}, "
            f"protocol {theirs.get('protocol', 'unknown')})",
            "the controller and the agent on the box are different builds: reinstall gpurun here "
            "(pip install -e .), then run the command again to replace the agent")
