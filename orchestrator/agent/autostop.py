"""Idle autostop on the box (opt-in): decide whether the GPU box is idle, and if so hand the
decision to a teardown-gate callable. This module never stops anything itself.

Idle = no queued or running job AND every GPU below the utilization threshold AND no metric
progress (metrics file writes, job ends) for ``idle_minutes``; an open SSH session is not use.
The stop command is the config's ``autostop.command``: the provider profile's in-instance
meter-stop verb (``meter_stop.how.command``, filled in by ``orchestrator.profiles``) unless
the user set one; this module knows no provider. Stdlib only: it runs inside the agent zipapp.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from orchestrator.agent.states import ACTIVE

IDLE_SINCE = "autostop.idle_since"
NO_VERB_SAID = "autostop.no_verb_said"


def last_progress(jobs: Iterable[Dict[str, Any]]) -> Optional[float]:
    """Latest sign of work: a metrics file written, or a job that started or ended."""
    latest = None
    for j in jobs:
        for ts in (j.get("started_at"), j.get("ended_at")):
            if ts:
                latest = ts if latest is None else max(latest, ts)
        path = j.get("metrics")
        if path:
            try:
                m = os.path.getmtime(path)
            except OSError:
                continue
            latest = m if latest is None else max(latest, m)
    return latest


def decide(jobs: List[Dict[str, Any]], gpu_utils: List[Optional[float]], *, now: float,
           idle_minutes: float, util_threshold: float = 10.0,
           idle_since: Optional[float] = None) -> Dict[str, Any]:
    """Pure decision. Returns ``{"idle", "stop", "reasons", "idle_since", "idle_for_s"}``:
    ``reasons`` says what keeps the box busy (or why it is idle); ``stop`` is True only after
    the box has been idle for ``idle_minutes`` in a row."""
    busy: List[str] = []
    active = [j for j in jobs if j.get("state") in ACTIVE]
    if active:
        busy.append(f"{len(active)} job(s) queued or running")
    hot = [u for u in gpu_utils if u is None or u >= util_threshold]
    if hot:
        # an unreadable GPU counts as busy: never stop a box we cannot see
        busy.append(f"{len(hot)} GPU(s) at or above {util_threshold:g}% (or unreadable)")
    progress = last_progress(jobs)
    window = idle_minutes * 60.0
    if progress is not None and now - progress < window:
        busy.append(f"metric progress {int(now - progress)}s ago")
    if busy:
        return {"idle": False, "stop": False, "reasons": busy, "idle_since": None, "idle_for_s": 0.0}
    # idleness must be observed for the whole window, not inferred from old timestamps
    start = idle_since if idle_since is not None else now
    idle_for = max(0.0, now - start)
    return {"idle": True, "stop": idle_for >= window,
            "reasons": [f"no jobs, GPUs below {util_threshold:g}%, no progress"],
            "idle_since": start, "idle_for_s": round(idle_for, 1)}


def tick(store: Any, config: Dict[str, Any], *, gpu_utils: Callable[[], List[Optional[float]]],
         gate: Callable[[Dict[str, Any]], Dict[str, Any]], now: Optional[float] = None) -> Dict[str, Any]:
    """One autostop check, called from the agent's periodic loop.

    ``gate(plan)`` is the teardown gate: it verifies the artifacts are home (or pushed) and only
    then runs ``plan["command"]``; it returns ``{"passed": bool, "detail": str}``. Returns the
    ``autostop`` record: ``action`` is disabled | busy | idle | no_stop_command | no_safe_verb |
    gate_refused | stopped (``no_stop_command`` and ``no_safe_verb`` carry ``detail`` in words).
    """
    cfg = config.get("autostop") or {}
    if not cfg.get("enabled"):
        return {"action": "disabled"}
    now = time.time() if now is None else now
    jobs = store.jobs()
    d = decide(jobs, gpu_utils(), now=now, idle_minutes=float(cfg.get("idle_minutes", 30)),
               util_threshold=float(cfg.get("util_threshold", 10.0)),
               idle_since=store.kv_get(IDLE_SINCE))
    if not d["idle"]:
        store.kv_set(IDLE_SINCE, None)
        if store.kv_get(NO_VERB_SAID):
            store.kv_set(NO_VERB_SAID, None)
        return dict(d, action="busy")
    store.kv_set(IDLE_SINCE, d["idle_since"])
    if not d["stop"]:
        return dict(d, action="idle")
    verb = meter_stop_plan(config)
    if verb.get("command") is None:
        if store.kv_get(NO_VERB_SAID) != verb["action"]:  # say it once per idle spell, not every tick
            store.add_event(None, "autostop", "warn", "box idle, not stopping: " + verb["detail"])
            store.kv_set(NO_VERB_SAID, verb["action"])
        return dict(d, action=verb["action"], detail=verb["detail"])
    plan = dict(d, **verb)
    res = gate(plan)
    if not res.get("passed"):
        store.add_event(None, "autostop", "warn", f"box idle; teardown gate refused: {res.get('detail')}")
        return dict(plan, action="gate_refused", detail=res.get("detail"))
    store.add_event(None, "autostop", "info", f"box idle {d['idle_for_s']:.0f}s; meter stopped via "
                    f"{verb['command']}", {"idle_for_s": d["idle_for_s"]})
    store.kv_set(IDLE_SINCE, None)
    return dict(plan, action="stopped", detail=res.get("detail"))


def meter_stop_plan(config: Dict[str, Any]) -> Dict[str, Any]:
    """The verb autostop may use: ``{command, irreversible}`` from ``autostop.command`` (the
    profile's in-instance stop, or the user's own), or, when there is none to use,
    ``{command: None, action, detail}`` saying why in plain words. Irreversible commands
    need ``autostop.allow_irreversible``."""
    cfg = config.get("autostop") or {}
    command = cfg.get("command")
    provider = config.get("provider") or "this host"
    if not command:
        return {"command": None, "action": "no_stop_command",
                "detail": "the %s profile has no in-instance stop command (meter_stop.how.command), "
                          "so autostop can only report idleness; stop the box yourself or set "
                          "autostop.command" % provider}
    irreversible = bool(cfg.get("irreversible", False))
    if irreversible and not cfg.get("allow_irreversible"):
        return {"command": None, "action": "no_safe_verb",
                "detail": "the stop command %r is irreversible and autostop.allow_irreversible is "
                          "not set" % command}
    return {"command": command, "irreversible": irreversible}
