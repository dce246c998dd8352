"""What every verb handler and periodic hook is given: the state dir, the store, the host's
config and (inside the daemon) the runner. One small module so that handlers, hooks and the
daemon can all name the type without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from orchestrator.agent.protocol import job_not_found

if TYPE_CHECKING:  # the runner imports the store and /proc helpers; handlers never need them at runtime
    from orchestrator.agent.runner import Runner
    from orchestrator.agent.store import Store


class AgentContext:
    """The state dir, the store, the host config (and the runner, inside the daemon)."""

    def __init__(self, state_dir: str, store: "Store", config: Dict[str, Any], runner: "Optional[Runner]" = None):
        self.state_dir = state_dir
        self.store = store
        self.config = config
        self.runner = runner

    def find_job(self, ref: Any) -> Dict[str, Any]:
        """The job a user's reference (id, name or number) names; ``not_found`` otherwise."""
        job = self.store.get_job(ref) if ref is not None else None
        if job is None:
            raise job_not_found(ref)
        return job
