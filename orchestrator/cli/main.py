"""Entry point of the ``gpurun`` command.

Subcommands load lazily (``LAZY`` maps a name to ``module:attribute``) so ``gpurun --help``
and quick verbs do not pay for fabric, boto3 or rich. ``main`` is the one place where a
``GpurunError`` becomes a one-line message, a hint and an exit code.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from orchestrator import __version__
from orchestrator.errors import GpurunError

# name -> (module:attr, one-line help). Help text is here so --help imports nothing else.
LAZY: dict[str, tuple[str, str]] = {
    "queue": ("orchestrator.cli.queue:queue", "Submit, inspect, cancel and retry queued jobs."),
    "host": ("orchestrator.cli.host:host", "Manage the host inventory (local, SSH boxes)."),
    "profiles": ("orchestrator.cli.profiles:profiles", "List and show provider profiles."),
    "push": ("orchestrator.cli.push:push", "Send a project directory to a host."),
    "setup": ("orchestrator.cli.setup:setup", "Check and prepare a fresh box for a provider."),
    "check": ("orchestrator.cli.check:check", "Judge a training run from its metrics."),
    "gpu": ("orchestrator.cli.gpu:gpu", "GPU health verdict for a host."),
    "watch": ("orchestrator.cli.watch:watch", "Live view of hosts, GPUs and jobs."),
    "reap": ("orchestrator.cli.reap:reap", "Find (and with --kill, reap) VRAM zombies."),
    "pull": ("orchestrator.cli.pull:pull", "Bring artifacts home, verified."),
    "down": ("orchestrator.cli.down:down", "Stop the meter, only after results are verified."),
    "up": ("orchestrator.cli.up:up", "Rent a GPU box through a provider API."),
    "ls": ("orchestrator.cli.ls:ls", "List rented instances with state and cost."),
    "recover": ("orchestrator.cli.recover:recover", "Recover a preempted box: wait, restart or replace it."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n in LAZY if _available(n)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY:
            return cmd
        target = LAZY[name][0]
        mod_name, attr = target.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                return None
            raise
        return getattr(mod, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, LAZY[n][1]) for n in sorted(LAZY) if _available(n)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _available(name: str) -> bool:
    mod = LAZY[name][0].split(":")[0]
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), *mod.split(".")[1:]) + ".py"
    return os.path.exists(path)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpurun")
def cli() -> None:
    """gpurun: run a queue of training commands on any GPU box, detached, watched,
    judged, and brought home verified.

    Start with:  gpurun queue submit examples/queue.txt --wait
    """


def main(argv: list[str] | None = None) -> None:
    try:
        rv = cli.main(args=argv, prog_name="gpurun", standalone_mode=False)
    except GpurunError as err:
        click.echo(f"gpurun: error: {err.message}", err=True)
        if err.hint:
            click.echo(f"  hint: {err.hint}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("gpurun: aborted", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except KeyboardInterrupt:
        click.echo("gpurun: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    else:
        sys.exit(rv if isinstance(rv, int) else 0)
