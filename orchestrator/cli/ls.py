"""``gpurun ls``: rented instances across providers with state, price, uptime and cost so far."""

from __future__ import annotations

import click


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print instances as JSON.")
def ls(as_json: bool) -> None:
    """List instances on every provider whose API key env var is set.

    Cost so far is price/hour x uptime since the last start (an estimate; the provider's
    invoice is the truth). Warns when a stopped box still bills (Vast disk, RunPod volume 2x).
    """
    from orchestrator.cli.render import console, emit_json, human_duration
    from orchestrator.core import rent

    res = rent.ls()
    if as_json:
        emit_json(res)
        return
    out, err = console(), console(stderr=True)
    from rich.table import Table
    t = Table(box=None)
    for col in ("PROVIDER", "ID", "HOST", "STATE", "GPU", "PRICE/H", "UPTIME", "COST"):
        t.add_column(col)
    for r in res["instances"]:
        price = f"{r['price_per_hour']:.2f} {r['currency']}" if r["price_per_hour"] is not None else "?"
        cost = f"{r['cost_so_far']:.2f}" if r["cost_so_far"] is not None else "?"
        gpu = f"{r['count']}x {r['gpu']}" + (" spot" if r["spot"] else "")
        t.add_row(r["provider"], r["id"], r["host"] or "-", r["state"], gpu, price,
                  human_duration(r["uptime_s"]) if r["uptime_s"] else "-", cost)
    if res["instances"]:
        out.print(t)
    else:
        err.print("no instances (providers checked: those whose API key env var is set)")
    for w in res["warnings"]:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)
    for e in res["errors"]:
        err.print(f"[red]error:[/] {e['provider']}: {e['error']}", highlight=False)
