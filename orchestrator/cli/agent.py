"""``gpurun agent``: the daemon on a host: ``status`` (pid, build, uptime, jobs, state dir) and
``stop``. Neither starts a daemon; any other command starts one again when needed."""

from __future__ import annotations

import functools
import sys
import time

import click

from orchestrator.cli.options import host_option
from orchestrator.cli.render import console, emit_json, human_duration

HOST_OPT = host_option()


@click.group()
def agent() -> None:
    """Show or stop the agent daemon on a host."""


@agent.command()
@HOST_OPT
@click.option("--json", "as_json", is_flag=True, help="Print {host, running, pid, build, agent, started_at, "
              "uptime_s, jobs: {queued, running}, state_dir, idle_exit_minutes, last_activity, process, scheduler}.")
def status(host: str | None, as_json: bool) -> None:
    """The agent daemon on a host: pid, build, uptime, jobs queued and running, state dir."""
    from orchestrator.core import agents as core
    st = core.status(host)
    if as_json:
        emit_json(st.to_json())
        return
    out = console()
    say = functools.partial(out.print, soft_wrap=True)  # paths and pids stay whole, for copy and grep
    if st.running:
        say(f"agent on {st.host}: [green]running[/] (pid {st.pid}, build {st.build}, "
                  f"up {human_duration(st.uptime_s) or '?'})")
    elif st.scheduler == "slurm":
        say(f"agent on {st.host}: no daemon (a Slurm host: Slurm is the queue, and each gpurun command "
            "reads it)")
    else:
        say(f"agent on {st.host}: [dim]not running[/] (the next gpurun command for {st.host} starts it)")
    if st.process:
        rss = st.process.get("rss_bytes")
        say(f"  process    {rss / 2**20:.0f} MB resident, {st.process.get('cpu_pct')}% CPU, "
            f"{st.process.get('threads')} threads" if rss is not None else "  process    (not readable)")
    say(f"  jobs       {st.queued} queued, {st.running_jobs} running")
    if st.disk:  # the agent keeps running on a full disk, but records nothing until there is space
        from rich.markup import escape
        say(f"  disk       [bold red]{escape(st.disk['message'])}[/]\n             hint: {escape(st.disk['hint'])}")
    say(f"  state dir  {st.state_dir}")
    if st.idle_exit_minutes:
        idle = f"after {st.idle_exit_minutes:g} min with nothing queued or running and no command"
        if st.running and st.last_activity:
            idle += f" (last command {human_duration(max(0.0, time.time() - st.last_activity))} ago)"
        say(f"  idle exit  {idle}")
    else:
        say("  idle exit  never (runs until `gpurun agent stop`, a reboot or `gpurun down`)")


def _confirm(host: str, running: list[dict]) -> None:
    """Leaving running jobs unwatched is the user's call: ask on a terminal, refuse without one."""
    from orchestrator.errors import BadInput
    names = ", ".join(j["name"] for j in running[:5]) + (" ..." if len(running) > 5 else "")
    if not sys.stdin.isatty():
        raise BadInput(f"{len(running)} job(s) running on {host} ({names}); the agent was not stopped",
                       "add --yes to stop it anyway: the jobs keep running (they are detached), but nothing "
                       "watches, times out or retries them until the next gpurun command starts the agent")
    click.confirm(f"{len(running)} job(s) running on {host} ({names}). They keep running, unwatched, until the "
                  f"agent starts again. Stop the agent?", abort=True)


@agent.command()
@HOST_OPT
@click.option("--yes", "-y", is_flag=True, help="Stop it even when jobs are running (they keep running).")
@click.option("--json", "as_json", is_flag=True, help="Print {host, stopped, pid, running_jobs, queued}.")
def stop(host: str | None, yes: bool, as_json: bool) -> None:
    """Stop the agent daemon (running jobs keep running: they are detached)."""
    from orchestrator.core import agents as core
    res = core.stop(host, force=yes, confirm=_confirm)
    if as_json:
        emit_json(res.to_json())
        return
    err = console(stderr=True)
    say = functools.partial(err.print, soft_wrap=True)
    if not res.stopped:
        say(f"no agent daemon running on {res.host}; nothing to stop")
        return
    say(f"stopped the agent on {res.host} (pid {res.pid})")
    if res.running:
        say(f"  {len(res.running)} job(s) keep running detached, unwatched until the agent starts again "
                  f"(any gpurun command for {res.host} starts it and re-adopts them)")
    if res.queued:
        say(f"  {res.queued} queued job(s) wait until the next gpurun command for {res.host} starts the agent")
