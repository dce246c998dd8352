"""``gpurun profiles ls|show``: what each provider profile says, in plain words.

JSON shapes (contract): ``ls --json`` -> ``{"profiles": [ROW], "errors": [{"name", "error",
"hint"}]}``; ``show --json`` -> ``{"name", "source", "layers", "profile": {...}, "plain": {...}}``.
"""

from __future__ import annotations

import json
import os

import click


@click.group()
def profiles() -> None:
    """List and show provider profiles (shipped, and yours in ~/.config/gpurun/profiles)."""


@profiles.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON shape.")
def ls_cmd(as_json: bool) -> None:
    """One line per profile: meter-stop verb, what bills when stopped, danger clocks."""
    from orchestrator.core.profiles import list_profiles

    rows, errors = list_profiles()
    if as_json:
        click.echo(json.dumps({"profiles": rows, "errors": errors}, indent=2,
                              ensure_ascii=False))
    else:
        _table(rows)
    for e in errors:
        click.echo(f"gpurun: error: {e['error']}", err=True)
        if e["hint"]:
            click.echo(f"  hint: {e['hint']}", err=True)
    if errors:
        raise SystemExit(2)


def _table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    from orchestrator.cli.render import print_plain_rows, stdout_is_tty

    cols = ["profile", "kind", "meter stop", "bills when stopped", "danger clocks", "detach"]
    if not stdout_is_tty():
        print_plain_rows(cols, [[r["name"], r["kind"], r["meter_stop"] + (" (irreversible)" if r["meter_stop_irreversible"] else ""),
                                 "\n".join(r["bills_when_stopped"]), "\n".join(r["danger_clocks"]), r["detach"]]
                                for r in rows])
        return
    t = Table(show_lines=False, pad_edge=False)
    for col in cols:
        t.add_column(col, overflow="fold")
    for r in rows:
        verb = r["meter_stop"] + (" [red](irreversible)[/red]"
                                  if r["meter_stop_irreversible"] else "")
        t.add_row(r["name"], r["kind"], verb,
                  "\n".join(r["bills_when_stopped"]) or "-",
                  "\n".join(r["danger_clocks"]) or "-", r["detach"])
    Console().print(t)


@profiles.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the merged profile as JSON.")
def show_cmd(name: str, as_json: bool) -> None:
    """Everything profile NAME says, with its traps spelled out."""
    from orchestrator.core.profiles import show_profile

    doc = show_profile(name)
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    d, plain = doc["profile"], doc["plain"]
    out = [f"{doc['name']}: {d['description']}",
           f"  kind {d['kind']}; facts checked {d['checked']}; from {', '.join(doc['layers'])}"]
    # only public links: the other sources name internal research notes
    out += [f"  docs: {url}" for url in plain.get("docs") or []]
    if d["ssh"]:
        ssh = d["ssh"]
        out.append(f"SSH: {ssh['form']}")
        if ssh.get("port_changes"):
            out.append(f"  port/IP changes: {ssh['port_changes']}")
        if ssh.get("note"):
            out.append(f"  {ssh['note']}")
    pa = d["paths"]
    out.append(f"Paths: work {pa['workdir']}; agent state {pa['state_dir']}; "
               f"caches {pa['cache_dir']}"
               + (f"; durable {pa['durable_dir']}" if pa.get("durable_dir") else ""))
    out.append("Storage tiers:")
    for t in d["storage"]:
        keeps = ("survives stop" if t["survives_stop"] else "WIPED ON STOP") + ", " + (
            "survives destroy" if t["survives_destroy"] else "gone on destroy")
        net = ", network filesystem" if t["network_fs"] else ""
        out.append(f"  {t['name']:<15} {t['path']:<20} {keeps}{net}")
        if t.get("note"):
            out.append(f"  {'':<15} {t['note']}")
    out += plain["meter"] + plain["bills_when_stopped"] + plain["danger_clocks"]
    out += [f"Trap: {t}" for t in plain["traps"]]
    out.append(f"Detach: {d['detach']}; boot hook: {d['boot_hook']}")
    net = d["network"]
    if net.get("proxy_hook") or net.get("env"):
        out.append(f"Network: proxy hook {net.get('proxy_hook') or 'none'}; env "
                   + (", ".join(f"{k}={v}" for k, v in (net.get("env") or {}).items())
                      or "none"))
    if d["api"]:
        api = d["api"]
        state = "set" if os.environ.get(api["credential_env"]) else "NOT set"
        out.append(f"API: {api['base_url']} ({api['auth']}); credential from env var "
                   f"{api['credential_env']} ({state} here)")
    w = d["watchdog"]
    out.append(f"Watchdog: every {w['interval_s']:g} s; stalled after {w['stall_after_s']:g} s "
               f"without log progress; disk {w['disk_pct']:g}%, inodes {w['inode_pct']:g}%, "
               f"cgroup memory {w['cgroup_mem_pct']:g}%; VRAM zombies listed after "
               f"{d['reap']['min_age_s']:g} s, reaped only on request")
    acts = [f"{k}={v}" for k, v in w["policy"].items() if v in ("kill", "requeue")]
    if acts:
        out.append("  watchdog acts on its own: " + ", ".join(acts))
    out.append(f"Quality gate: {d['quality']['action']}; on preemption: "
               f"{d['recovery']['on_preempt']}; autostop: "
               f"{'on' if d['autostop']['enabled'] else 'off'}")
    click.echo("\n".join(out))
