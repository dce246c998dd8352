"""Fleet rebalancing: moving queued work between the members of a fleet, crash-safe.

``balance(members)`` runs, in order (``gpurun queue balance``, and ``balance_quietly`` from
``watch --fleet`` / ``pull --fleet --loop``):

a. the status of every member, in parallel; a member that does not answer is *unreachable*,
   and one unreachable for longer than ``lost_after_s`` is *lost* (``core/fleet_state``);
b. a member that answers again after being lost first releases its copies of the jobs that were
   moved off it (compare-and-set: a copy that started there meanwhile is reported as "ran on
   both"), before its daemon is started;
c. ``finish_moves``: a job ``moved`` on a member but held by no member (a controller died
   between release and submit) is released again and submitted where it was going, or
   elsewhere when that member is lost or left the fleet;
d. the queue of each lost member (from the controller's snapshot, which has the full specs;
   queued and running jobs, with their pulled checkpoints, as ``recover --policy replace``
   does) is placed on the others;
e. a member with free capacity and nothing queued takes queued jobs (the last queued first,
   never one that ran before) from the member with the most queued beyond its capacity.

A move from A to B is ``A.release([J], to=B)`` then ``B.submit([spec])``: A's ``moved`` row is
the journal, so no step needs a controller-side record and a job runs only where it is queued.
The one caveat is a partition: a lost member that was only cut off from this controller may
start a queued copy before it answers again; that job then ran on both, and is reported.

``GPURUN_FLEET_CRASH_AT=STEP[:N]`` makes the process ``os._exit(137)`` the N-th time it reaches
STEP (``after-release``, ``before-submit``, ``after-submit``, ``lost-record``): the chaos test's
hook for killing the controller at each point of a move.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.agent import states as S
from orchestrator.core import fleet_state as FS
from orchestrator.core.fleet_members import (
    Member,
    look_all,
    open_members,
    rebalance_plan,
)
from orchestrator.errors import GpurunError

__all__ = ["LOST_AFTER_S", "BalanceReport", "balance", "balance_quietly"]

LOST_AFTER_S = FS.LOST_AFTER_S
CRASH_ENV = "GPURUN_FLEET_CRASH_AT"
_hits: dict[str, int] = {}


def crash_point(step: str) -> None:
    """The chaos test's kill switch (see the module doc); a no-op unless the variable names ``step``."""
    want = os.environ.get(CRASH_ENV)
    if not want:
        return
    name, _, nth = want.partition(":")
    if name != step:
        return
    _hits[step] = _hits.get(step, 0) + 1
    if _hits[step] >= int(nth or 1):
        os._exit(137)


@dataclass
class BalanceReport:
    """What one balance did (or, with ``dry_run``, would do). Moves are ``{job, name, from,
    to, why}``; ``ran_on_both`` are ``{job, name, host, to, state, was}``."""

    moves: list[dict] = field(default_factory=list)
    finished: list[dict] = field(default_factory=list)     # moves an earlier, interrupted run began
    lost: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    released: list[dict] = field(default_factory=list)     # a returning host's copies let go
    ran_on_both: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["moves"] = [_wire(m) for m in self.moves]
        out["finished"] = [_wire(m) for m in self.finished]
        return out


def _wire(move: dict) -> dict:
    return {"job": move["job"], "name": move.get("name"), "from": move["from"], "to": move["to"],
            "why": move["why"]}


def balance(entries: list[dict], *, lost_after_s: float | None = None, dry_run: bool = False,
            lock_timeout_s: float = 300.0) -> BalanceReport:
    """One rebalance of the fleet of ``entries`` (host inventory entries); see the module doc.
    ``lost_after_s``: None for config.yaml's ``fleet.lost_after_s`` (``FS.lost_after_s``)."""
    lost_after_s = FS.lost_after_s(lost_after_s)
    report = BalanceReport(dry_run=dry_run)
    with FS.locked(lock_timeout_s):
        data = FS.load()
        members = open_members(entries, quiet={h for h in data["lost_moves"]})
        try:
            _run(members, data, report, lost_after_s, dry_run)
        finally:
            for m in members:
                m.close()
    return report


def balance_quietly(entries: list[dict], **kwargs: Any) -> BalanceReport:
    """``balance`` for the commands that poll a fleet: never raises (a busy lock, a bad state
    file or an unreachable host end up in ``errors`` / ``unreachable``)."""
    kwargs.setdefault("lock_timeout_s", 0.0)
    try:
        return balance(entries, **kwargs)
    except GpurunError as exc:
        return BalanceReport(errors=[exc.message], dry_run=bool(kwargs.get("dry_run")))
    except Exception as exc:  # noqa: BLE001 - a poll loop must go on: a bug here is reported, not raised
        return BalanceReport(errors=[f"balance failed: {type(exc).__name__}: {exc}"],
                             dry_run=bool(kwargs.get("dry_run")))


def _run(members: list[Member], data: dict, report: BalanceReport, lost_after_s: float, dry_run: bool) -> None:
    now = time.time()
    look_all(members, {m.name: FS.cached_gpus(data, m.name, now) for m in members})
    up = [m for m in members if m.error is None]
    for m in up:
        if FS.cached_gpus(data, m.name, now) is None and m.cap is not None:
            data["gpus"][m.name] = {"n": m.cap.gpus, "at": now}
    down = [m for m in members if m.error is not None]
    report.unreachable = [m.name for m in down]
    report.errors += [f"{m.name} did not answer: {m.error}" for m in down]
    returning = FS.note_reachability(data, [m.name for m in up], [m.name for m in down], now)
    lost = set(FS.lost_hosts(data, report.unreachable, now, lost_after_s))
    report.lost = sorted(lost)
    if not dry_run:
        FS.save(data)
    for m in up:
        if m.name in returning:
            _welcome_back(m, data, report, dry_run)
    by_name = {m.name: m for m in members}
    active = [m for m in up]
    _finish_moves(active, by_name, lost, data, report, dry_run)
    for name in sorted(lost):
        _rescue_lost(by_name[name], active, data, report, dry_run)
    for src, dst, rows, why in rebalance_plan(active):
        _transfer(src, dst, rows, why, report.moves, report, dry_run)


# --- b: a lost member answers again ---------------------------------------------------------

def _welcome_back(m: Member, data: dict, report: BalanceReport, dry_run: bool) -> None:
    """Release the member's copies of the jobs moved off it while it was lost, before anything
    starts its daemon (its client was opened without ``ensure``)."""
    moved = dict(data["lost_moves"].get(m.name) or {})
    if not moved:   # it was only silent for a while: nothing of its queue went elsewhere
        if not dry_run:
            FS.forget_host(data, m.name)
            FS.save(data)
        return
    names = {r["id"]: r.get("name") for r in m.rows}
    if not dry_run:
        by_to: dict[str, list[str]] = {}
        for jid, info in moved.items():
            by_to.setdefault(str(info.get("to")), []).append(jid)
        for to, ids in sorted(by_to.items()):
            try:
                res = m.client.release(ids, to=to)
            except GpurunError as exc:
                report.errors.append(f"{m.name} answered again but releasing its old copies failed: "
                                     f"{exc.message}")
                return   # keep the record: the next balance tries again
            for spec in res["released"]:
                report.released.append({"job": spec["id"], "name": spec.get("name"), "host": m.name, "to": to})
            for ref in res["refused"]:
                if ref.get("state") is None:
                    continue   # not on that box (its store was wiped): nothing to undo
                was = str(moved[ref["id"]].get("state") or S.QUEUED)
                hit = {"job": ref["id"], "name": names.get(ref["id"]), "host": m.name, "to": to,
                       "state": ref["state"], "was": was}
                report.ran_on_both.append(hit)
                FS.note_event("ran_on_both", hit)
    if not dry_run:
        FS.forget_host(data, m.name)
        FS.save(data)
        m.client.ensured = False   # its daemon may start now: the copies are released
        m.refresh()


# --- c: moves an earlier run left half done --------------------------------------------------

def _holders(members: list[Member]) -> dict[str, Member]:
    """Job id -> the member where it lives (any state but ``moved``)."""
    out: dict[str, Member] = {}
    for m in members:
        for r in m.rows:
            if r.get("state") != S.MOVED:
                out.setdefault(r["id"], m)
    return out


def _finish_moves(active: list[Member], by_name: dict[str, Member], lost: set[str], data: dict,
                  report: BalanceReport, dry_run: bool) -> None:
    held = _holders(active)
    latest: dict[str, tuple[Member, dict]] = {}
    for m in active:
        for r in m.rows:
            if r.get("state") == S.MOVED and r["id"] not in held:
                prev = latest.get(r["id"])
                if prev is None or (r.get("ended_at") or 0) > (prev[1].get("ended_at") or 0):
                    latest[r["id"]] = (m, r)
    batches: dict[tuple[str, str], list[dict]] = {}
    whys: dict[tuple[str, str], str] = {}
    for jid, (src, row) in sorted(latest.items()):
        to = str(row.get("moved_to") or "")
        dst = by_name.get(to)
        if dst is not None and dst.error is None and dst is not src:
            why = "finishing a move an earlier run began"
        elif dst is not None and dst.error is not None and to not in lost:
            continue   # its target is unreachable for now: it may hold the job; wait until it is lost
        else:
            dst = _pick(row, [m for m in active if m is not src] or active, report)
            if dst is None:
                continue
            why = f"finishing a move to {to}, which is " + ("lost" if to in lost else "not in the fleet")
            if to in lost and not dry_run:
                FS.record_lost_move(data, to, jid, dst.name, S.QUEUED, time.time())
                FS.save(data)
        batches.setdefault((src.name, dst.name), []).append(row)
        whys[(src.name, dst.name)] = why
    for (s, d), rows in sorted(batches.items()):
        _transfer(by_name[s], by_name[d], rows, whys[(s, d)], report.finished, report, dry_run)


def _pick(job: dict, candidates: list[Member], report: BalanceReport) -> Member | None:
    """The least loaded member the job fits (``core/fleet.place``), or None (reported)."""
    from orchestrator.core.fleet import place
    loads = {m.name: m.load() for m in candidates if m.error is None}
    if not loads:
        report.errors.append(f"job {job.get('name') or job['id']}: no member answers to take it")
        return None
    try:
        placed = place([job], loads)
    except GpurunError as exc:
        report.errors.append(exc.message)
        return None
    name = next(n for n, js in placed.items() if js)
    return next(m for m in candidates if m.name == name)


# --- one move, or a batch of moves between two members ---------------------------------------

def _transfer(src: Member, dst: Member, rows: list[dict], why: str, into: list[dict],
              report: BalanceReport, dry_run: bool) -> None:
    """Release ``rows`` on ``src`` (compare-and-set) and submit what was released to ``dst``."""
    ids = [r["id"] for r in rows]
    names = {r["id"]: r.get("name") for r in rows}
    if dry_run:
        into += [{"job": j, "name": names[j], "from": src.name, "to": dst.name, "why": why} for j in ids]
        return
    try:
        res = src.client.release(ids, to=dst.name)
    except GpurunError as exc:
        report.errors.append(f"releasing {len(ids)} job(s) on {src.name} for {dst.name}: {exc.message}")
        return
    crash_point("after-release")
    specs = list(res["released"])
    for ref in res["refused"]:
        src.mark(ref["id"], ref.get("state"))   # it started there first: it stays
    if not specs:
        return
    for spec in specs:
        src.mark(spec["id"], S.MOVED, moved_to=dst.name)
    new_rows = [resubmission(spec, src.entry, dst.entry) for spec in specs]
    crash_point("before-submit")
    try:
        dst.client.submit(new_rows)
    except GpurunError as exc:
        report.errors.append(f"{len(specs)} job(s) released on {src.name} but not yet on {dst.name} "
                             f"({exc.message}); the next balance finishes the move")
        return
    crash_point("after-submit")
    for spec in specs:
        dst.add_queued(spec)
        into.append({"job": spec["id"], "name": spec.get("name"), "from": src.name, "to": dst.name, "why": why})


_MOVED_SOURCE = re.compile(r"^moved from \S+ \((.*)\)$")


def resubmission(spec: dict, old: dict, new: dict, plan: dict | None = None) -> dict:
    """The submit row of a job moving from ``old`` to ``new`` (inventory entries): paths under
    the old member's workdir / state dir rebased, ``attempt`` kept (``core/relocate``), and the
    source naming only the last hop."""
    from orchestrator.core import relocate
    src = dict(spec)
    m = _MOVED_SOURCE.match(str(src.get("source") or ""))
    if m:
        src["source"] = m.group(1)
    return relocate.resubmission(src, relocate.root_pairs(old, new), old["name"],
                                 plan or {"files": [], "resume_from": None, "step": None})


# --- d: a lost member's queue ----------------------------------------------------------------

def _rescue_lost(lost: Member, active: list[Member], data: dict, report: BalanceReport, dry_run: bool) -> None:
    """Place the lost member's queued and running jobs (its snapshot) on the others, with the
    artifacts ``gpurun pull`` verified at home; a job some member holds already is left alone."""
    from orchestrator.core import relocate, snapshot
    from orchestrator.core.pull import default_dest

    held = _holders(active)
    try:
        dest = default_dest()
    except GpurunError as exc:
        report.errors.append(f"{lost.name} is lost but its jobs cannot move: {exc.message}")
        return
    jobs = [j for j in snapshot.jobs(lost.name) if j.get("state", S.QUEUED) in relocate.MOVABLE
            and not j.get("moved_to") and j.get("id") not in held and j.get("command")
            and relocate.pulled_state(dest, j["id"]) is None]
    if not jobs:
        return
    age = int(time.time() - data["unreachable_since"].get(lost.name, time.time()))
    why = f"{lost.name} has not answered for {age} s"
    pushed: set[str] = set()
    for job in jobs:
        dst = _pick(job, active, report)
        if dst is None:
            continue
        move = {"job": job["id"], "name": job.get("name"), "from": lost.name, "to": dst.name, "why": why}
        if dry_run:
            dst.add_queued(job)
            report.moves.append(move)
            continue
        # recorded first: if this run dies before the submit, the next one places the job
        # again, and the lost box's copy is released whichever member ends up with it
        FS.record_lost_move(data, lost.name, job["id"], dst.name, str(job.get("state") or S.QUEUED), time.time())
        FS.save(data)
        crash_point("lost-record")
        pairs = relocate.root_pairs(lost.entry, dst.entry)
        run_root = (dst.entry.get("state_dir") or "~/.gpurun").rstrip("/") + "/runs/"
        try:
            plan = relocate.restore_plan(job, dest, run_root + job["id"], pairs)
            if dst.name not in pushed:
                pushed.add(dst.name)
                relocate.repush_code(lost.name, dst.client, pairs)
            relocate.upload(dst.client, plan["files"])
            dst.client.submit([resubmission(job, lost.entry, dst.entry, plan)])
        except (GpurunError, OSError) as exc:
            report.errors.append(f"moving job {job.get('name') or job['id']} from lost {lost.name} "
                                 f"to {dst.name}: {getattr(exc, 'message', exc)}")
            continue
        snapshot.mark_moved(lost.name, [job["id"]], dst.name)
        dst.add_queued(job)
        report.moves.append(move)
