"""``gpurun watch``: a live view of hosts -> GPUs -> jobs and the watchdog's findings.

Hosts are polled in parallel (``core/fanout``, sessions kept open between polls); a host
that fails shows its error and the others keep updating. ``--once --json`` is for scripts:
strict JSON (a NaN or infinite loss is ``null``).

Step and loss of running jobs and the host's CPU / RAM line are read by the agent at each
poll; every active job is shown, finished ones up to ``--finished`` (with a count of the rest),
each with its latest quality verdict, and a line for every job judged STOP.

Ctrl-C is how one leaves a watch, so it exits 0 (not 130), with or without ``--json``; a
document being written when it comes is finished first (``whole``), so a script reading the
stream never gets a torn one.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import click

from orchestrator.cli.gpu import STATUS_STYLE as HEALTH_STYLE
from orchestrator.cli.options import AsciiInt, host_option, seconds
from orchestrator.cli.render import QUALITY_STYLE, STATE_STYLE, console, human_duration, iso, json_quality
from orchestrator.errors import GpurunError

SEV_STYLE = {"info": "dim", "warn": "yellow", "error": "red", "critical": "bold red"}


def poll(sessions: dict[str, Any], timeout: float, finished: int | None = None) -> list[dict]:
    """One snapshot per host, in parallel (``core/fanout``), in the order of ``sessions``. A
    failed host becomes ``{ok: false, error}``."""
    from orchestrator.core.fanout import map_all

    def one(name: str) -> dict:
        t0 = time.monotonic()
        try:
            snap = sessions[name].snapshot(timeout=timeout, finished=finished)
            return {"host": name, "ok": True, "error": None, "elapsed_s": round(time.monotonic() - t0, 3), **snap}
        except GpurunError as exc:
            return {"host": name, "ok": False, "error": str(exc), "elapsed_s": round(time.monotonic() - t0, 3)}

    snaps = map_all(one, list(sessions))
    now = time.time()
    for n, snap in zip(sessions, snaps):
        snap["cost"] = cost_of(sessions[n].host, now)
    return snaps


def cost_of(entry: dict, now: float) -> dict | None:
    """Price per hour and cost so far of a rented host, from what gpurun rented (no API call,
    so watching many boxes costs the provider nothing); None for hosts that are not rented."""
    inst = entry.get("instance") or {}
    price = inst.get("price_per_hour")
    if price is None:
        return None
    from orchestrator.core.rent import rental
    rec = rental(str(inst.get("provider") or ""), str(inst.get("id")))
    start = inst.get("rented_at") or rec.get("rented_at")
    # our own stop or terminate ends the GPU meter (a stopped box may still bill its disk)
    end = rec.get("ended_at") or (rec.get("stopped_at") if rec.get("stopped_by_us") else None) or now
    hours = max(0.0, float(end) - float(start)) / 3600.0 if start else 0.0
    return {"price_per_hour": float(price), "currency": inst.get("currency") or "USD",
            "since": iso(start), "hours": round(hours, 4), "cost_so_far": round(float(price) * hours, 4)}


def json_host(h: dict) -> dict:
    """The documented ``--json`` shape of one host (``cost`` is null for hosts not rented)."""
    if not h["ok"]:
        return {"host": h["host"], "ok": False, "error": h["error"], "elapsed_s": h["elapsed_s"],
                "cost": h.get("cost")}
    g = h["gpu"]
    return {
        "host": h["host"], "ok": True, "error": None, "elapsed_s": h["elapsed_s"], "time": iso(h["time"]),
        "cost": h.get("cost"),
        "gpu": {"status": g["status"], "available": g["available"], "no_driver": g["no_driver"],
                "driver": g["driver"], "reasons": g["reasons"],
                "gpus": [{k: x.get(k) for k in ("index", "name", "uuid", "util_pct", "mem_used_mib", "mem_total_mib",
                                                "temp_c", "power_w", "status", "reasons")} for x in g["gpus"]]},
        "jobs": [dict(j, quality=json_quality(j.get("quality"))) for j in h["jobs"]],
        "findings": [{k: f.get(k) for k in ("code", "severity", "job_id", "message")} for f in h["findings"]],
        "findings_at": iso(h.get("findings_at")),
        "system": h.get("system") or {},
        "finished_total": h.get("finished_total"),
    }


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None: a diverged loss is NaN, and
    a bare ``NaN`` is not JSON (strict parsers such as ``jq`` reject the whole document)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def emit_strict_json(obj: Any) -> None:
    """One JSON document on stdout; ``allow_nan=False`` so a non-finite number that slipped
    past ``finite`` fails here rather than in the user's parser."""
    sys.stdout.write(json.dumps(finite(obj), indent=2, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2 ** 30:.1f}"


def system_line(system: dict) -> str | None:
    """``cpu 23% of 16  load 1.20 0.90 0.80  mem 12.3/64.0G (19%, container)``, or None when
    the agent reported nothing (an older tick without ``load``)."""
    ld = system.get("load") or {}
    if not ld:
        return None
    bits = []
    if ld.get("cpu_pct") is not None:
        bits.append(f"cpu {ld['cpu_pct']:.0f}%" + (f" of {ld['cpus']}" if ld.get("cpus") else ""))
    if ld.get("load"):
        bits.append("load " + " ".join(f"{x:.2f}" for x in ld["load"]))
    if ld.get("mem_total_bytes"):
        scope = ", container" if ld.get("mem_scope") == "cgroup" else ""
        bits.append(f"mem {_gib(ld.get('mem_used_bytes'))}/{_gib(ld['mem_total_bytes'])}G"
                    f" ({ld.get('mem_pct') or 0:.0f}%{scope})")
    return "  " + "  ".join(bits) if bits else None


def _job_findings(findings: list[dict]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in findings:
        if f.get("job_id"):
            out.setdefault(f["job_id"], f"[{SEV_STYLE.get(f['severity'], '')}]{f['code']}[/]")
    return out


def quality_lines(jobs: list[dict]) -> list[Any]:
    """One line per job the quality check judged STOP: its name, the reason, and what to run."""
    from rich.text import Text
    out = []
    for j in jobs:
        q = j.get("quality") or {}
        if q.get("verdict") != "STOP":
            continue
        line = Text("  quality STOP ", style="bold red")
        line.append(f"{j.get('name') or j['id']}{' (final)' if q.get('final') else ''}: {q.get('reason') or q.get('rule')}")
        line.append(f"  (gpurun check --job {j.get('name') or j['id']})", style="dim")
        out.append(line)
    return out


def render(hosts: list[dict]) -> Any:
    """A rich renderable of every host (a Group of tables and lines)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for h in hosts:
        cost = h.get("cost")
        money = (f"  {cost['price_per_hour']:.2f} {cost['currency']}/h, {cost['cost_so_far']:.2f} so far"
                 if cost else "")
        if not h["ok"]:
            parts.append(Text.from_markup(f"[bold]{h['host']}[/]  [red]unreachable[/]: {h['error']}{money}"))
            parts.append(Text(""))
            continue
        g = h["gpu"]
        head = f"[bold]{h['host']}[/]  GPU health [{HEALTH_STYLE[g['status']]}]{g['status']}[/]"
        if not g["available"]:
            head += f"  (no NVIDIA GPU here: {g['no_driver']})"
        parts.append(Text.from_markup(head + money + f"  [dim]{h['elapsed_s']:.2f}s[/]"))
        sysl = system_line(h.get("system") or {})
        if sysl:
            parts.append(Text(sysl))
        if g["gpus"]:
            t = Table(box=None, padding=(0, 1), show_edge=False)
            for col in ("GPU", "util", "memory", "temp", "power", "health"):
                t.add_column(col, justify="left" if col == "health" else "right")
            for x in g["gpus"]:
                mem = "" if x.get("mem_used_mib") is None else \
                    f"{x['mem_used_mib'] / 1024:.1f}/{(x.get('mem_total_mib') or 0) / 1024:.0f}G"
                health = f"[{HEALTH_STYLE[x['status']]}]{x['status']}[/]"
                if x["reasons"]:
                    health += " " + x["reasons"][0]["message"]
                t.add_row(str(x["index"]), "" if x.get("util_pct") is None else f"{x['util_pct']:.0f}%", mem,
                          "" if x.get("temp_c") is None else f"{x['temp_c']:.0f}C",
                          "" if x.get("power_w") is None else f"{x['power_w']:.0f}W", health)
            parts.append(t)
        marks = _job_findings(h["findings"])
        if h["jobs"]:
            t = Table(box=None, padding=(0, 1), show_edge=False)
            for col in ("job", "state", "quality", "gpus", "runtime", "step", "loss", "finding"):
                t.add_column(col)
            for j in h["jobs"]:
                word = (j.get("quality") or {}).get("verdict") or ""
                t.add_row(j.get("name") or j["id"], f"[{STATE_STYLE.get(j['state'], '')}]{j['state']}[/]",
                          f"[{QUALITY_STYLE.get(word, '')}]{word}[/]" if word else "",
                          ",".join(str(i) for i in j["gpu_ids"]), human_duration(j["runtime_s"]),
                          "" if j["step"] is None else str(j["step"]),
                          "" if j["loss"] is None else f"{j['loss']:.4g}", marks.get(j["id"], ""))
            parts.append(t)
            parts.extend(quality_lines(h["jobs"]))
        else:
            parts.append(Text("  no jobs", style="dim"))
        shown = sum(1 for j in h["jobs"] if j["state"] not in ("queued", "running"))
        hidden = int(h.get("finished_total") or 0) - shown
        if hidden > 0:
            parts.append(Text(f"  and {hidden} more finished (--finished N shows more; "
                              f"gpurun queue status lists all)", style="dim"))
        for f in [f for f in h["findings"] if not f.get("job_id")][:5]:
            parts.append(Text.from_markup(f"  [{SEV_STYLE.get(f['severity'], '')}]{f['severity']}[/] {f['message']}"))
        parts.append(Text(""))
    parts.append(Text(time.strftime("updated %H:%M:%S  (Ctrl-C to leave; jobs keep running)"), style="dim"))
    return Group(*parts)


def hide_moved(snaps: list[dict]) -> list[dict]:
    """A fleet's snapshots less the ``moved`` rows of jobs another member holds
    (``core/fleet_views.visible_jobs``); the finished count drops by as many."""
    from orchestrator.core.fleet_views import visible_jobs
    kept = visible_jobs([{"host": h["host"], "jobs": h.get("jobs") or []} for h in snaps])
    for h, k in zip(snaps, kept):
        if h.get("ok") and len(k["jobs"]) != len(h["jobs"]):
            h["finished_total"] = max(0, int(h.get("finished_total") or 0) - (len(h["jobs"]) - len(k["jobs"])))
            h["jobs"] = k["jobs"]
    return snaps


@click.command()
@host_option(name="hosts", multiple=True,
              help="Host to watch; repeat for several (default: every SSH host in the inventory, else local).")
@click.option("--fleet", default=None, metavar="NAME",
              help="Watch every member of fleet NAME, and rebalance its queued jobs as you watch "
                   "(at most every 10 s; each move is a line).")
@click.option("--interval", type=seconds(min=0.5), default=5.0, show_default=True,
              help="Seconds between polls.")
@click.option("--once", is_flag=True, help="Poll once, print and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one document per poll).")
@click.option("--timeout", type=seconds(min=1), default=30.0, show_default=True,
              help="Seconds to wait for one host's reply.")
@click.option("--finished", type=AsciiInt(min=0), default=5, show_default=True, metavar="N",
              help="Finished jobs to show per host, latest first (every active job is always shown).")
def watch(hosts: tuple[str, ...], fleet: str | None, interval: float, once: bool, as_json: bool, timeout: float,
          finished: int) -> None:
    """Live view of hosts (CPU, load, memory), GPUs (util, memory, temperature, power, health)
    and jobs (state, runtime, current step and loss, watchdog findings).

    With --fleet, every poll also rebalances the fleet (at most every 10 s): queued jobs move
    off a member that is lost or busy to one with room, each move shown as a line."""
    from orchestrator.core.hosts import watch_targets

    balancer = None
    sessions: dict[str, Any] = {}  # opened by _loop
    if fleet is not None:
        from orchestrator.core.fleet_views import Balancer, members
        names = members(fleet, lambda w: click.echo(f"gpurun: warning: {w}", err=True))
        hosts = tuple(dict.fromkeys(list(hosts) + names))  # --host adds to the fleet's members
        balancer = Balancer(names)
    moves: list[str] = []  # the latest move lines, shown under the hosts

    def polled() -> list[dict]:
        if balancer is not None:
            new = balancer()
            moves.extend(time.strftime("%H:%M:%S ") + m for m in new)
            del moves[:-10]
        snaps = poll(sessions, timeout, finished)
        return hide_moved(snaps) if fleet is not None else snaps

    def shown(snaps: list[dict]) -> Any:
        if not moves:
            return render(snaps)
        from rich.console import Group
        from rich.text import Text
        return Group(render(snaps), *[Text(m) for m in moves])

    try:
        _loop(watch_targets(hosts), once, as_json, interval, polled, shown, fleet, moves, sessions)
    except KeyboardInterrupt:
        # Ctrl-C is how one leaves a watch: exit 0, stdout holding whole documents only
        click.echo("gpurun: left the watch; jobs keep running on their hosts", err=True)


def _loop(entries: list[dict], once: bool, as_json: bool, interval: float, polled: Any, shown: Any,
          fleet: str | None, moves: list[str], sessions: dict[str, Any]) -> None:
    """Poll and show until Ctrl-C (or once). ``sessions`` is filled here, for ``polled``."""
    from orchestrator.core import agentship
    from orchestrator.core.session import open_session

    agentship.build()  # once, here: parallel first calls would race to write the same zipapp
    with ExitStack() as stack:
        sessions.update({e["name"]: stack.enter_context(open_session(host=e)) for e in entries})
        # piped (`gpurun watch | tee watch.log`): a live view redraws in place and rich only
        # draws it at the end off a terminal, so each poll is printed whole, one after another
        if once or as_json or not console().is_terminal:
            while True:
                snaps = polled()
                with whole():
                    if as_json:
                        doc = {"time": iso(time.time()), "hosts": [json_host(h) for h in snaps]}
                        if fleet is not None:  # this poll's moves only: each document says what it saw
                            doc.update(fleet=fleet, moves=list(moves))
                            moves.clear()
                        emit_strict_json(doc)
                    else:
                        console().print(shown(snaps))
                        if not once:
                            console().print("")  # one blank line between two polls' views
                            sys.stdout.flush()
                        moves.clear()
                if once:
                    return
                time.sleep(interval)
        from rich.live import Live

        out = console()
        try:
            with Live(shown(polled()), console=out, auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(shown(polled()), refresh=True)
        except KeyboardInterrupt:
            out.print("\nleft the watch; jobs keep running on their hosts")


@contextmanager
def whole() -> Iterator[None]:
    """Ctrl-C held back while one document is written, then raised: stdout gets a document
    whole or not at all (a script reading the stream never sees a torn one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and previous is signal.default_int_handler:
            raise KeyboardInterrupt
