"""The backend contract: what the queue verbs ask of whatever runs this host's jobs.

Documented once here; ``LocalBackend`` (the agent's own daemon and runner) and ``SlurmBackend``
(Slurm is the scheduler and the durable queue: ``agent/slurm``, ``agent/slurm_reconcile``)
implement it, and ``of(config)`` picks one from the host config's ``scheduler`` (``slurm``; any
other value, or none, is the daemon). The verbs (``agent/verbs``) and the verb dispatch
(``agent/__main__``, ``ensure`` included) call these hooks and test no scheduler themselves.

Contract (a hook may raise ``VerbError``; a ``scheduler`` one carries the scheduler's own words
and leaves the store as it was, unless said otherwise):

- ``ensure(state_dir, pyz, build, detach)`` -> the ``ensure`` verb's answer (``{"action",
  "pid", "build", ...}``): start what must run on the host. The daemon's starts it
  (``control.ensure``); Slurm's starts nothing (a login node kills long-lived processes).
- ``sync(ctx)``: before a verb that reads jobs (``__main__.READS``), bring the store up to date
  with the scheduler. A scheduler that refuses a job records why on the job and the verb answers.
- ``after_submit(ctx, jobs, added)``: the rows ``added`` (ids) of the submit request ``jobs``
  are in the store, queued: hand them to the scheduler. Raises when it refused them (the rows
  stay queued, and the next verb tries again).
- ``reconcile(ctx)``: before ``cancel`` picks its rows: their states as the scheduler has them.
- ``cancel(ctx, jobs)``: the rows ``cancel`` is about to flag or end: stop their scheduler jobs
  first (a queued row's must not start after it), in one call; raises and flags nothing if that fails.
- ``after_retry(ctx, job)``: ``job`` went back to queued for a new attempt (the store says so).
- ``withdraw(ctx, job)`` -> ``None`` when a fleet ``release`` may move ``job`` off this host,
  else the reason it stays (the scheduler started it): a job never runs on two hosts.
- ``release_spec(job, spec)`` -> ``spec`` with what the scheduler kept of ``job`` and its next
  host needs (the queue line's sbatch options).

The daemon's own hooks are no-ops: its runner reads the store, and the verbs wake it
(``control.wake``) after every change whatever the backend. Backends keep no state; a
scheduler's modules load only when one of its hooks runs (a verb's cold start is measured).
"""

from __future__ import annotations

import abc
import os
from typing import Any, Dict, List, Mapping, Optional

from orchestrator.agent import control


class Backend(abc.ABC):
    """Base of every backend: each hook does nothing (what the daemon needs) unless overridden."""

    name = ""

    @abc.abstractmethod
    def ensure(self, state_dir: str, pyz: str, build: str, detach: str = "setsid") -> Dict[str, Any]:
        """See the module docstring."""

    def sync(self, ctx: Any) -> None:
        pass

    def after_submit(self, ctx: Any, jobs: List[Dict[str, Any]], added: List[str]) -> None:
        pass

    def reconcile(self, ctx: Any) -> None:
        pass

    def cancel(self, ctx: Any, jobs: List[Dict[str, Any]]) -> None:
        pass

    def after_retry(self, ctx: Any, job: Dict[str, Any]) -> None:
        pass

    def withdraw(self, ctx: Any, job: Dict[str, Any]) -> Optional[str]:
        return None

    def release_spec(self, job: Dict[str, Any], spec: Dict[str, Any]) -> Dict[str, Any]:
        return spec


class LocalBackend(Backend):
    """The agent's daemon runs the queue (``agent/daemon``, ``agent/runner``)."""

    name = "local"

    def ensure(self, state_dir: str, pyz: str, build: str, detach: str = "setsid") -> Dict[str, Any]:
        return control.ensure(state_dir, pyz, build, detach=detach)


class SlurmBackend(Backend):
    """Slurm runs the queue: each queued row becomes an sbatch job; no daemon (``agent/slurm``)."""

    name = "slurm"

    def ensure(self, state_dir: str, pyz: str, build: str, detach: str = "setsid") -> Dict[str, Any]:
        # a login node: many clusters kill long-lived processes there, and Slurm is the queue
        return {"action": "none", "pid": None, "build": build, "scheduler": self.name}

    def sync(self, ctx: Any) -> None:
        from orchestrator.agent import slurm_reconcile
        slurm_reconcile.sync(ctx)

    def after_submit(self, ctx: Any, jobs: List[Dict[str, Any]], added: List[str]) -> None:
        from orchestrator.agent import slurm, slurm_reconcile
        runs = os.path.join(ctx.state_dir, "runs")
        for j in jobs:
            if j["id"] in added and j.get("slurm"):
                slurm.remember_options(os.path.join(runs, j["id"]), j["slurm"])
        slurm_reconcile.sync(ctx, submit_errors=True)

    def reconcile(self, ctx: Any) -> None:
        from orchestrator.agent import slurm_reconcile
        slurm_reconcile.reconcile(ctx)

    def cancel(self, ctx: Any, jobs: List[Dict[str, Any]]) -> None:
        from orchestrator.agent import slurm
        from orchestrator.agent import states as S
        slurm.cancel_or_raise([j.get("backend_id") for j in jobs if j["state"] in S.ACTIVE])

    def after_retry(self, ctx: Any, job: Dict[str, Any]) -> None:
        # a retry is a new sbatch (its resume gate: the wrapper's, in the allocation)
        from orchestrator.agent import slurm
        from orchestrator.agent import states as S
        ctx.store.update_fields(job["id"], [S.QUEUED], backend_id=None)
        slurm.submit_pending(ctx, only=[job["id"]])

    def withdraw(self, ctx: Any, job: Dict[str, Any]) -> Optional[str]:
        from orchestrator.agent import states as S
        if job["state"] != S.QUEUED or not job.get("backend_id"):
            return None  # not sbatch'd yet (or not queued: the release's compare-and-set decides)
        from orchestrator.agent import slurm_reconcile
        if slurm_reconcile.withdraw(ctx, job):
            return None
        return "Slurm job %s started here" % job["backend_id"]

    def release_spec(self, job: Dict[str, Any], spec: Dict[str, Any]) -> Dict[str, Any]:
        from orchestrator.agent.slurm import SPEC, read_json
        opts = (read_json(os.path.join(job["run_dir"], SPEC)) or {}).get("slurm")
        if opts:
            spec["slurm"] = opts
        return spec


LOCAL, SLURM = LocalBackend(), SlurmBackend()


def of(config: Optional[Mapping[str, Any]]) -> Backend:
    """The backend the host config names (``scheduler: slurm``), else the daemon's."""
    return SLURM if (config or {}).get("scheduler") == "slurm" else LOCAL
