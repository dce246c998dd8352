"""``gpurun host``: the inventory of hosts (``local`` always exists): add, ls, show, rm."""

from __future__ import annotations

import click

from orchestrator.cli.options import AsciiInt, complete_hosts
from orchestrator.cli.render import console, emit_json, print_plain_rows, stdout_is_tty


@click.group()
def host() -> None:
    """Manage the host inventory (local, SSH boxes)."""


@host.command("add")
@click.argument("name")
@click.option("--profile", "profile", default="generic-ssh", show_default=True, help="Provider profile of the box.")
@click.option("--ssh", "ssh_spec", default=None, metavar="USER@HOST:PORT",
              help="SSH target; omit to use NAME as an ~/.ssh/config alias.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), default=None, help="Private key file.")
@click.option("--jump", default=None, metavar="USER@HOST:PORT", help="ProxyJump host.")
@click.option("--state-dir", default=None, help="Agent state dir on the box (default: the profile's).")
@click.option("--workdir", default=None, help="Where pushed code lives and jobs run (default: the profile's).")
@click.option("--slots", type=AsciiInt(min=1), default=None, help="Jobs at a time when the box has no GPU.")
@click.option("--python", "python", default="python3", show_default=True, help="Python (>= 3.8) on the box.")
@click.option("--insecure-host-key", is_flag=True, help="Do not verify the SSH host key (not recommended).")
@click.option("--replace", is_flag=True, help="Replace an existing host of the same name.")
@click.option("--slurm", "slurm_opts", multiple=True, metavar="KEY=VALUE",
              help="A Slurm host's sbatch default over its profile's (partition, account, qos, constraint, "
                   "time_default, gres); repeatable.")
def add(name: str, profile: str, ssh_spec: str | None, key: str | None, jump: str | None, state_dir: str | None,
        workdir: str | None, slots: int | None, python: str, insecure_host_key: bool, replace: bool,
        slurm_opts: tuple[str, ...]) -> None:
    """Add an SSH host NAME; its host key is recorded on first contact (trust on first use).

    The SSH user, host and port are checked first: a host or user starting with '-', a control
    or non-ASCII character, or a port not in ASCII digits is refused, naming the character."""
    from orchestrator.core import hosts as core

    core.check_new_name(name, replace=replace)  # before any contact: a taken name records no key
    entry = core.ssh_entry(name, profile=profile, ssh_spec=ssh_spec, key=key, jump=jump, state_dir=state_dir,
                           workdir=workdir, slots=slots, python=python, insecure_host_key=insecure_host_key,
                           slurm=slurm_opts)
    out = console(stderr=True)
    if not insecure_host_key:
        ktype, fp = core.first_contact(entry)
        out.print(f"host key of {name}: {ktype} {fp} (recorded; a different key later is refused)")
    else:
        out.print("[yellow]warning:[/] host key verification is OFF for this host")
    core.add(entry, replace=replace)
    out.print(f"added host {name} (profile {entry['profile']}, state dir {entry['state_dir']})")


@host.command("ls")
@click.option("--json", "as_json", is_flag=True)
def ls(as_json: bool) -> None:
    """List hosts."""
    from orchestrator.core.hosts import list_hosts
    hosts = list_hosts()
    if as_json:
        emit_json({"hosts": hosts})
        return
    from orchestrator.core.hosts import describe
    cols = ["name", "profile", "target", "state dir", "slots"]
    rows = []
    for h in hosts:
        d = describe(h["name"])
        rows.append([d["name"], d["profile"] or "", d["target"], str(d["state_dir"] or ""), str(d["slots"])])
    if not stdout_is_tty():
        print_plain_rows(cols, rows)
        return
    from rich.table import Table
    t = Table(title="hosts", title_justify="left", caption="slots: jobs at a time on a host without GPUs", caption_justify="left")
    for col in cols:
        t.add_column(col, no_wrap=col in ("name", "slots"))
    for r in rows:
        t.add_row(*r)
    console().print(t)


@host.command("show")
@click.argument("name", shell_complete=complete_hosts)
@click.option("--json", "as_json", is_flag=True, help="Print {name, kind, profile, target, ssh, slots, "
              "state_dir, workdir, python, insecure_host_key, instance}.")
def show(name: str, as_json: bool) -> None:
    """Show what gpurun uses to reach host NAME: kind, profile, SSH target, slots, paths.

    Reads the inventory only; nothing is contacted.
    """
    from orchestrator.core.hosts import describe
    d = describe(name)
    if as_json:
        emit_json(d)
        return
    ssh = d["ssh"] or {}
    rows = [("name", d["name"]), ("kind", d["kind"]), ("profile", d["profile"]), ("target", d["target"]),
            ("key", ssh.get("key")), ("jump", ssh.get("proxy_jump")),
            ("host key", "NOT verified (--insecure-host-key)" if d["insecure_host_key"] else
             ("recorded on first contact" if d["kind"] != "local" else None)),
            ("slots", f"{d['slots']} (jobs at a time when the host has no GPU)"),
            ("state dir", d["state_dir"]), ("workdir", d["workdir"] or ("where you run gpurun"
                                                                        if d["kind"] == "local" else None)),
            ("python", d["python"]),
            ("instance", " ".join(f"{k}={v}" for k, v in (d["instance"] or {}).items()
                                  if k in ("provider", "id", "gpu", "price_per_hour")) or None)]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        if v is not None:
            click.echo(f"{k:<{width}}  {v}")


@host.command("rm")
@click.argument("name", shell_complete=complete_hosts)
def rm(name: str) -> None:
    """Remove a host from the inventory (nothing on the box is touched)."""
    from orchestrator.core.hosts import remove
    remove(name)
    click.echo(f"removed host {name} from the inventory (the box and its files are untouched)")
