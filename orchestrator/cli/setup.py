"""``gpurun setup PROVIDER HOST``: check a fresh box, prepare it, and say what costs money.

``--json`` prints the report (contract): ``{"host", "profile", "dry_run", "ok", "layout",
"checks": [{"name", "status", "detail"}], "gpus": [{"index", "name", "memory", "driver"}],
"driver", "cuda", "tiers": [...], "actions": [{"what", "command", "input", "done", "error"}],
"notes", "refusal", "plain": {"meter", "bills_when_stopped", "danger_clocks", "traps"}}``.
Exit 0 when every check passed and every action ran; 1 on a failed check or action; 2 when
the profile's layout is refused (state dir on a network filesystem) or input is bad.
"""

from __future__ import annotations

import json

import click

from orchestrator.cli.options import host_argument
from orchestrator.errors import OperationalError

MARK = {"ok": "[green]ok  [/green]", "warn": "[yellow]WARN[/yellow]", "fail": "[red]FAIL[/red]"}


@click.command()
@click.argument("provider")
@host_argument()
@click.option("--dry-run", is_flag=True, help="Print every command; run nothing on the host.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def setup(provider: str, host: str, dry_run: bool, as_json: bool) -> None:
    """Check and prepare HOST (from `gpurun host ls`; or --host) for PROVIDER (a profile name)."""
    from orchestrator.core.setup import refusal_error, setup_host

    report = setup_host(provider, host, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        _render(report)
    if report["refusal"]:
        raise refusal_error(report)
    if not report["ok"]:
        bad = [c["name"] for c in report["checks"] if c["status"] == "fail"]
        bad += [a["what"] for a in report["actions"] if a.get("error")]
        raise OperationalError(f"setup of {host!r} found problems: {', '.join(bad)}",
                               "fix them (see the report above) and run setup again; "
                               "it is safe to repeat")


def _render(r: dict) -> None:
    from rich.console import Console
    from rich.markup import escape

    con = Console(highlight=False, soft_wrap=True)
    head = "DRY RUN: nothing will run on the host" if r["dry_run"] else "setup"
    con.print(f"[bold]{head}[/bold]: host {r['host']}, profile {r['profile']}")
    lay = r["layout"]
    con.print(f"  agent state {lay['state_dir']}; work {lay['workdir']}; "
              f"caches {lay['cache_dir']}")
    if r["checks"]:
        con.print("[bold]Checks[/bold]")
        for c in r["checks"]:
            con.print(f"  {MARK[c['status']]}  {c['name']:<16} {escape(c['detail'])}")
    if r["actions"]:
        con.print("[bold]" + ("Would run" if r["dry_run"] else "Actions") + "[/bold]")
        for a in r["actions"]:
            state = ("" if a["done"] is None else
                     " [green]done[/green]" if a["done"] else " [red]FAILED[/red]")
            con.print(f"  # {escape(a['what'])}{state}")
            con.print(f"  $ {escape(a['command'])}")
            if r["dry_run"] and a.get("input") and a["input"] != "<probe script>":
                con.print("    (stdin:)")
                for line in a["input"].rstrip("\n").splitlines():
                    con.print("    | " + escape(line))
            elif r["dry_run"] and a.get("input"):
                con.print("    (stdin: templates/setup_probe.sh)")
            if a.get("error"):
                con.print(f"    [red]{escape(a['error'])}[/red]")
            elif a["done"] is None and not r["dry_run"]:
                con.print("    (not run: an earlier step failed or setup refused)")
    for n in r["notes"]:
        con.print(f"[dim]note:[/dim] {escape(n)}")
    plain = r["plain"]
    lines = plain["meter"] + plain["bills_when_stopped"] + plain["danger_clocks"] + [
        f"Trap: {t}" for t in plain["traps"]]
    if lines:
        con.print("[bold]Money and data: read this once[/bold]")
        for line in lines:
            con.print("  " + escape(line))
