"""``gpurun queue balance``: move queued jobs between the hosts of a fleet (``core/fleet_balance``).

Plain words, one line per move, nothing but text: the output is the same on a terminal and in
a pipe. Exit 0 when every step went through, 1 when some move failed or a job ran on two hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.cli.fleet import fleet_option
from orchestrator.cli.options import host_option, seconds
from orchestrator.cli.render import emit_json

if TYPE_CHECKING:
    from orchestrator.core.fleet_balance import BalanceReport


@click.command("balance")
@fleet_option("Balance fleet NAME (`gpurun fleet ls`).")
@host_option("A host of an ad-hoc fleet (repeat: --host A --host B).", multiple=True)
@click.option("--dry-run", is_flag=True, help="Say which jobs would move; move nothing.")
@click.option("--lost-after", "lost_after", type=seconds(min=0), default=None, metavar="SECONDS",
              help="A host that has not answered for this long is lost and its queue moves to the others "
                   "(default: fleet.lost_after_s in config.yaml, else 120).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def balance(fleet: str | None, host: tuple[str, ...], dry_run: bool, lost_after: float | None,
            as_json: bool) -> None:
    """Move queued jobs from busy or lost hosts to hosts with free capacity.

    First finishes any move an earlier, interrupted run began; then a host that has not
    answered for --lost-after seconds (remembered across runs) has its queued and running jobs
    placed on the others; then each host with free capacity and nothing queued takes the last
    queued jobs of the host with the longest queue. A move marks the job moved on its old host
    (refused if it started there: it stays) before adding it on the new one, so a job never runs
    twice and is never lost, even if this command is killed.

    A lost host that was only cut off from here may have started a queued job before it
    answers again: that job ran on both, and the next balance says so (exit 1).
    """
    from orchestrator.core import fleet as fleetcore
    from orchestrator.core import fleet_balance as core

    notes: list[str] = []
    members = fleetcore.members(fleet, host, notes)
    for n in notes:
        click.echo(f"warning: {n}", err=True)
    rep = core.balance(members, lost_after_s=lost_after, dry_run=dry_run)  # None: config.yaml's
    if as_json:
        emit_json(rep.to_json())
    else:
        _print(rep, fleet or f"{len(members)} hosts")
    if _failures(rep) or rep.ran_on_both:
        raise SystemExit(1)


def _failures(rep: BalanceReport) -> list[str]:
    """The errors other than "did not answer" (an unreachable host is reported on its own)."""
    return [e for e in rep.errors if not any(e.startswith(f"{u} did not answer") for u in rep.unreachable)]


def _label(move: dict) -> str:
    short = move["job"][:8]
    return f"{move['name']} ({short})" if move.get("name") and move["name"] != move["job"] else short


def _print(rep: BalanceReport, where: str) -> None:
    verb = "would move" if rep.dry_run else "moved"
    for m in rep.finished:
        click.echo(f"{verb} {_label(m)} from {m['from']} to {m['to']}: {m['why']}")
    for m in rep.moves:
        click.echo(f"{verb} {_label(m)} from {m['from']} to {m['to']}: {m['why']}")
    for r in rep.released:
        click.echo(f"{r['host']} answers again: released its copy of {_label(r)} (it lives on {r['to']})")
    for name in rep.lost:
        click.echo(f"{name} is lost: it has not answered for longer than --lost-after", err=True)
    for name in rep.unreachable:
        if name not in rep.lost:
            click.echo(f"{name} did not answer; its queue moves once it is lost (--lost-after)", err=True)
    for hit in rep.ran_on_both:
        what = ("it was queued there when the host was lost and started there before it answered again"
                if hit["was"] == "queued" else
                "it was running there when the host was lost; its agent may run it again")
        click.echo(f"WARNING: job {_label(hit)} ran on both {hit['host']} and {hit['to']}: {what} "
                   f"(now {hit['state']} on {hit['host']}; `gpurun queue cancel --host {hit['host']} "
                   f"{hit['job'][:8]}` if it still runs)", err=True)
    for e in _failures(rep):
        click.echo(f"error: {e}", err=True)
    n = len(rep.moves) + len(rep.finished)
    if n == 0 and not rep.released:
        click.echo(f"{where}: balanced, nothing to move")
    else:
        click.echo(f"{where}: {verb} {n} job(s)")
