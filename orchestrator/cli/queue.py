"""``gpurun queue``: submit, status, logs, cancel, retry."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

from orchestrator.cli.render import STATE_STYLE, console, emit_json, human_duration, json_job

if TYPE_CHECKING:
    from orchestrator.core.queue import Job

HOST_OPT = click.option("--host", "host", default=None, metavar="NAME",
                        help="Host to act on (default: local, or $GPURUN_HOST).")


@click.group()
def queue() -> None:
    """Submit, inspect, cancel and retry queued jobs."""


@queue.command()
@click.argument("file", type=click.Path(dir_okay=True, path_type=str))
@HOST_OPT
@click.option("--wait", is_flag=True, help="Block until every submitted job is finished; exit 1 if any failed.")
@click.option("--from", "start", type=click.IntRange(min=1), default=1, metavar="N",
              help="Start at the N-th job of the file (jobs, not lines).")
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="Jobs at a time on a host without GPUs (remembered for the host).")
@click.option("--cwd", default=None, help="Working directory for jobs without cwd= (default: here, or the host's workdir).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def submit(file: str, host: str | None, wait: bool, start: int, slots: int | None, cwd: str | None,
           as_json: bool) -> None:
    """Submit the jobs of a queue FILE (one shell command per line)."""
    from orchestrator.core import queue as core
    from orchestrator.core.session import open_session

    plan = core.plan_submit(file, host, start=start, slots=slots, cwd=cwd)
    err = console(stderr=True)
    with open_session(host=plan.host) as s:
        res = core.submit(s, plan)
        for w in res.warnings:
            err.print(f"[yellow]warning:[/] {w}")
        if as_json and not wait:
            emit_json({"host": res.host, "added": res.added, "present": res.present})
        elif not as_json:
            msg = f"submitted {len(res.added)} job(s) to {res.host}"
            if res.present:
                msg += f"; {len(res.present)} already queued or done (same job), not added again"
            err.print(msg)
        if not wait:
            return

        def show(rows: list[Job]) -> None:
            if as_json:
                return
            counts: dict[str, int] = {}
            for r in rows:
                counts[r["state"]] = counts.get(r["state"], 0) + 1
            err.print("  " + "  ".join(f"[{STATE_STYLE.get(k, '')}]{k}[/] {v}" for k, v in sorted(counts.items())))

        final = core.wait_for(s, res.ids, on_change=show)
    if as_json:
        emit_json({"host": res.host, "jobs": [json_job(j) for j in final]})
    else:
        render_table(res.host, final)
    if any(j["state"] != "succeeded" for j in final):
        sys.exit(1)


def render_table(host: str, jobs: list[Job]) -> None:
    from rich.table import Table
    table = Table(title=f"queue on {host}", title_justify="left")
    for col in ("#", "name", "state", "exit", "try", "gpus", "runtime", "id"):
        table.add_column(col, no_wrap=col in ("#", "state", "id"), overflow="fold")
    now = time.time()
    for j in jobs:
        runtime = None
        if j["started_at"]:
            runtime = (j["ended_at"] or now) - j["started_at"]
        state = f"[{STATE_STYLE.get(j['state'], '')}]{j['state']}[/]"
        if j.get("reason") and j["state"] in ("failed", "quality_stopped", "queued"):
            state += f"\n[dim]{j['reason'][:60]}[/]"
        gpus = ",".join(str(g) for g in j["gpu_ids"]) if j["gpu_ids"] else ""
        table.add_row(str(j["seq"]), j["name"], state, "" if j["exit_code"] is None else str(j["exit_code"]),
                      str(j["attempt"]), gpus, human_duration(runtime), j["id"])
    console().print(table)


@queue.command()
@HOST_OPT
@click.option("--all-hosts", is_flag=True, help="Query every host in the inventory, in parallel.")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON shape.")
def status(host: str | None, all_hosts: bool, as_json: bool) -> None:
    """Show the jobs on a host and their states."""
    from orchestrator.core import queue as core
    if not all_hosts:
        name, jobs = core.status(host)
        if as_json:
            emit_json({"host": name, "jobs": [json_job(j) for j in jobs]})
        else:
            render_table(name, jobs)
        return
    results = core.status_all()
    for r in results:
        if as_json:
            continue
        if "error" in r:
            console().print(f"[red]{r['host']}: {r['error']}[/]")
        else:
            render_table(r["host"], r["jobs"])
    if as_json:
        emit_json({"hosts": [{"host": r["host"], "jobs": [json_job(j) for j in r["jobs"]],
                              **({"error": r["error"]} if "error" in r else {})} for r in results]})
    if any("error" in r for r in results):
        sys.exit(1)


@queue.command()
@click.argument("job")
@HOST_OPT
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--tail", "tail_kb", type=int, default=64, show_default=True, help="KiB of the end of the log to show.")
def logs(job: str, host: str | None, follow: bool, tail_kb: int) -> None:
    """Print a job's log (JOB is a name, id or number)."""
    from orchestrator.core.session import open_session
    out = click.get_text_stream("stdout")
    with open_session(host) as s:
        res = s.logs(job, -1, tail_kb * 1024)
        out.write(res["data"])
        out.flush()
        while follow and res["job"]["state"] in ("queued", "running"):
            time.sleep(0.5)
            res = s.logs(res["job"]["id"], res["offset"])
            out.write(res["data"])
            out.flush()
        if follow:  # drain what was written between the last read and the end
            res = s.logs(res["job"]["id"], res["offset"])
            out.write(res["data"])


@queue.command()
@click.argument("jobs", nargs=-1)
@HOST_OPT
@click.option("--all", "all_", is_flag=True, help="Cancel every queued and running job (asks first).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before cancelling running jobs with --all.")
@click.option("--json", "as_json", is_flag=True)
def cancel(jobs: tuple[str, ...], host: str | None, all_: bool, yes: bool, as_json: bool) -> None:
    """Cancel jobs: queued ones at once, running ones with TERM then KILL after a grace."""
    from orchestrator.core.session import open_session
    from orchestrator.errors import BadInput
    if not jobs and not all_:
        raise BadInput("name the job(s) to cancel, or pass --all", "e.g. `gpurun queue cancel 3` or `--all`")
    with open_session(host) as s:
        if all_ and not yes:
            running = [j for j in s.status()["jobs"] if j["state"] == "running"]
            if running:
                _confirm_kill(s.host["name"], running)
        res = s.cancel(list(jobs), all_)
    if as_json:
        emit_json(res)
        return
    for c in res["cancelled"] or [{"name": "(none)", "result": "nothing to cancel"}]:
        click.echo(f"{c['name']}: {c['result']}")


def _confirm_kill(host: str, running: list[dict]) -> None:
    """Killing every running job is the user's call: ask on a terminal, refuse without one."""
    from orchestrator.errors import BadInput
    names = ", ".join(j["name"] for j in running[:5]) + (" ..." if len(running) > 5 else "")
    if not sys.stdin.isatty():
        raise BadInput(f"--all would stop {len(running)} running job(s) on {host} ({names})",
                       "add --yes to confirm, or name the jobs to cancel")
    click.confirm(f"Stop {len(running)} running job(s) on {host} ({names})?", abort=True)


@queue.command()
@click.argument("job")
@HOST_OPT
@click.option("--force", is_flag=True, help="Skip the quality gate for this resume (recorded in the job's history).")
def retry(job: str, host: str | None, force: bool) -> None:
    """Run a finished job again (the resume gate judges its metrics first)."""
    from orchestrator.core.session import open_session
    with open_session(host) as s:
        res = s.retry(job, force)
    j = res["job"]
    click.echo(f"{j['name']}: queued again (attempt {res['next_attempt']}){' with --force' if force else ''}")


@queue.command()
@click.argument("job", required=False)
@HOST_OPT
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Newest events to show.")
@click.option("--json", "as_json", is_flag=True, help="Print {host, events: [{id, ts, job_id, kind, severity, "
              "message, data}]}.")
def events(job: str | None, host: str | None, limit: int, as_json: bool) -> None:
    """A job's history (or the host's): state changes, retries, watchdog and quality findings."""
    from orchestrator.core.session import open_session
    with open_session(host) as s:
        evs = s.events(job, limit, newest=True)["events"]
        name = s.host["name"]
    if as_json:
        emit_json({"host": name, "events": evs})
        return
    style = {"warn": "yellow", "error": "red", "critical": "bold red"}
    out = console()
    for e in evs:
        sev = e["severity"]
        out.print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['ts']))}  "
                  f"[{style.get(sev, 'dim')}]{sev:<8}[/] {e['kind']:<16} {e['message']}", soft_wrap=True)
