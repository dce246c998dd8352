"""Periodic work of the daemon besides running jobs: the watchdog tick, the quality check of
running jobs, and idle autostop behind the box-side teardown gate.

Every hook is optional (its room may be absent from a trimmed agent) and none may stop the
loop that guards running jobs: failures are written to the agent log and the loop goes on.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional


def _quality_scan_every(cfg: Dict[str, Any]) -> float:
    """How often to look for due quality checks: at least as often as the shortest interval
    of the ladder (one default, in ``quality.options``), and at least every 30 s."""
    try:
        from orchestrator.quality.options import check_intervals
    except ImportError:  # a trimmed agent without the quality room: nothing to schedule
        return 30.0
    return max(1.0, min(30.0, min(check_intervals(cfg))))


class Periodic:
    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.due: Dict[str, float] = {}

    def run(self, now: Optional[float] = None) -> None:
        now = time.time() if now is None else now
        cfg = self.ctx.config
        interval = float((cfg.get("watchdog") or {}).get("interval_s", 60))
        auto_every = float((cfg.get("autostop") or {}).get("check_interval_s", 60))
        q_every = _quality_scan_every(cfg)
        for name, every, fn in (("watchdog", interval, self.watchdog), ("quality", q_every, self.quality),
                                ("autostop", auto_every, self.autostop), ("notify", 5.0, self.notify)):
            if now >= self.due.get(name, 0.0):
                self.due[name] = now + every
                try:
                    fn(now)
                except Exception:
                    sys.stderr.write("periodic %s failed:\n%s" % (name, traceback.format_exc()))
                    sys.stderr.flush()

    def watchdog(self, now: float) -> None:
        try:
            from orchestrator.agent import watchdog_hook
        except ImportError:
            return
        watchdog_hook.tick(self.ctx)

    def notify(self, now: float) -> None:
        if not self.ctx.config.get("notify"):
            return
        from orchestrator.agent import watchdog_hook
        watchdog_hook.flush_notifications(self.ctx, now)

    def quality(self, now: float) -> None:
        try:
            from orchestrator.agent import quality_hook
        except ImportError:
            return
        store, runner = self.ctx.store, self.ctx.runner
        for job in store.jobs(["running"]):
            if quality_hook.periodic_due(store, job, now, self.ctx.config):
                res = quality_hook.periodic_check(store, job, now, self.ctx.config)
                if res and res.get("stop"):
                    runner.stop_for_quality(job, str(res.get("summary") or res.get("verdict")))

    def autostop(self, now: float) -> None:
        if not (self.ctx.config.get("autostop") or {}).get("enabled"):
            return
        from orchestrator.agent import autostop
        autostop.tick(self.ctx.store, self.ctx.config, gpu_utils=self._gpu_utils, gate=self._gate, now=now)

    def _gpu_utils(self) -> List[Optional[float]]:
        from orchestrator.agent.watchdog_hook import gpu_report
        return [s.util_pct for s in gpu_report(self.ctx.config)["_samples"]]

    def _gate(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        """The teardown gate on the box: every artifact's current bytes verified at home."""
        from orchestrator.agent.pulled import unpulled
        missing = unpulled(self.ctx)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            return {"passed": False, "detail": "%d artifact(s) not verified at home: %s" % (len(missing), shown)}
        subprocess.Popen(["/bin/sh", "-c", plan["command"]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        return {"passed": True, "detail": "all artifacts verified at home; ran %s" % plan["command"]}
