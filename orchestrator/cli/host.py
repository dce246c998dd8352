"""``gpurun host``: the inventory of hosts (``local`` always exists)."""

from __future__ import annotations

import click

from orchestrator.cli.render import console, emit_json


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
@click.option("--slots", type=click.IntRange(min=1), default=None, help="Jobs at a time when the box has no GPU.")
@click.option("--python", "python", default="python3", show_default=True, help="Python (>= 3.8) on the box.")
@click.option("--insecure-host-key", is_flag=True, help="Do not verify the SSH host key (not recommended).")
@click.option("--replace", is_flag=True, help="Replace an existing host of the same name.")
def add(name: str, profile: str, ssh_spec: str | None, key: str | None, jump: str | None, state_dir: str | None,
        workdir: str | None, slots: int | None, python: str, insecure_host_key: bool, replace: bool) -> None:
    """Add an SSH host NAME; its host key is recorded on first contact (trust on first use)."""
    import os

    from orchestrator import hosts as hostinv
    from orchestrator.errors import HostError
    from orchestrator.profiles import load_profile

    if name == "local":
        raise HostError("'local' is built in", "use `gpurun queue submit --slots N` to change its slots")
    prof = load_profile(profile)
    target = hostinv.parse_ssh(ssh_spec) if ssh_spec else {"user": None, "hostname": None, "port": None,
                                                           "alias": name}
    if ssh_spec is None and not os.path.exists(os.path.expanduser("~/.ssh/config")):
        raise HostError(f"no --ssh target for {name!r} and no ~/.ssh/config to find it in",
                        f"pass --ssh user@host:port, e.g. `gpurun host add {name} --ssh root@1.2.3.4:22`")
    target["user"] = target.get("user") or prof.get("ssh.user")
    if key:
        target["key"] = os.path.abspath(key)
    if jump:
        target["proxy_jump"] = jump
    entry = {"name": name, "profile": prof.name, "kind": "ssh", "ssh": target, "python": python,
             "state_dir": state_dir or prof.path("state_dir", name) or "~/.gpurun",
             "workdir": workdir or prof.path("workdir", name) or "~/gpurun-work",
             "slots": slots or 1, "insecure_host_key": insecure_host_key}
    out = console(stderr=True)
    if not insecure_host_key:
        from orchestrator.transport.ssh import first_contact
        ktype, fp = first_contact(entry)
        out.print(f"host key of {name}: {ktype} {fp} (recorded; a different key later is refused)")
    else:
        out.print("[yellow]warning:[/] host key verification is OFF for this host")
    hostinv.add_host(entry, replace=replace)
    out.print(f"added host {name} (profile {prof.name}, state dir {entry['state_dir']})")


@host.command("ls")
@click.option("--json", "as_json", is_flag=True)
def ls(as_json: bool) -> None:
    """List hosts."""
    from orchestrator import hosts as hostinv
    hosts = hostinv.load_hosts()
    if as_json:
        emit_json({"hosts": [hosts[n] for n in sorted(hosts)]})
        return
    from rich.table import Table
    t = Table(title="hosts", title_justify="left")
    for col in ("name", "profile", "target", "state dir", "slots"):
        t.add_column(col)
    for n in sorted(hosts):
        h = hosts[n]
        ssh = h.get("ssh") or {}
        target = "this machine" if h.get("kind") == "local" else (
            ssh.get("alias") or f"{ssh.get('user') or ''}@{ssh.get('hostname')}:{ssh.get('port') or 22}")
        t.add_row(n, h.get("profile") or "", target, str(h.get("state_dir") or ""), str(h.get("slots") or 1))
    console().print(t)


@host.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Remove a host from the inventory (nothing on the box is touched)."""
    from orchestrator import hosts as hostinv
    hostinv.remove_host(name)
    click.echo(f"removed host {name} from the inventory (the box and its files are untouched)")
