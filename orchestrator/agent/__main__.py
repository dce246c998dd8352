"""Command line of the agent zipapp: ``python3 agent.pyz VERB --state-dir DIR``.

Verbs (``orchestrator.agent.protocol``) read one JSON request on stdin and print one
sentinel-framed envelope on stdout;
``daemon`` runs the loop, ``jobwrap`` runs one job attempt, ``ensure`` starts the daemon;
``slurmjob`` runs one attempt inside a Slurm allocation (a Slurm host has no daemon).
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _arg(argv: list, flag: str, default: str = "") -> str:
    if flag in argv:
        i = argv.index(flag)
        if i + 1 < len(argv):
            return argv[i + 1]
    return default


def main(argv: list) -> int:
    if not argv:
        sys.stderr.write("usage: agent.pyz VERB --state-dir DIR\n")
        return 2
    verb = argv[0]
    if verb == "jobwrap":
        from orchestrator.agent import jobwrap
        return jobwrap.main(argv[1:])
    if verb == "slurmjob":  # inside a Slurm allocation: one attempt, from runs/<id>/spec.json
        from orchestrator.agent import slurmjob
        return slurmjob.main(argv[1:])
    state_dir = os.path.abspath(os.path.expanduser(_arg(argv, "--state-dir")))
    if verb == "daemon":
        from orchestrator.agent.daemon import Daemon
        return Daemon(state_dir, os.path.abspath(sys.argv[0]), _arg(argv, "--build", "dev")).run()
    from orchestrator.agent import AGENT_VERSION
    from orchestrator.agent.framing import frame
    from orchestrator.agent.protocol import ERROR_KINDS, INTERNAL, PROTOCOL_VERSION
    req: dict = {}
    try:
        raw = sys.stdin.read()
        req = json.loads(raw) if raw.strip() else {}
        ensure_build = _arg(argv, "--ensure")
        if ensure_build and verb != "ensure":
            # one round trip: make sure the daemon runs (same build), then answer the verb
            dispatch("ensure", state_dir, {"build": ensure_build, "detach": _arg(argv, "--detach", "setsid"),
                                           **({"config": req.pop("_config")} if "_config" in req else {})})
        req.pop("_config", None)
        result = dispatch(verb, state_dir, req)
        out = {"ok": True, "result": result}
    except Exception as exc:  # every failure becomes a framed error reply, never a bare traceback
        kind = getattr(exc, "kind", None)
        if isinstance(kind, str) and kind in ERROR_KINDS:  # VerbError, and the store's refusals
            out = {"ok": False, "error": {**(getattr(exc, "fields", None) or {}), "kind": kind,
                                          "message": str(exc), "hint": getattr(exc, "hint", "")}}
        elif _disk_full(exc):  # an operational state of the box, not an agent bug (issue 14)
            out = {"ok": False, "error": _disk_full_error(state_dir, verb, exc)}
        else:
            out = {"ok": False, "error": {"kind": INTERNAL, "message": "%s: %s" % (type(exc).__name__, exc),
                                          "hint": "agent traceback follows in 'trace'",
                                          "trace": traceback.format_exc()}}
    out = _redacted(out, state_dir, req.get("value") if verb == "secret_set" and isinstance(req, dict) else None)
    out.update(agent=AGENT_VERSION, protocol=PROTOCOL_VERSION)
    sys.stdout.write(frame(out))
    sys.stdout.flush()
    return 0


def _disk_full(exc: BaseException) -> bool:
    from orchestrator.agent.diskfull import is_full
    return is_full(exc)


def _disk_full_error(state_dir: str, verb: str, exc: BaseException) -> dict:
    """The reply for a verb that found the state dir's disk full: what failed, and what to do.
    The controller maps its kind to ``DiskFull`` (``errors.from_agent``); it is not in
    ``ERROR_KINDS`` on purpose: an older controller maps an unknown kind to an operational agent
    error with this message and hint (exit 1), never to "agent bug"."""
    from orchestrator.agent.diskfull import HINT, free_bytes
    free = free_bytes(state_dir)
    return {"kind": "disk_full", "message": "disk full on the host: %s has %s free, so `%s` changed nothing (%s)"
            % (state_dir, "?" if free is None else "%d KiB" % (free // 1024), verb, exc),
            "hint": HINT % state_dir}


def _redacted(out: dict, state_dir: str, extra: object = None) -> dict:
    """The reply with every known secret value (and ``extra``, the value a ``secret_set``
    brought) masked: logs, job fields, events, error messages and tracebacks alike."""
    from orchestrator.agent import secrets
    masks = secrets.values(state_dir)
    if isinstance(extra, str) and len(extra) >= secrets.MIN_LEN:
        masks = sorted(set(masks) | set(secrets.forms(extra)), key=len, reverse=True)
    return secrets.redact_obj(out, masks) if masks else out


def unpack_self() -> None:
    """Unpack the zipapp next to itself (``agent-<build>.pyz`` -> ``agent-<build>/``) once.

    Modules imported from a zip are compiled on every call; from a directory Python caches
    their bytecode, which makes every later verb round trip cheaper. The client prefers the
    directory when it exists. Extraction goes to a temp dir renamed into place, so a half
    unpacked directory is never used.
    """
    pyz = os.path.abspath(sys.argv[0])
    if not pyz.endswith(".pyz") or not os.path.isfile(pyz):
        return
    target = pyz[:-4]
    if os.path.isdir(target):
        return
    import shutil
    import zipfile
    tmp = "%s.%d.tmp" % (target, os.getpid())
    try:
        with zipfile.ZipFile(pyz) as z:
            z.extractall(tmp)
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another caller won the race, or no space: keep the zip


# verbs that read jobs: the host's backend first brings the store up to date with its scheduler
# (agent/backend: Slurm's, as no daemon does it there); the verbs that change jobs ask it themselves
READS = frozenset({"status", "logs", "events", "snapshot", "manifest", "check"})


def dispatch(verb: str, state_dir: str, req: dict) -> dict:
    from orchestrator.agent import control
    os.makedirs(state_dir, exist_ok=True)
    if verb not in ("agent_info", "agent_stop"):  # looking at the agent is not using it
        # before any ensure: an idle daemon about to exit re-reads this under the ensure lock
        control.touch_activity(state_dir)
    if verb == "ensure":
        unpack_self()
        changed = "config" in req and control.write_config(state_dir, req["config"])
        from orchestrator.agent import backend
        res = backend.of(control.load_config(state_dir)).ensure(
            state_dir, os.path.abspath(sys.argv[0]), req.get("build", "dev"), detach=req.get("detach", "setsid"))
        if res["action"] == "none" and changed:
            control.wake(state_dir)
        return res
    from orchestrator.agent.context import AgentContext
    from orchestrator.agent.handlers import handler
    from orchestrator.agent.store import Store
    fn = handler(verb)
    store = Store(control.files(state_dir)["db"])
    try:
        ctx = AgentContext(state_dir, store, control.load_config(state_dir))
        if verb in READS:
            from orchestrator.agent import backend
            backend.of(ctx.config).sync(ctx)
        return fn(ctx, req)
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
