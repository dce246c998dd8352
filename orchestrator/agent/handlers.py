"""Which function answers which verb of ``orchestrator.agent.protocol``: the agent's one
dispatch table, checked against the protocol at import (a verb without a handler, or a
handler without a verb, is a packaging bug caught by the test suite, not on a box).

The queue verbs answer from ``verbs``; the health, quality, sync and agent (``verbs_agent``)
rooms load only when their verb is asked (the one-shot verb process would otherwise import
GPU probing and the metric readers for every ``status``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from orchestrator.agent import protocol as P
from orchestrator.agent import verbs
from orchestrator.agent.context import AgentContext

Handler = Callable[[AgentContext, Dict[str, Any]], Dict[str, Any]]


def _gpu(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_health import v_gpu
    return v_gpu(ctx, req)


def _reap(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_health import v_reap
    return v_reap(ctx, req)


def _snapshot(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_health import v_snapshot
    return v_snapshot(ctx, req)


def _check(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_quality import v_check
    return v_check(ctx, req)


def _manifest(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_sync import v_manifest
    return v_manifest(ctx, req)


def _mark_pulled(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_sync import v_mark_pulled
    return v_mark_pulled(ctx, req)


def _agent_info(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_agent import v_agent_info
    return v_agent_info(ctx, req)


def _agent_stop(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent.verbs_agent import v_agent_stop
    return v_agent_stop(ctx, req)


def _secret_set(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent import secrets
    name = req.get("name")
    try:
        set_at = secrets.put(ctx.state_dir, name, req.get("value"))  # type: ignore[arg-type]
    except ValueError as exc:  # the message names the secret, never its value
        raise P.VerbError(str(exc), P.BAD_INPUT, secrets.NAME_HINT if not secrets.valid_name(name) else
                          "set a value of at least %d characters" % secrets.MIN_LEN) from None
    ctx.store.add_event(None, "secret_set", "info", "secret %s set" % name, {"notify": False})
    return {"name": name, "set_at": set_at}


def _secret_ls(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent import secrets
    return {"secrets": [{"name": n, "set_at": t} for n, t in sorted(secrets.names(ctx.state_dir).items())]}


def _secret_rm(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    from orchestrator.agent import secrets
    name = str(req.get("name") or "")
    removed = secrets.valid_name(name) and secrets.remove(ctx.state_dir, name)
    if removed:
        ctx.store.add_event(None, "secret_rm", "info", "secret %s removed" % name, {"notify": False})
    return {"name": name, "removed": bool(removed)}


HANDLERS: Dict[str, Handler] = {
    P.SUBMIT.name: verbs.v_submit,
    P.STATUS.name: verbs.v_status,
    P.LOGS.name: verbs.v_logs,
    P.CANCEL.name: verbs.v_cancel,
    P.RETRY.name: verbs.v_retry,
    P.EVENTS.name: verbs.v_events,
    P.GPU.name: _gpu,
    P.REAP.name: _reap,
    P.SNAPSHOT.name: _snapshot,
    P.CHECK.name: _check,
    P.MANIFEST.name: _manifest,
    P.MARK_PULLED.name: _mark_pulled,
    P.AGENT_INFO.name: _agent_info,
    P.AGENT_STOP.name: _agent_stop,
    P.SECRET_SET.name: _secret_set,
    P.SECRET_LS.name: _secret_ls,
    P.SECRET_RM.name: _secret_rm,
    P.RELEASE.name: verbs.v_release,
}

if set(HANDLERS) != set(P.VERBS):  # pragma: no cover - caught by tests/agent/test_protocol.py
    raise ImportError("agent handlers and protocol disagree: %s"
                      % sorted(set(HANDLERS).symmetric_difference(P.VERBS)))


def handler(verb: str) -> Handler:
    """The handler of ``verb``; an unknown verb is an ``unknown_verb`` error naming this build."""
    fn = HANDLERS.get(verb)
    if fn is None:
        from orchestrator.agent import AGENT_VERSION
        raise P.VerbError("this agent (%s, protocol %d) has no verb %r" % (AGENT_VERSION, P.PROTOCOL_VERSION, verb),
                          P.UNKNOWN_VERB, "the controller and the agent on the box are different builds: "
                          "upgrade gpurun on the controller, then run any command again to replace the agent")
    return fn
