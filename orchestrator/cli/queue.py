"""``gpurun queue``: submit, status, logs, cancel, retry."""

from __future__ import annotations

import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.fleet import fleet_option
from orchestrator.cli.options import HOST_HELP, AsciiInt, complete_jobs, host_option
from orchestrator.cli.render import (STATE_STYLE, console, emit_json, iso, json_job, on_interrupt,
                                      pad, plain_job_lines, stdout_is_tty, width_of)

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator.core.queue import Job

HOST_OPT = host_option()


@click.group()
def queue() -> None:
    """Submit, inspect, cancel and retry queued jobs."""


@queue.command()
@click.argument("file", type=click.Path(dir_okay=True, path_type=str))
@host_option(HOST_HELP + " Repeat it to spread the queue over several hosts.", multiple=True)
@fleet_option("Spread the queue over fleet NAME's hosts by free capacity (`gpurun fleet ls`).")
@click.option("--wait", is_flag=True, help="Block until every submitted job is finished and judged; exit 12 if the "
              "quality check judged any STOP, else 1 if any failed.")
@click.option("--from", "start", type=AsciiInt(min=1), default=1, metavar="N",
              help="Start at the N-th job of the file (jobs, not lines).")
@click.option("--slots", type=AsciiInt(min=1), default=None,
              help="Jobs at a time on a host without GPUs (remembered for the host).")
@click.option("--cwd", default=None, help="Working directory for jobs without cwd= (default: here, or the host's workdir).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def submit(file: str, host: tuple[str, ...], fleet: str | None, wait: bool, start: int, slots: int | None,
           cwd: str | None, as_json: bool) -> None:
    """Submit the jobs of a queue FILE (one shell command per line).

    With --fleet NAME, or --host repeated, each job goes to one host of the fleet: the one
    with the most free capacity (GPUs, or slots on a host without GPUs) for it."""
    from orchestrator.core import queue as core
    from orchestrator.core.session import open_session

    if fleet or len(host) > 1:
        _submit_fleet(file, fleet, host, wait=wait, start=start, slots=slots, cwd=cwd, as_json=as_json)
        return
    host = host[0] if host else None
    plan = core.plan_submit(file, host, start=start, slots=slots, cwd=cwd)
    err = console(stderr=True)
    if not plan.jobs:  # nothing to send: no round trip, no daemon started for an empty file
        for w in plan.warnings:
            err.print(f"[yellow]warning:[/] {w}")
        if as_json:
            emit_json({"host": plan.host["name"], "added": [], "present": []} if not wait else
                      {"host": plan.host["name"], "jobs": []})
        return
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

        show = _progress(err, as_json)
        on_interrupt(f"stopped waiting; the jobs keep running on {res.host} "
                     f"(see `gpurun queue status --host {res.host}`)")
        final = core.wait_for(s, res.ids, on_change=show)
    if as_json:
        emit_json({"host": res.host, "jobs": [json_job(j) for j in final]})
    else:
        render_table(res.host, final)
    _exit_after_wait([(res.host, j) for j in final], err, as_json)


def _progress(err: Any, as_json: bool) -> Callable[[list[Job]], None]:
    """``--wait``'s progress: a line of state counts (and of jobs judged STOP) when they change."""
    shown: list[str] = []

    def show(rows: list[Job]) -> None:
        if as_json:
            return
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        stops = sum(1 for r in rows if (r.get("quality") or {}).get("verdict") == "STOP")
        line = "  " + "  ".join(f"[{STATE_STYLE.get(k, '')}]{k}[/] {v}" for k, v in sorted(counts.items())) \
            + (f"  [bold red]judged STOP[/] {stops}" if stops else "")
        if shown[-1:] != [line]:  # a new verdict that changes no count prints nothing
            shown.append(line)
            err.print(line)
    return show


def _exit_after_wait(jobs: list[tuple[str, Job]], err: Any, as_json: bool) -> None:
    """``--wait``'s exit: 12 when any job was judged STOP, else 1 when any did not succeed."""
    from orchestrator.core.queue import judged_stop
    stopped = [(h, j) for h, j in jobs if judged_stop(j)]
    if stopped:
        # a diverged run may well exit 0: the verdict, not the exit code, is what a pipeline must see
        from orchestrator.errors import CLI_CODES
        if not as_json:
            from rich.markup import escape
            host, first = stopped[0]
            err.print(f"[bold red]quality STOP[/]: {len(stopped)} job(s) judged STOP by the training-quality "
                      f"check: {escape(', '.join(j['name'] for _, j in stopped))}", soft_wrap=True)
            err.print(f"  hint: see why with `gpurun check --job {first['name']}"
                      f"{'' if host == 'local' else ' --host ' + host}` (evidence under its run dir's "
                      f"quality/); exit code {CLI_CODES['quality_stop'][1]}", soft_wrap=True, markup=False)
        sys.exit(CLI_CODES["quality_stop"][1])
    failed = [(h, j) for h, j in jobs if j["state"] != "succeeded"]
    if failed:
        if not as_json:  # a bare `failed 1` leaves a newcomer guessing where the job's output is
            host, first = failed[0]
            err.print(f"{len(failed)} job(s) did not succeed; see why with `gpurun queue logs {shlex.quote(first['name'])}"
                      f"{'' if host == 'local' else ' --host ' + host}`", soft_wrap=True, markup=False)
        sys.exit(1)


def _submit_fleet(file: str, fleet: str | None, hosts: tuple[str, ...], *, wait: bool, start: int,
                  slots: int | None, cwd: str | None, as_json: bool) -> None:
    """``queue submit`` over a fleet (``--fleet NAME`` or several ``--host``): placed by free
    capacity, one submit per host in parallel; ``--wait`` waits on every host, same exit codes."""
    from orchestrator.core import fleet as core
    err = console(stderr=True)
    notes: list[str] = []
    members = core.members(fleet, hosts, notes)
    res = core.submit_fleet(file, members, fleet=fleet, start=start, slots=slots, cwd=cwd, warnings=notes)
    from rich.markup import escape
    for w in res.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True, highlight=False)
    where = f"fleet {fleet}" if fleet else f"{len(members)} hosts"
    if as_json and not wait:
        emit_json({"fleet": fleet, "hosts": [{"host": r.host, "added": r.added, "present": r.present}
                                            for r in res.results]})
    elif not as_json:
        spread = ", ".join(f"{r.host} {len(r.added)}" for r in res.results)
        msg = f"submitted {res.added} job(s) to {where}" + (f": {spread}" if spread else "")
        if res.present:
            msg += f"; {res.present} already queued or done on the fleet (same job), not added again"
        err.print(msg, markup=False, highlight=False)
    if not wait:
        return
    show = _progress(err, as_json)
    on_interrupt(f"stopped waiting; the jobs keep running on the hosts of {where} "
                 f"(see `gpurun queue status --host HOST`)")
    final = core.wait_fleet(res.results, on_change=show)
    if as_json:
        emit_json({"fleet": fleet, "hosts": [{"host": h, "jobs": [json_job(j) for j in final[h]]}
                                            for h in sorted(final)]})
    else:
        for h in sorted(final):
            render_table(h, final[h])
    _exit_after_wait([(h, j) for h in sorted(final) for j in final[h]], err, as_json)


def render_table(host: str, jobs: list[Job], slots: int | None = None) -> None:
    """The job table: fitted to a terminal, plain greppable lines when piped (``cli/render``)."""
    from orchestrator.cli.render import print_job_table
    print_job_table(host, jobs, slots)


@queue.command()
@HOST_OPT
@click.option("--all-hosts", is_flag=True, help="Query every host in the inventory, in parallel.")
@click.option("--fleet", default=None, metavar="NAME",
              help="Every member of fleet NAME, in parallel (a job moved to another member is shown there only).")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON shape.")
def status(host: str | None, all_hosts: bool, fleet: str | None, as_json: bool) -> None:
    """Show the jobs on a host and their states.

    On a terminal: a table fitted to its width (a job's reason on a dim line under it). Piped:
    a header and one plain line per job (full id, reason last) for grep, awk and wc -l.
    With --all-hosts or --fleet: one table per host (piped: one table with a HOST column); a
    host that cannot be asked is one line on stderr and exit 1, the others are still shown.
    """
    from orchestrator.core import queue as core
    from orchestrator.core.hosts import list_hosts, resolve
    if fleet is not None and (host or all_hosts):
        from orchestrator.errors import BadInput
        raise BadInput("--fleet names the hosts itself: drop --host / --all-hosts",
                       f"e.g. `gpurun queue status --fleet {fleet}`")
    if not all_hosts and fleet is None:
        entry = resolve(host)
        name, jobs, disk = core.status_report(entry["name"], table=not as_json)
        if as_json:
            emit_json({"host": name, "jobs": [json_job(j) for j in jobs], **({"disk": disk} if disk else {})})
        else:
            if disk:  # above the table, on stderr: the piped lines stay one per job
                click.echo(f"gpurun: {name}: {disk['message']}\n  hint: {disk['hint']}", err=True)
            render_table(name, jobs, entry.get("slots"))
        return
    if fleet is not None:
        from orchestrator.core.fleet_views import fleet_status, members
        names = members(fleet, lambda w: click.echo(f"gpurun: warning: {w}", err=True))
        results = fleet_status(names, table=not as_json)
    else:
        results = core.status_all(table=not as_json)
    if as_json:
        emit_json({**({"fleet": fleet} if fleet is not None else {}),
                   "hosts": [{"host": r["host"], "jobs": [json_job(j) for j in r["jobs"]],
                              **({"error": r["error"]} if "error" in r else {})} for r in results]})
    elif stdout_is_tty():
        slots = {h["name"]: h.get("slots") for h in list_hosts()}
        for r in results:
            if "error" not in r:
                render_table(r["host"], r["jobs"], slots.get(r["host"]))
            elif fleet is None:
                console().print(f"[red]{r['host']}: {r['error']}[/]")
            else:  # a fleet member that failed: one line on stderr, the others still shown
                click.echo(f"gpurun: {r['host']}: unreachable: {r['error']}", err=True)
    else:  # one table with a HOST column; a host that failed is reported on stderr
        click.echo("\n".join(plain_job_lines([(r["host"], j) for r in results for j in r["jobs"]])))
        for r in results:
            if "error" in r:
                click.echo(f"gpurun: {r['host']}: {'unreachable: ' if fleet else ''}{r['error']}", err=True)
    if any("error" in r for r in results):
        sys.exit(1)


@queue.command()
@click.argument("job", shell_complete=complete_jobs)
@HOST_OPT
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--tail", "-n", "tail_lines", type=AsciiInt(min=0), default=100, show_default=True,
              metavar="N", help="Lines from the end of the log to show first (whole lines; 0: only new output with -f).")
def logs(job: str, host: str | None, follow: bool, tail_lines: int) -> None:
    """Print a job's log (JOB is a name, id or number)."""
    from orchestrator.core.session import open_session
    out = click.get_text_stream("stdout")
    with open_session(host) as s:
        if follow:
            on_interrupt(f"stopped following; the job keeps running on {s.host['name']} "
                         f"(see `gpurun queue status --host {s.host['name']}`)")
        res = s.logs(job, -1, tail_lines=tail_lines)
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
@click.argument("jobs", nargs=-1, shell_complete=complete_jobs)
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
    if not res["cancelled"]:  # no "(none): ..." pseudo-job line
        click.echo(f"{s.host['name']}: nothing to cancel")
    for c in res["cancelled"]:
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
@click.argument("job", shell_complete=complete_jobs)
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
@click.argument("job", required=False, shell_complete=complete_jobs)
@HOST_OPT
@click.option("--fleet", default=None, metavar="NAME",
              help="Every member of fleet NAME, merged by time, each line with its host.")
@click.option("--limit", type=AsciiInt(min=1), default=50, show_default=True, help="Newest events to show.")
@click.option("--json", "as_json", is_flag=True, help="Print {host, events: [{id, ts, ts_unix, job_id, job_name, "
              "kind, severity, message, data}]} (ts is ISO 8601 UTC); with --fleet {fleet, events: [... host], "
              "errors: [{host, error}]}.")
def events(job: str | None, host: str | None, fleet: str | None, limit: int, as_json: bool) -> None:
    """A job's history (or the host's): state changes, retries, watchdog and quality findings."""
    from orchestrator.core.hosts import known_jobs
    from orchestrator.core.session import open_session
    errors: list[dict] = []
    if fleet is not None:
        if host:
            from orchestrator.errors import BadInput
            raise BadInput("--fleet names the hosts itself: drop --host", f"e.g. `gpurun queue events --fleet {fleet}`")
        from orchestrator.core.fleet_views import fleet_events, members
        names = members(fleet, lambda w: click.echo(f"gpurun: warning: {w}", err=True))
        evs, errors = fleet_events(names, job, limit)
        name = fleet
    else:
        with open_session(host) as s:
            evs = s.events(job, limit, newest=True)["events"]
            name = s.host["name"]
            names = {j["id"]: j["name"] for j in known_jobs(name)}
            if any(e.get("job_id") and e["job_id"] not in names for e in evs):
                # jobs the home records do not know yet (submitted from another machine): ask once
                names.update({j["id"]: j["name"] for j in s.status()["jobs"]})
        for e in evs:
            e["job_name"] = names.get(e.get("job_id") or "")
    if as_json:
        shown = [dict(e, ts=iso(e["ts"]), ts_unix=e["ts"]) for e in evs]
        emit_json({"fleet": name, "events": shown, "errors": errors} if fleet is not None else
                  {"host": name, "events": shown})
    else:
        from rich.markup import escape
        style = {"warn": "yellow", "error": "red", "critical": "bold red"}
        out = console()
        width = width_of(_job_label(e) for e in evs)  # in terminal cells: a CJK name takes two a character
        hw = width_of(e.get("host") or "" for e in evs)
        for e in evs:
            sev = e["severity"]
            where = f"{escape(pad(e['host'], hw))}  " if fleet is not None else ""
            out.print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['ts']))}  {where}"
                      f"[{style.get(sev, 'dim')}]{sev:<8}[/] {e['kind']:<16} {escape(pad(_job_label(e), width))}  "
                      f"{escape(e['message'])}", soft_wrap=True)
    for err in errors:  # a member that failed: one line on stderr, the others' events shown
        click.echo(f"gpurun: {err['host']}: unreachable: {err['error']}", err=True)
    if errors:
        sys.exit(1)


def _job_label(e: dict) -> str:
    """``name (short id)`` of an event's job; ``-`` for a host event."""
    if not e.get("job_id"):
        return "-"
    short = e["job_id"][:8]
    return f"{e['job_name']} ({short})" if e.get("job_name") and e["job_name"] != e["job_id"] else short

from orchestrator.cli.balance import balance as _balance  # noqa: E402 (queue balance: its own module)
queue.add_command(_balance)
