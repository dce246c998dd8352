"""Fleet use cases: the hosts a fleet command acts on, each host's capacity and load, the
placement of a queue over them, and ``queue submit --fleet`` (and ``--wait`` over a fleet).

A fleet is ``--fleet NAME`` (``orchestrator/fleets.py``: ``fleets.json``) or the hosts named
by repeated ``--host``. ``place`` is pure and fast: it sees only each member's capacity (GPUs,
or ``slots`` on a box without GPUs) and load (what its queued and running jobs hold), and
sends each job where it raises the load least. ``submit_fleet`` asks every member for its jobs
and capacity in parallel, leaves out the jobs some member already holds (a job id is the same
line of the same file on every host, so a queue submitted twice is placed once), places the
rest, and sends one submit per member, in parallel. Each job goes to exactly one member.

Moving queued work between members afterwards is ``core/fleet_balance``; a row in state
``moved`` counts here as the job being on the fleet (it lives on ``moved_to``, or is being
moved there), so a submit never places a moving job a second time.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from orchestrator import fleets as fleetinv
from orchestrator import hosts as hostinv
from orchestrator.agent import states as S
from orchestrator.core.fanout import map_all
from orchestrator.errors import BadInput, FleetError, GpurunError

if TYPE_CHECKING:
    from orchestrator.core.queue import SubmitResult

__all__ = ["Capacity", "FleetSubmit", "Load", "add", "capacity", "fleet_names", "load_of", "ls", "members",
           "place", "remove", "submit_fleet", "wait_fleet"]

ACTIVE = (S.QUEUED, S.RUNNING)


# --- the inventory, as the CLI sees it ----------------------------------------------------

def fleet_names() -> list[str]:
    """Every fleet name (shell completion: never raises, reads one file)."""
    return fleetinv.fleet_names()


def add(name: str, hosts: list[str]) -> list[str]:
    """Create fleet ``name`` or add ``hosts`` to it; returns its hosts."""
    return fleetinv.add_fleet(name, list(dict.fromkeys(hosts)))


def remove(name: str, hosts: list[str] | None = None) -> list[str]:
    """Forget fleet ``name`` or take ``hosts`` out of it; returns the hosts taken out."""
    return fleetinv.remove_fleet(name, list(dict.fromkeys(hosts)) if hosts else None)


def ls() -> list[dict]:
    """Every fleet in name order: ``{name, created_at, hosts: [{name, profile, kind}]}``; a
    member no longer in the host inventory is listed with ``kind`` ``missing``."""
    inventory = hostinv.load_hosts()
    out = []
    for name, fleet in sorted(fleetinv.load_fleets().items()):
        rows = []
        for h in fleet["hosts"]:
            entry = inventory.get(h)
            rows.append({"name": h, "profile": entry.get("profile") if entry else None,
                         "kind": entry.get("kind", "local") if entry else "missing"})
        out.append({"name": name, "created_at": fleet.get("created_at"), "hosts": rows})
    return out


def members(fleet: Optional[str] = None, hosts: tuple[str, ...] | list[str] = (),
            warnings: Optional[list[str]] = None) -> list[dict]:
    """The inventory entries a fleet command acts on: fleet ``fleet``'s hosts (a member no
    longer in the host inventory is dropped, with a line in ``warnings``), or the ``hosts``
    named (an ad-hoc fleet), each once. FleetError / HostError when unknown or empty."""
    if fleet and hosts:
        raise BadInput(f"both --fleet {fleet} and --host named",
                       "name a fleet, or the hosts with repeated --host, not both")
    if fleet:
        names = fleetinv.get_fleet(fleet, warnings)
        if not names:
            raise FleetError(f"fleet {fleet!r} has no host left in the host inventory",
                             f"add some with `gpurun fleet add {fleet} HOST...` (see `gpurun host ls`)")
    else:
        names = list(hosts)
        if not names:
            known = fleetinv.fleet_names()
            raise BadInput("no fleet named", "pass --fleet NAME" + (f" (fleets: {', '.join(known)})" if known else "")
                           + ", or the hosts with --host A --host B")
    return [hostinv.get_host(n) for n in dict.fromkeys(names)]


# --- capacity and load --------------------------------------------------------------------

@dataclass(frozen=True)
class Capacity:
    """What a member offers: its GPUs, or (``gpus`` 0) ``slots`` jobs at a time."""

    gpus: int
    slots: int

    @property
    def total(self) -> int:
        return self.gpus or self.slots


@dataclass
class Load:
    """A member as placement sees it: its capacity and the units (GPUs, or slots) held."""

    capacity: Capacity
    used: int = 0


def capacity(client: Any, gpus_seen: Optional[int] = None) -> Capacity:
    """The capacity of ``client``'s host: the host entry's ``gpus`` list when it pins one (the
    agent's runner uses that too), else ``gpus_seen`` (the count seen lately, which spares a
    round trip), else the GPUs the agent's probe sees (``gpu`` verb, lost GPUs left out, as
    the runner counts them); ``slots`` from the entry."""
    host = client.host
    slots = int(host.get("slots") or 1)
    if isinstance(host.get("gpus"), list):
        return Capacity(len(host["gpus"]), slots)
    if gpus_seen is not None:
        return Capacity(gpus_seen, slots)
    rep = client.gpu()
    gpus = sum(1 for g in rep.get("gpus") or [] if not g.get("lost")) if rep.get("available") else 0
    return Capacity(gpus, slots)


def _need(job: dict, cap: Capacity) -> int:
    """Units a job holds on a member: its GPUs (at least one, as the runner places it), or one slot."""
    return max(1, int(job.get("gpus") or 0)) if cap.gpus else 1


def load_of(rows: list[dict], cap: Capacity) -> Load:
    """A member's load from its status rows: the units held by its queued and running jobs."""
    return Load(cap, sum(_need(r, cap) for r in rows if r.get("state") in ACTIVE))


# --- placement (pure) ---------------------------------------------------------------------

def place(jobs: list[dict], loads: dict[str, Load], needs_gpu: frozenset[str] | set[str] = frozenset()) \
        -> dict[str, list[dict]]:
    """Each job (an agent job row: ``id``, ``gpus``, ``source``) to one member of ``loads``,
    greedily in order: among the members it fits, the one with the least ``(used + need) /
    capacity``, a tie to the first by name. A job in ``needs_gpu`` (its line said ``gpus=N``)
    fits only a member with at least N GPUs; another job fits any member. ``loads`` is updated.
    BadInput naming the job's file and line when one job fits no member (then no job may be
    sent: ``loads`` holds a partial placement)."""
    names = sorted(loads)
    out: dict[str, list[dict]] = {n: [] for n in names}
    for job in jobs:
        want = max(1, int(job.get("gpus") or 0))
        gpu_only = job["id"] in needs_gpu
        best: tuple[float, str] | None = None
        for n in names:
            ld = loads[n]
            cap = ld.capacity
            if (cap.gpus and cap.gpus < want) or (not cap.gpus and gpu_only):
                continue   # too few GPUs; or a gpus=N job and a box without GPUs
            score = (ld.used + _need(job, cap)) / cap.total
            if best is None or score < best[0]:   # names are in order: a tie keeps the first
                best = (score, n)
        if best is None:
            raise _fits_nowhere(job, want, gpu_only, loads)
        loads[best[1]].used += _need(job, loads[best[1]].capacity)
        out[best[1]].append(job)
    return out


def _fits_nowhere(job: dict, want: int, gpu_only: bool, loads: dict[str, Load]) -> BadInput:
    offer = ", ".join(f"{n} {ld.capacity.gpus} GPU(s)" if ld.capacity.gpus else f"{n} no GPU"
                      for n, ld in sorted(loads.items()))
    where = job.get("source") or job.get("name") or job["id"]
    what = f"gpus={want}" if gpu_only else f"{want} GPU(s)"
    return BadInput(f"{where}: job {job.get('name') or job['id']} asks for {what}; no host of the fleet "
                    f"has that many ({offer})",
                    "lower its gpus=, or add a host with enough GPUs to the fleet (`gpurun fleet add`)")


# --- submit over a fleet ------------------------------------------------------------------

@dataclass
class FleetSubmit:
    """What a fleet submit did: one ``SubmitResult`` per member that answered, in name order."""

    fleet: Optional[str]
    results: list[SubmitResult]
    warnings: list[str] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(len(r.added) for r in self.results)

    @property
    def present(self) -> int:
        return sum(len(r.present) for r in self.results)


def submit_fleet(file: str, entries: list[dict], *, fleet: Optional[str] = None, start: int = 1,
                 slots: Optional[int] = None, cwd: Optional[str] = None,
                 warnings: Optional[list[str]] = None) -> FleetSubmit:
    """Submit queue ``file`` (from its ``start``-th job) over the members ``entries``.

    The file is read before any box is contacted. Every member is asked for its jobs and
    capacity in parallel; a member that does not answer is left out with a warning (the jobs
    gpurun last saw on it still count as there). Jobs already on some member are reported
    as present on it; the rest are placed (``place``) and sent, one submit per member, in
    parallel. ``slots`` is remembered for every member. Raises QueueFileError / BadInput for
    the file or a job that fits no member, the first member's error when none answered."""
    from orchestrator.core import queue as cq
    from orchestrator.core.hosts import known_jobs
    from orchestrator.core.secrets import default_names
    from orchestrator.core.session import open_session

    every, specs = cq.read_specs(file, start)
    notes = list(warnings or [])
    if slots is not None:
        for e in entries:
            hostinv.update_host(e["name"], slots=slots)
        entries = [hostinv.get_host(e["name"]) for e in entries]
    # placement needs only ids, GPUs and lines: the first member's rows (duplicate lines dropped
    # and warned about once); each member's own rows (its workdir, a local cwd) are made after
    # placement, for the jobs it gets
    first, dups = cq.to_jobs(specs, entries[0], file, cwd, default_secrets=default_names(entries[0]))
    notes += dups
    order = [j["id"] for j in first]
    spec_of: dict[str, Any] = {}
    for sp in specs:
        spec_of.setdefault(sp.id, sp)
    if not every:
        notes.append(f"{file} has no jobs (only comments and blank lines): nothing submitted")
    needs_gpu = frozenset(s.id for s in specs if s.gpus)
    if not order:
        return FleetSubmit(fleet, [], notes)

    seen = _gpus_seen([e["name"] for e in entries])
    with ExitStack() as stack:
        clients = {e["name"]: stack.enter_context(open_session(host=e)) for e in entries}

        def look(name: str) -> tuple[str, Any]:
            # one verb after the other on the member's connection: the status ensures the
            # agent (pushing it when missing) before capacity may ask for its GPUs
            try:
                c = clients[name]
                st = c.status(table=True)["jobs"]
                return name, (st, capacity(c, seen.get(name)))
            except GpurunError as exc:
                return name, exc

        answers = dict(map_all(look, sorted(clients)))
        up = {n: a for n, a in answers.items() if not isinstance(a, GpurunError)}
        if not up:
            raise next(a for _, a in sorted(answers.items()))
        _remember_gpus({n: a[1].gpus for n, a in up.items() if n not in seen})
        where: dict[str, str] = {}   # job id -> member holding it (a live row wins over a moved one)
        for n, a in sorted(answers.items()):
            if isinstance(a, GpurunError):
                there = {j["id"] for j in known_jobs(n)} & spec_of.keys()
                notes.append(f"{n} did not answer ({a.message}); left out of the placement"
                             + (f", with the {len(there)} job(s) gpurun last saw there" if there else ""))
                for jid in there:
                    where.setdefault(jid, n)
                continue
            for r in a[0]:
                if r["id"] in spec_of and (r["id"] not in where or r.get("state") != S.MOVED):
                    where[r["id"]] = n
        by_id = {j["id"]: j for j in first}
        todo = [by_id[jid] for jid in order if jid not in where]
        loads = {n: load_of(a[0], a[1]) for n, a in up.items()}
        placed = place(todo, loads, needs_gpu)

        def send(name: str) -> SubmitResult:
            present = [jid for jid in order if where.get(jid) == name]
            if not placed[name]:
                return cq.SubmitResult(name, [], present, [], present)
            e = clients[name].host
            mine, _ = cq.to_jobs([spec_of[j["id"]] for j in placed[name]], e, file, cwd,
                                 default_secrets=default_names(e))
            res = cq.submit(clients[name], cq.SubmitPlan(clients[name].host, mine))
            return cq.SubmitResult(name, res.added, present + res.present, res.warnings, present + res.ids)

        results = map_all(send, sorted(up))
    for r in results:
        notes += [f"{r.host}: {w}" for w in r.warnings]
    return FleetSubmit(fleet, results, notes)


def _gpus_seen(names: list[str]) -> dict[str, int]:
    """The GPU counts ``core/fleet_state`` remembers (seen within its ``GPU_TTL_S``), by host.
    The cache only spares a round trip: a state file that cannot be read is no cache here
    (the fleet commands that keep its other facts say so)."""
    import time

    from orchestrator.core import fleet_state as FS
    try:
        data, now = FS.load(), time.time()
    except FleetError:
        return {}
    return {n: g for n in names if (g := FS.cached_gpus(data, n, now)) is not None}


def _remember_gpus(counts: dict[str, int]) -> None:
    """Record GPU counts just asked for, under the fleet-state lock (the file also holds a
    balance's lost moves, which an unlocked write could undo); skipped, not waited for,
    while another fleet command holds the lock."""
    if not counts:
        return
    import time

    from orchestrator.core import fleet_state as FS
    try:
        with FS.locked(timeout_s=0.5):
            data, now = FS.load(), time.time()
            data["gpus"].update({n: {"n": g, "at": now} for n, g in counts.items()})
            FS.save(data)
    except (FleetError, OSError):
        pass


def wait_fleet(results: list[SubmitResult], *, on_change: Callable[[list[dict]], None] | None = None,
               poll: float = 0.5, final_grace: Optional[float] = None) -> dict[str, list[dict]]:
    """``core/queue.wait_for`` over every member with jobs: each poll asks them all in parallel,
    and the wait ends when every job has ended with its last quality word (or ``final_grace``
    after the last end). ``on_change`` sees every member's rows together. Returns ``{host:
    final rows}``. One poll at a time, from this thread: Ctrl-C is never stuck behind a
    thread that waits for jobs to end."""
    import time

    from orchestrator.core import queue as cq
    from orchestrator.core.session import open_session

    grace = cq.FINAL_GRACE_S if final_grace is None else final_grace
    todo = [r for r in results if r.ids]
    last: tuple = ()
    ended_at: Optional[float] = None
    with ExitStack() as stack:
        clients = {r.host: stack.enter_context(open_session(r.host)) for r in todo}
        while True:
            rows = dict(map_all(lambda r: (r.host, clients[r.host].status(r.ids)["jobs"]), todo))
            every = [j for h in sorted(rows) for j in rows[h]]
            key = tuple((j["id"], j["state"], j["attempt"], (j.get("quality") or {}).get("verdict")) for j in every)
            if key != last and on_change:
                on_change(every)
            last = key
            if all(j["state"] in S.TERMINAL for j in every):
                ended_at = ended_at or time.time()
                if all(cq.quality_settled(j) for j in every) or time.time() - ended_at > grace:
                    return rows
            else:
                ended_at = None
            time.sleep(poll)
