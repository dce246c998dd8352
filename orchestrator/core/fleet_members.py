"""The fleet as one rebalance sees it: each member's client, jobs and capacity, looked at in
parallel, kept up to date in memory as moves are made, and the plan of rebalancing moves.

Capacity and load are ``core/fleet``'s (``capacity``, ``load_of``): a member offers its GPUs,
or ``slots`` jobs at a time on a box without GPUs; a job holds its ``gpus`` (at least one) on a
GPU box, one slot elsewhere. ``rebalance_plan`` is pure over the views: a member with free
capacity and nothing queued takes the queued jobs that would wait longest elsewhere.
"""

from __future__ import annotations

from typing import Any

from orchestrator.agent import states as S
from orchestrator.core.fanout import map_all
from orchestrator.errors import GpurunError

STATUS_TIMEOUT_S = 60.0


class Member:
    """One member: its inventory entry, an open agent client, its jobs and capacity, or the
    error that kept it from answering."""

    def __init__(self, entry: dict, client: Any = None, error: str | None = None):
        self.entry = entry
        self.name: str = entry["name"]
        self.client = client
        self.error = error
        self.rows: list[dict] = []
        self.cap: Any = None

    def refresh(self, gpus: int | None = None) -> None:
        """Ask for its jobs (and, once, its capacity: ``gpus`` is the GPU count seen lately,
        which spares the ``gpu`` round trip); a failure is kept in ``error``."""
        if self.client is None:
            return
        from orchestrator.core.fleet import Capacity, capacity
        try:
            self.rows = [dict(r) for r in self.client.status(timeout=STATUS_TIMEOUT_S)["jobs"]]
            if self.cap is None and gpus is not None and not isinstance(self.entry.get("gpus"), list):
                self.cap = Capacity(gpus, int(self.entry.get("slots") or 1))
            elif self.cap is None:
                self.cap = capacity(self.client)
            self.error = None
        except GpurunError as exc:
            self.error = exc.message
        except Exception as exc:  # noqa: BLE001 - a broken link must not stop the others being balanced
            self.error = f"{type(exc).__name__}: {exc}"

    def load(self) -> Any:
        from orchestrator.core.fleet import load_of
        return load_of(self.rows, self.cap)

    def need(self, job: dict) -> int:
        return max(1, int(job.get("gpus") or 0)) if self.cap.gpus else 1

    def fits(self, job: dict) -> bool:
        return not self.cap.gpus or max(1, int(job.get("gpus") or 0)) <= self.cap.gpus

    def free(self) -> int:
        return self.cap.total - sum(self.need(r) for r in self.rows if r.get("state") == S.RUNNING)

    def queued(self) -> list[dict]:
        return [r for r in self.rows if r.get("state") == S.QUEUED]

    def waiting(self) -> list[dict]:
        """Queued jobs that would not start now (the free capacity goes to the first ones)."""
        room, out = self.free(), []
        for r in self.queued():
            if room >= self.need(r):
                room -= self.need(r)
            else:
                out.append(r)
        return out

    def mark(self, job: str, state: str | None, **fields: Any) -> None:
        for r in self.rows:
            if r["id"] == job and state is not None:
                r.update(state=state, **fields)

    def add_queued(self, spec: dict) -> None:
        self.rows = [r for r in self.rows if r["id"] != spec["id"]]
        self.rows.append({"id": spec["id"], "name": spec.get("name"), "state": S.QUEUED,
                          "gpus": spec.get("gpus"), "attempt": int(spec.get("attempt") or 0)})

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead link may fail any way; nothing to do
                pass


def open_members(entries: list[dict], quiet: set[str]) -> list[Member]:
    """A client per member; one in ``quiet`` does not start its daemon on first contact."""
    from orchestrator.core.client import AgentClient
    from orchestrator.core.session import make_transport
    out = []
    for e in entries:
        try:
            client = AgentClient(e, make_transport(e))
        except GpurunError as exc:
            out.append(Member(e, None, exc.message))
            continue
        client.ensured = e["name"] in quiet
        out.append(Member(e, client))
    return out


def look_all(members: list[Member], gpus: dict[str, int | None] | None = None) -> None:
    """Refresh every member in parallel (each waits on its own box); ``gpus``: the GPU counts
    seen lately, by member name."""
    live = [m for m in members if m.client is not None]
    known = gpus or {}
    map_all(lambda m: m.refresh(known.get(m.name)), live)


def _movable(row: dict) -> bool:
    """Queued and never started: a job that ran before resumes best where its checkpoints are."""
    return row.get("state") == S.QUEUED and not row.get("attempt") and not row.get("started_at")


def rebalance_plan(active: list[Member]) -> list[tuple[Member, Member, list[dict], str]]:
    """``[(from, to, rows, why)]``: each member with free capacity and nothing queued (in name
    order) takes, while it has room, the last waiting job of the member with the most waiting
    (a tie to the first by name) that fits it. The views are updated as if the moves were made."""
    plan: dict[tuple[str, str], list[dict]] = {}
    whys: dict[tuple[str, str], str] = {}
    by_name = {m.name: m for m in active}
    order = sorted(active, key=lambda m: m.name)
    for r in order:
        if r.cap is None or r.queued():
            continue
        room = start = r.free()
        skip: set[str] = set()
        while room > 0:
            donors = [d for d in order if d is not r and d.name not in skip and d.cap is not None and d.waiting()]
            if not donors:
                break
            d = max(donors, key=lambda d: (len(d.waiting()), -order.index(d)))
            waiting = d.waiting()
            cand = next((row for row in reversed(waiting)
                         if _movable(row) and r.fits(row) and r.need(row) <= room), None)
            if cand is None:
                skip.add(d.name)
                continue
            key = (d.name, r.name)
            if key not in plan:
                unit = "GPU(s)" if r.cap.gpus else "slot(s)"
                whys[key] = (f"{r.name} had {start} free {unit} and nothing queued; "
                             f"{d.name} had {len(waiting)} job(s) waiting")
            plan.setdefault(key, []).append(dict(cand))
            room -= r.need(cand)
            d.mark(cand["id"], S.MOVED, moved_to=r.name)
            r.add_queued(cand)
    return [(by_name[s], by_name[d], rows, whys[(s, d)]) for (s, d), rows in plan.items()]
