"""Agent verbs of the quality room: ``check`` judges one job's metrics on the host.

Reply: the verdict dict of ``orchestrator.quality.judge`` plus ``format``, ``job``, ``sparkline``,
``loss_points`` (down-sampled [step, value] pairs for the client's plot) and ``periodic``
(the last periodic check's state). Shapes: ``CheckRequest``/``CheckReply`` in ``orchestrator.agent.protocol``.
"""

from __future__ import annotations

from typing import Any, Dict

from orchestrator.agent import states as S
from orchestrator.agent.context import AgentContext
from orchestrator.agent.protocol import BAD_INPUT, VerbError
from orchestrator.agent.quality_hook import checkpoint_step, metrics_targets, record_review, with_reviewer
from orchestrator.quality import judge as J
from orchestrator.quality.options import normalize_baseline, opts_from_config, parse_primary
from orchestrator.quality.plot import _points, sparkline
from orchestrator.quality.reviewer import settings
from orchestrator.quality.sources import Tracker


def v_check(ctx: AgentContext, req: Dict[str, Any]) -> Dict[str, Any]:
    job = ctx.find_job(req.get("job"))
    try:
        opts = opts_from_config(ctx.config, job)
        prim = req.get("primary")
        if prim:
            opts["primary"] = parse_primary(prim) if isinstance(prim, str) else (prim[0], prim[1])
        if req.get("baseline"):
            opts["baseline"] = normalize_baseline(req["baseline"])
        if req.get("reviewer"):  # the request's reviewer wins over the host config's
            opts["reviewer"] = settings(req["reviewer"])
            opts.pop("reviewer_command", None)
        if req.get("reviewer_command"):
            opts["reviewer_command"] = str(req["reviewer_command"])
            opts.pop("reviewer", None)
        if req.get("reviewer_timeout_s"):
            opts["reviewer_timeout_s"] = float(req["reviewer_timeout_s"])
    except (TypeError, ValueError) as exc:
        raise VerbError(str(exc), BAD_INPUT, "fix the --primary / --baseline / --reviewer-* value")
    opts = with_reviewer(opts, job, ctx.state_dir)
    targets = metrics_targets(job)
    if not targets:
        out = J.judge(Tracker([]).run, opts, ["no metrics declared (metrics=) or found in %s" % job["run_dir"]])
        out["format"] = None
    else:
        upto = checkpoint_step(job) if req.get("upto_checkpoint") else None
        # a job that has ended is judged as the agent's final check judges it (``judge``'s final)
        out, run = J.judge_tracker(Tracker(targets), opts, upto, final=job["state"] in S.TERMINAL)
        if out.get("reviewer"):
            out["reviewer"]["evidence"] = record_review(ctx.store, job, run, out, "check")
        main = run.main_loss()
        out["sparkline"] = sparkline(main)
        out["loss_points"] = [[a, b if b == b and abs(b) != float("inf") else str(b)]
                              for a, b in (_points(main, 600) if main is not None else [])]
        out["loss_series"] = main.name if main is not None else None
    out["job"] = {"id": job["id"], "name": job["name"], "state": job["state"], "run_dir": job["run_dir"]}
    out["periodic"] = ctx.store.kv_get("quality:%s" % job["id"])
    return out
