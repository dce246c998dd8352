"""``gpurun fleet``: named groups of hosts (add, ls, rm), and the ``--fleet NAME`` option with
fleet-name completion that fleet-wide commands share (``fleet_option``, ``complete_fleets``).

A fleet only names hosts of the inventory: adding or removing one contacts no box and deletes
nothing on any, so ``fleet rm`` asks nothing; it says what it took out.
"""

from __future__ import annotations

from typing import Any, Callable

import click
from click.shell_completion import CompletionItem

from orchestrator.cli.options import complete_hosts
from orchestrator.cli.render import console, emit_json, pad_column, width_of


def complete_fleets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Fleet names from fleets.json that start with ``incomplete`` (no network; never raises)."""
    try:
        from orchestrator.core.fleet import fleet_names
        return [CompletionItem(n) for n in fleet_names() if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - a broken completion must not print a traceback into the shell
        return []


def fleet_option(help: str = "Act on every host of fleet NAME (`gpurun fleet ls`).") -> Callable[[Any], Any]:
    """``--fleet NAME`` with fleet-name completion; the callback receives ``fleet``."""
    return click.option("--fleet", "fleet", default=None, metavar="NAME", help=help,
                        shell_complete=complete_fleets)


@click.group()
def fleet() -> None:
    """Group hosts into named fleets: one queue spread over several boxes.

    \b
      gpurun fleet add sweep box-a box-b box-c
      gpurun queue submit q.txt --fleet sweep  # by free GPUs or slots
      gpurun queue status --fleet sweep        # also events, watch
      gpurun queue balance --fleet sweep       # off busy or dead boxes
      gpurun pull --fleet sweep                # all artifacts, verified
      gpurun down --fleet sweep                # the gate, per member

    A fleet only names hosts of `gpurun host ls`: add and rm contact no box.
    """


@fleet.command("add")
@click.argument("name", shell_complete=complete_fleets)
@click.argument("hosts", nargs=-1, required=True, shell_complete=complete_hosts)
def add(name: str, hosts: tuple[str, ...]) -> None:
    """Create fleet NAME of HOSTS, or add HOSTS to it (hosts from `gpurun host ls`)."""
    from orchestrator.core import fleet as core
    members = core.add(name, list(hosts))
    click.echo(f"fleet {name}: {', '.join(members)} ({len(members)} host(s))")


@fleet.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print {fleets: [{name, created_at, hosts: "
              "[{name, profile, kind}]}]} (kind 'missing': no longer in the host inventory).")
def ls(as_json: bool) -> None:
    """List fleets, their hosts, and each host's profile and kind."""
    from orchestrator.core import fleet as core
    fleets = core.ls()
    if as_json:
        emit_json({"fleets": fleets})
        return
    if not fleets:
        console(stderr=True).print("no fleets yet; make one with `gpurun fleet add NAME HOST...`",
                                   markup=False)
        return
    # one plain line per host: readable at 80 columns, and greppable when piped
    rows = [("FLEET", "HOST", "PROFILE", "KIND")] + [
        (f["name"], h["name"], h["profile"] or "-", h["kind"]) for f in fleets
        for h in f["hosts"] or [{"name": "-", "profile": None, "kind": "(no hosts)"}]]
    columns = [pad_column(list(col), width_of(col)) for col in zip(*rows)]  # in terminal cells
    click.echo("\n".join("  ".join(r).rstrip() for r in zip(*columns)))


@fleet.command("rm")
@click.argument("name", shell_complete=complete_fleets)
@click.argument("hosts", nargs=-1, shell_complete=complete_hosts)
def rm(name: str, hosts: tuple[str, ...]) -> None:
    """Forget fleet NAME, or take HOSTS out of it. Nothing on any box is touched."""
    from orchestrator.core import fleet as core
    gone = core.remove(name, list(hosts) or None)
    if hosts:
        left = [f for f in core.ls() if f["name"] == name]
        rest = f"{len(left[0]['hosts'])} host(s) left" if left else "no host left: fleet forgotten"
        click.echo(f"fleet {name}: took out {', '.join(gone)} ({rest})")
    else:
        click.echo(f"forgot fleet {name} ({', '.join(gone) or 'no hosts'}); the hosts and their jobs are untouched")
