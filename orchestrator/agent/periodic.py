"""Periodic work of the daemon besides running jobs: the watchdog tick, the quality pass
(checks of running jobs and the final check of ended ones, ``agent/quality_cadence``), and idle
autostop behind the box-side teardown gate.

Every room it calls ships in the agent zipapp (a missing one is a packaging bug, loud at
daemon start). No hook may stop the loop that guards running jobs: a failing pass is written
to the agent log and the loop goes on.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

from orchestrator.agent import autostop, quality_cadence, watchdog_hook
from orchestrator.agent.context import AgentContext
from orchestrator.agent.gpus import gpu_report
from orchestrator.agent.notifications import flush_notifications, record_queue_done
from orchestrator.agent.pulled import unpulled
from orchestrator.quality.options import cadence


def _quality_scan_every(cfg: Dict[str, Any]) -> float:
    """How often the quality pass runs: ``quality.scan_s`` (one default, in ``quality.options``),
    never less often than the shortest interval it must keep."""
    cad = cadence(cfg)
    return max(0.5, min(cad["scan_s"], cad["first_s"], min(cad["ladder"])))


NOTIFY_EVERY_S = 5.0   # the notify pass at the latest this often
NOTIFY_SOON_S = 1.0    # and this soon after a new event (a failed job, a STOP, a drained queue)


class Periodic:
    """The daemon's clock for everything but running jobs; ``run`` is called every loop pass."""

    def __init__(self, ctx: AgentContext):
        self.ctx = ctx
        self.due: Dict[str, float] = {}
        self.notified = (0, 0.0)  # (the newest event id the last notify pass saw, when it ran)

    def run(self, now: Optional[float] = None) -> None:
        now = time.time() if now is None else now
        cfg = self.ctx.config
        interval = float((cfg.get("watchdog") or {}).get("interval_s", 60))
        auto_every = float((cfg.get("autostop") or {}).get("check_interval_s", 60))
        q_every = _quality_scan_every(cfg)
        # the daemon is usually started by a verb that is still on its way (a submit): the first
        # autostop look waits one interval, so an empty box is never stopped in that instant
        self.due.setdefault("autostop", now + auto_every)
        # a job that just ended gets its final quality check in this pass, not at the next scan:
        # SIGCHLD woke the loop, the runner settled it, and a look at the cursor is one query
        todo = (("final", 0.0, self.final),) if quality_cadence.finals_pending(self.ctx.store) else ()
        for name, every, fn in todo + (("watchdog", interval, self.watchdog), ("quality", q_every, self.quality),
                                       ("autostop", auto_every, self.autostop),
                                       ("notify", NOTIFY_EVERY_S, self.notify)):
            if name == "notify" and not self._notify_soon():
                continue
            if now >= self.due.get(name, 0.0):
                self.due[name] = now + every
                try:
                    fn(now)
                except Exception:
                    sys.stderr.write("periodic %s failed:\n%s" % (name, traceback.format_exc()))
                    sys.stderr.flush()

    def watchdog(self, now: float) -> None:
        watchdog_hook.tick(self.ctx)

    def _newest_event(self) -> int:
        rows = self.ctx.store.events(0, None, 1, newest=True)
        return int(rows[0]["id"]) if rows else 0

    def _notify_soon(self) -> bool:
        """Bring the notify pass forward to ``NOTIFY_SOON_S`` after its last run when an event
        came since: a failed job is told and a drained queue's "queue done" recorded within a
        second, not at the next 5 s mark. One look at the events table's newest row; False
        (and the pass skipped) when that look fails, as a failing hook would."""
        try:
            if self._newest_event() > self.notified[0]:
                self.due["notify"] = min(self.due.get("notify", 0.0), self.notified[1] + NOTIFY_SOON_S)
        except Exception:
            sys.stderr.write("periodic notify failed:\n%s" % traceback.format_exc())
            sys.stderr.flush()
            return False
        return True

    def notify(self, now: float) -> None:
        # read first: an event written while this pass runs brings the next one forward (the
        # pass's own "queue done" too, which costs one more pass that finds nothing new)
        self.notified = (self._newest_event(), now)
        if not self.ctx.config.get("notify"):
            # nobody to tell, but `queue events` still gets its "queue done" within seconds
            record_queue_done(self.ctx, now)
            return
        flush_notifications(self.ctx, now)

    def quality(self, now: float) -> None:
        quality_cadence.tick(self.ctx, now)

    def final(self, now: float) -> None:
        quality_cadence.final_pass(self.ctx, now)

    def autostop(self, now: float) -> None:
        if not (self.ctx.config.get("autostop") or {}).get("enabled"):
            return
        autostop.tick(self.ctx.store, self.ctx.config, gpu_utils=self._gpu_utils, gate=self._gate, now=now)

    def _gpu_utils(self) -> List[Optional[float]]:
        return [s.util_pct for s in gpu_report(self.ctx.config)["_samples"]]

    def _gate(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        """The teardown gate on the box: every artifact's current bytes verified at home."""
        missing = unpulled(self.ctx)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            return {"passed": False, "detail": "%d artifact(s) not verified at home: %s" % (len(missing), shown)}
        subprocess.Popen(["/bin/sh", "-c", plan["command"]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        return {"passed": True, "detail": "all artifacts verified at home; ran %s" % plan["command"]}
