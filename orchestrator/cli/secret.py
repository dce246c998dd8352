"""``gpurun secret``: put a secret on a host (``set``), list the names (``ls``), forget one
(``rm``). Values never appear in argv, output, logs or the job table; jobs ask for secrets by
name (``secrets=NAME,...`` in a queue line)."""

from __future__ import annotations

import os
import sys

import click

from orchestrator.cli.options import host_option
from orchestrator.cli.render import console, emit_json, iso

HOST_OPT = host_option()


@click.group()
def secret() -> None:
    """Put secrets on a host for jobs that ask for them by name (secrets=NAME in a queue line)."""


def _value(name: str) -> str:
    """The value: the environment variable of the same name, else a hidden prompt on a terminal."""
    from orchestrator.errors import BadInput
    value = os.environ.get(name)
    if value:
        return value
    if not sys.stdin.isatty():
        raise BadInput(f"no value for secret {name}: ${name} is not set and there is no terminal to ask on",
                       f"export {name}=... in this shell, then run `gpurun secret set {name}` again (the value "
                       f"is taken from the environment, never from the command line)")
    return click.prompt(f"value of {name} (hidden)", hide_input=True, err=True)


@secret.command("set")
@click.argument("name")
@HOST_OPT
@click.option("--json", "as_json", is_flag=True, help="Print {host, name, set_at} (never the value).")
def set_(name: str, host: str | None, as_json: bool) -> None:
    """Put secret NAME on a host: the value comes from $NAME, or a hidden prompt on a terminal."""
    from orchestrator.core import secrets as core
    core.check_name(name)
    where, set_at = core.set_secret(name, _value(name), host)
    if as_json:
        emit_json({"host": where, "name": name, "set_at": set_at})
        return
    console(stderr=True).print(f"secret {name} set on {where}; jobs get it with secrets={name} in their queue line",
                               soft_wrap=True, highlight=False)


@secret.command("ls")
@HOST_OPT
@click.option("--json", "as_json", is_flag=True, help="Print {host, secrets: [{name, set_at}]} (names only).")
def ls(host: str | None, as_json: bool) -> None:
    """The secrets set on a host: names and when each was set, never values."""
    from orchestrator.core import secrets as core
    where, rows = core.names(host)
    if as_json:
        emit_json({"host": where, "secrets": [r.to_json() for r in rows]})
        return
    out = console()
    if not rows:
        console(stderr=True).print(f"no secrets on {where}; add one with `gpurun secret set NAME --host {where}`",
                                   soft_wrap=True, highlight=False)
        return
    width = max(len(r.name) for r in rows)
    for r in rows:
        out.print(f"{r.name:<{width}}  set {iso(r.set_at)}", soft_wrap=True, highlight=False)


@secret.command("rm")
@click.argument("name")
@HOST_OPT
@click.option("--json", "as_json", is_flag=True, help="Print {host, name, removed}.")
def rm(name: str, host: str | None, as_json: bool) -> None:
    """Forget secret NAME on a host (jobs that ask for it then fail at launch, naming it)."""
    from orchestrator.core import secrets as core
    where = core.remove(name, host)
    if as_json:
        emit_json({"host": where, "name": name, "removed": True})
        return
    console(stderr=True).print(f"secret {name} removed from {where}", soft_wrap=True, highlight=False)
