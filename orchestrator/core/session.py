"""A session with one host: its inventory entry, a transport, and agent verb calls.

``call`` is one round trip: it runs the agent zipapp on the host (ensuring the daemon on the
session's first call) and decodes the sentinel-framed reply. If the zipapp is missing it is
pushed and the call repeated; nothing had run, so the repeat is safe.
"""

from __future__ import annotations

import json
import shlex
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from orchestrator import hosts as hostinv
from orchestrator.errors import AgentError, BadInput, JobNotFound, TransportError
from orchestrator.transport.base import rpath as rq
from orchestrator.transport.framing import unframe

NO_AGENT = 97


def host_config(host: dict) -> dict:
    """The config the agent runs with: profile sections plus host overrides."""
    cfg: dict[str, Any] = {"host": host["name"], "profile": host.get("profile"), "slots": host.get("slots") or 1}
    try:
        from orchestrator.profiles import load_profile
        prof = load_profile(host.get("profile") or "local")
    except ImportError:
        prof = None
    if prof is not None:
        for key in ("watchdog", "quality", "autostop", "paths", "detach", "recovery", "reap", "notify"):
            val = prof.get(key)
            if val is not None:
                cfg[key] = val
    # the host's own settings win over its profile's
    for key in ("expect_gpus", "gpus", "notify", "instance", "workdir", "min_free_mib"):
        if host.get(key) is not None:
            cfg[key] = host[key]
    cfg["provider"] = (host.get("instance") or {}).get("provider") or host.get("profile")
    return cfg


class Session:
    def __init__(self, host: dict, transport: Any):
        self.host = host
        self.transport = transport
        self.ensured = False
        self.state_dir = host.get("state_dir") or "~/.gpurun"
        self.python = sys.executable if host.get("kind") == "local" else host.get("python", "python3")

    def _detach(self, cfg: dict) -> str:
        d = cfg.get("detach")
        return (d.get("method") if isinstance(d, dict) else d) or "setsid"

    def call(self, verb: str, payload: dict | None = None, *, timeout: float | None = 120) -> dict:
        from orchestrator.core import agentship
        build, pyz = agentship.build()
        rpyz = f"{self.state_dir}/bin/agent-{build}.pyz"
        rdir = f"{self.state_dir}/bin/agent-{build}"
        req = dict(payload or {})
        py = shlex.quote(self.python)
        args = f"{shlex.quote(verb)} --state-dir {rq(self.state_dir)}"
        # the unpacked copy (bytecode cached) when present, else the zipapp, else ask for it
        cmd = (f"if [ -f {rq(rdir + '/__main__.py')} ]; then exec {py} {rq(rdir + '/__main__.py')} {args}; "
               f"elif [ -f {rq(rpyz)} ]; then exec {py} {rq(rpyz)} {args}; "
               f"else echo GPURUN-NO-AGENT; exit {NO_AGENT}; fi")
        if not self.ensured:
            cfg = host_config(self.host)
            req["_config"] = cfg
            cmd = cmd.replace(args, f"{args} --ensure {build} --detach {shlex.quote(self._detach(cfg))}")
        body = json.dumps(req)
        res = self.transport.run(cmd, input=body, timeout=timeout)
        if res.exit_code == NO_AGENT and "GPURUN-NO-AGENT" in res.stdout:
            self.transport.run(f"mkdir -p {rq(self.state_dir + '/bin')}", timeout=60)
            self.transport.put(str(pyz), rpyz)
            res = self.transport.run(cmd, input=body, timeout=timeout)
        try:
            reply = unframe(res.stdout)
        except ValueError:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            hint = "is python3 (>= 3.8) installed on the host?" if res.exit_code == 127 else \
                "see the agent log in the host's state dir (agent.log)"
            raise AgentError(f"agent on {self.host['name']} gave no reply to {verb!r} (exit {res.exit_code}): "
                             + " | ".join(tail)[:400], hint) from None
        self.ensured = True
        if reply.get("ok"):
            if verb in ("submit", "status"):  # keep the controller-side copy for `gpurun recover`
                from orchestrator.core import snapshot
                snapshot.record(self.host, verb, req, reply["result"])
            return reply["result"]
        err = reply.get("error", {})
        kind, msg, hint = err.get("kind"), err.get("message", "agent error"), err.get("hint") or None
        if kind == "not_found":
            raise JobNotFound(msg, hint)
        if kind == "bad_input":
            raise BadInput(msg, hint)
        if kind == "internal":
            raise AgentError(f"agent bug on {self.host['name']}: {msg}", "please report it with the output of "
                             "`gpurun queue status --json` and the agent log")
        raise AgentError(msg, hint)

    def close(self) -> None:
        self.transport.close()


def make_transport(host: dict) -> Any:
    if host.get("kind", "local") == "local":
        from orchestrator.transport.local import LocalTransport
        return LocalTransport(host)
    try:
        from orchestrator.transport.ssh import SSHTransport
    except ImportError as exc:  # pragma: no cover - packaging error
        raise TransportError(f"SSH transport unavailable: {exc}") from exc
    return SSHTransport(host)


@contextmanager
def open_session(host_name: str | None = None, *, host: dict | None = None) -> Iterator[Session]:
    entry = host or hostinv.get_host(host_name)
    session = Session(entry, make_transport(entry))
    try:
        yield session
    finally:
        session.close()
