"""Fleet-wide views and verbs: ``queue status/events --fleet``, ``watch --fleet``, ``pull --fleet
[--loop]`` and the per-member gate of ``down --fleet``.

Every member is asked in parallel; a member that fails is one ``error`` and never hides the
others. A row in state ``moved`` is the old host's record of a job released to another member:
the job lives on ``moved_to`` now, so the views hide it, unless no other member answered with
that job (a move a controller left half done, or a target that is down): then the row stays, so
a job is never out of sight. Moves themselves are ``core/fleet_balance``'s (``balance_quietly``),
which ``watch`` and ``pull --loop`` call at most every ``BALANCE_EVERY_S``; this module only
turns its report into lines.

The teardown gate is the one of ``down`` (``core/teardown``, ``teardown_offline.assess_gate``),
judged per member: nothing here stops a meter; the CLI asks and calls ``teardown.execute``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator.agent.states import MOVED
from orchestrator.core.fanout import map_all, map_caught
from orchestrator.errors import GpurunError, JobNotFound

BALANCE_EVERY_S = 10.0  # watch and pull --loop rebalance at most this often

__all__ = ["BALANCE_EVERY_S", "Balancer", "MemberGate", "fleet_events", "fleet_status", "judge_members",
           "members", "move_lines", "outcome", "pull_fleet", "visible_jobs"]


def members(fleet: str, warn: Optional[Callable[[str], None]] = None) -> list[str]:
    """The host names of ``fleet`` that are in the host inventory (``fleets.get_fleet``); each
    member left out because the inventory forgot it is passed to ``warn``. FleetError when the
    fleet is unknown or has no host left."""
    from orchestrator.errors import FleetError
    from orchestrator.fleets import get_fleet

    warnings: list[str] = []
    names = list(get_fleet(fleet, warnings))
    for w in warnings:
        if warn is not None:
            warn(w)
    if not names:
        raise FleetError(f"fleet {fleet!r} has no host left in the host inventory",
                         f"add some with `gpurun fleet add {fleet} HOST...` (see `gpurun host ls`)")
    return names


def _each(names: list[str], fn: Callable[[str], Any], max_workers: int = 16) -> dict[str, Any]:
    """``{name: fn(name)}`` in parallel; a GpurunError becomes ``{"error": message}``."""
    return dict(zip(names, map_caught(fn, names, lambda _, exc: {"error": exc.message},
                                      max_workers=max_workers)))


def visible_jobs(results: list[dict]) -> list[dict]:
    """``results`` (``[{host, jobs, error?}]``) with every ``moved`` row dropped whose job another
    member holds: that member's row is the job. A moved row no one else answered for stays."""
    held: dict[str, set[str]] = {}
    for r in results:
        for j in r["jobs"]:
            if j["state"] != MOVED:
                held.setdefault(j["id"], set()).add(r["host"])
    out = []
    for r in results:
        jobs = [j for j in r["jobs"] if j["state"] != MOVED or not (held.get(j["id"], set()) - {r["host"]})]
        out.append(dict(r, jobs=jobs))
    return out


def fleet_status(names: list[str], *, table: bool = False) -> list[dict]:
    """Every member's jobs, in the fleet's order: ``{host, jobs}``, or ``{host, jobs: [], error}``
    for a member that could not be asked. Moved rows are hidden (:func:`visible_jobs`)."""
    from orchestrator.core.queue import status_all

    return visible_jobs(status_all(table=table, names=names))


def fleet_events(names: list[str], job: Optional[str] = None, limit: int = 50) -> tuple[list[dict], list[dict]]:
    """``(events, errors)``: the newest ``limit`` events of every member (or of ``job`` on the
    members that know it: a moved job's history is on both hosts), merged oldest first, each
    with ``host`` and ``job_name``. ``errors``: ``[{host, error}]`` for members that failed.
    JobNotFound when ``job`` is on no member that answered."""
    from orchestrator.core.hosts import known_jobs
    from orchestrator.core.session import open_session

    def one(name: str) -> dict:
        with open_session(name) as s:
            try:
                evs = s.events(job, limit, newest=True)["events"]
            except JobNotFound:
                return {"events": [], "absent": True}
            jnames = {j["id"]: j["name"] for j in known_jobs(name)}
            if any(e.get("job_id") and e["job_id"] not in jnames for e in evs):
                jnames.update({j["id"]: j["name"] for j in s.status(table=True)["jobs"]})
        return {"events": [dict(e, host=name, job_name=jnames.get(e.get("job_id") or "")) for e in evs]}

    got = _each(names, one)
    errors = [{"host": n, "error": got[n]["error"]} for n in names if "error" in got[n]]
    if job is not None and not errors and all(got[n].get("absent") for n in names):
        raise JobNotFound(f"no job {job!r} on any member ({', '.join(names)})",
                          "see the fleet's jobs with `gpurun queue status --fleet NAME`")
    merged = [e for n in names for e in got[n].get("events", [])]
    merged.sort(key=lambda e: (e["ts"], e["host"], e.get("id") or 0))
    return merged[-limit:], errors


# --- rebalancing, as a hook of watch and pull --loop -----------------------------------------
def move_lines(report: Any) -> list[str]:
    """Lines for what a ``core/fleet_balance.BalanceReport`` did: ``moved job X: box-a -> box-b
    (why)`` per move (``finished`` ones too: moves an interrupted controller began), a warning
    per job that ran on two members, and its errors, less the "did not answer" of unreachable
    members (the views show those members already)."""
    if report is None:
        return []

    def move(m: dict, word: str) -> str:
        why = f" ({m['why']})" if m.get("why") else ""
        return f"{word} job {m.get('name') or m['job']}: {m['from']} -> {m['to']}{why}"

    lines = [move(m, "moved") for m in getattr(report, "moves", [])]
    lines += [move(m, "finished moving") for m in getattr(report, "finished", [])]
    lines += [f"warning: job {r.get('name') or r['job']} ran on both {r['host']} and {r['to']}"
              for r in getattr(report, "ran_on_both", [])]
    quiet = tuple(f"{h} did not answer" for h in getattr(report, "unreachable", []))
    lines += [f"balance: {e}" for e in getattr(report, "errors", []) if not e.startswith(quiet)]
    return lines


class Balancer:
    """Calls ``core/fleet_balance.balance_quietly(members)`` at most every ``every_s`` seconds
    (a poll of ``watch`` may come every half second; a rebalance asks every member). The
    ``fleet.lost_after_s`` of config.yaml is read here, once: a bad value stops the command
    before its first poll (a ConfigError naming file, line and key), not every round."""

    def __init__(self, names: list[str], every_s: float = BALANCE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from orchestrator.core.fleet_state import lost_after_s

        self.names, self.every_s, self.clock = list(names), every_s, clock
        self.last: Optional[float] = None
        self.lost_after_s = lost_after_s()

    def __call__(self) -> list[str]:
        """The moves of this round as lines (none when it is not yet time)."""
        now = self.clock()
        if self.last is not None and now - self.last < self.every_s:
            return []
        self.last = now
        from orchestrator.core.fleet_balance import balance_quietly
        from orchestrator.core.hosts import resolve
        try:
            return move_lines(balance_quietly([resolve(n) for n in self.names],
                                              lost_after_s=self.lost_after_s))
        except GpurunError as exc:  # a view or a pull goes on; the next round tries again
            return [f"balance: {exc.message}"]


# --- pull --fleet ----------------------------------------------------------------------------
def pull_fleet(names: list[str], *, dest: Optional[str] = None, jobs: Optional[list[str]] = None,
               loop: bool = False, interval: Optional[float] = None, use_s3: bool = False,
               rehash: bool = False, progress: Any = None, parallel: bool = False,
               on_pass: Optional[Callable[[dict], None]] = None,
               balance: Optional[Callable[[], list[str]]] = None, on_moves: Optional[Callable[[list[str]], None]] = None,
               sleep: Callable[[float], None] = time.sleep) -> dict:
    """Pull every member into ``DEST/HOST/...`` (``core/pull.pull``, one pass each); a member
    that fails is reported in its summary's ``error`` and the others go on. With ``loop``,
    rounds repeat every ``interval`` seconds until every member's queue is done and home
    (a member that fails keeps the loop going: its jobs are not known to be home), calling
    ``balance`` first in each round. ``parallel``: members at once (only without progress bars,
    which draw one file at a time). Returns ``{"hosts": [summary...], "done"}``."""
    from orchestrator.core.pull import pull, pull_config

    cfg, _ = pull_config()
    wait = float(interval if interval is not None else cfg.get("interval_s", 60))
    left = list(names)
    last: dict[str, dict] = {}
    first = True
    while True:
        if loop and balance is not None:
            moves = balance()
            if moves and on_moves is not None:
                on_moves(moves)

        def one(name: str, reread: bool = rehash and first) -> dict:
            try:
                return pull(name, jobs=jobs, dest=dest, loop=False, use_s3=use_s3, rehash=reread,
                            progress=progress)
            except JobNotFound:
                if jobs:  # the named job lives on another member: nothing of it here
                    return {"host": name, "jobs": [], "done": True, "absent": True}
                raise
            except GpurunError as exc:
                return {"host": name, "jobs": [], "done": False, "error": exc.message}

        # one after the other (in this thread, stopping at an error) when progress bars draw
        got = dict(zip(left, map_all(one, left, max_workers=8) if parallel else [one(n) for n in left]))
        if first and jobs and all(got[n].get("absent") for n in left):
            raise JobNotFound(f"no job {', '.join(jobs)!s} on any member ({', '.join(left)})",
                              "see the fleet's jobs with `gpurun queue status --fleet NAME`")
        for n in left:
            last[n] = got[n]
            if on_pass is not None:
                on_pass(got[n])
        first = False
        if loop:  # a member whose queue is done and home needs no further round
            left = [n for n in left if not last[n]["done"]]
        if not loop or not left:
            break
        sleep(wait)
    hosts = [last[n] for n in names]
    return {"hosts": hosts, "done": all(h["done"] for h in hosts)}


# --- down --fleet ----------------------------------------------------------------------------
@dataclass
class MemberGate:
    """One member's teardown judgement: its target and open session (for ``teardown.execute``),
    the assessment and the gate's decision; ``error`` when it could not even be judged."""

    host: str
    target: Any = None
    session: Any = None
    assessment: Any = None
    decision: Any = None
    error: Optional[str] = None


def judge_members(stack: Any, names: list[str], *, dest: Optional[str] = None, dry_run: bool = False) -> list[MemberGate]:
    """The gate of ``down`` for each member, in parallel (``teardown_offline.assess_gate``: the
    live manifest with every copy at home re-read, or the home records when the box cannot be
    reached). Sessions are entered on ``stack`` (an ExitStack) so the CLI can stop meters
    through them. ``dest`` is the folder that holds ``HOST/...`` for every member, when given."""
    from orchestrator.core import teardown as td
    from orchestrator.core.session import open_session
    from orchestrator.core.teardown_offline import assess_gate

    gates = []
    for n in names:
        try:
            t = td.target(n, dest)
            gates.append(MemberGate(n, target=t, session=stack.enter_context(open_session(host=t.entry))))
        except GpurunError as exc:
            gates.append(MemberGate(n, error=exc.message))

    def one(g: MemberGate) -> None:
        if g.error is not None:
            return
        try:
            g.assessment = assess_gate(g.session, g.target)
            g.decision = td.decide(g.assessment, g.target.verb, yes=True, dry_run=dry_run)
        except GpurunError as exc:
            g.error = exc.message

    map_all(one, gates, max_workers=16)
    return gates


def outcome(g: MemberGate, action: Optional[dict] = None) -> tuple[str, str]:
    """``(word, why)`` for a member's line: ``stopped``, ``nothing to stop``, ``refused``,
    ``would stop`` (dry run), ``error``."""
    from orchestrator.core import teardown as td
    if g.error is not None:
        return "refused", f"could not be judged: {g.error}"
    d, a = g.decision, g.assessment
    if d.step == td.REFUSE:
        why = []
        if a.blockers:
            why.append(f"jobs running or queued ({len(a.blockers)}: {a.blockers[0]})")
        if a.missing:
            why.append(f"unverified artifacts ({len(a.missing)}, e.g. {a.missing[0]})")
        return "refused", "; ".join(why) + (" (judged from home records: unreachable)" if a.offline else "")
    if action is None:
        if g.target.verb.get("manual") or g.target.verb.get("no_meter"):
            return "nothing to stop", "gate passes; " + ("no meter on this host" if g.target.verb.get("no_meter")
                                                         else "gpurun cannot stop this box: stop it yourself")
        return "would stop", f"gate passes; `{g.target.verb['verb']}` would run"
    if action["how"] in ("api", "command"):
        return "stopped", f"{action['how']}: {action['detail']}"
    if g.target.verb.get("manual"):
        return "nothing to stop", "all verified at home; gpurun cannot stop this box: stop it yourself (" + \
            (g.target.verb.get("console") or "the way its owner does") + ")"
    return "nothing to stop", str(action["detail"])


def dest_of(g: MemberGate) -> Optional[Path]:
    return g.target.dest if g.target is not None else None
