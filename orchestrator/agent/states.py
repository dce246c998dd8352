"""Ordered job states and the transitions the store allows.

``queued < running < {succeeded, failed, cancelled, quality_stopped}``, and ``queued < moved``:
a queued job released to another host of a fleet (``moved_to`` names it); it lives there now. A terminal state is
never left by a late writer; only an explicit user ``retry`` (which starts a new attempt and
is recorded in the job's history) moves a terminal job back to ``queued``.
"""

from __future__ import annotations

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
QUALITY_STOPPED = "quality_stopped"
MOVED = "moved"

ORDER = {QUEUED: 0, RUNNING: 1, SUCCEEDED: 2, FAILED: 2, CANCELLED: 2, QUALITY_STOPPED: 2, MOVED: 2}
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, QUALITY_STOPPED, MOVED})
ACTIVE = frozenset({QUEUED, RUNNING})

# (from, to) pairs the runner may take; RUNNING -> QUEUED is a retry of an interrupted or
# failed attempt within the job's budget.
RUNNER_MOVES = {
    (QUEUED, RUNNING), (QUEUED, CANCELLED), (QUEUED, QUALITY_STOPPED), (QUEUED, FAILED),
    (RUNNING, SUCCEEDED), (RUNNING, FAILED), (RUNNING, CANCELLED), (RUNNING, QUALITY_STOPPED),
    (RUNNING, QUEUED),
}
# explicit user retry of a finished job
RETRY_MOVES = {(FAILED, QUEUED), (CANCELLED, QUEUED), (QUALITY_STOPPED, QUEUED), (SUCCEEDED, QUEUED)}
# a fleet rebalance (the `release` verb): only a job that never started may leave its host,
# and a moved job never comes back (it is never retried here: it lives on ``moved_to``)
RELEASE_MOVES = {(QUEUED, MOVED)}


def allowed(src: str, dst: str, *, user_retry: bool = False, release: bool = False) -> bool:
    if (src, dst) in RUNNER_MOVES:
        return True
    if release and (src, dst) in RELEASE_MOVES:
        return True
    return user_retry and (src, dst) in RETRY_MOVES


def is_terminal(state: str) -> bool:
    return state in TERMINAL
