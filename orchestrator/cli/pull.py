"""``gpurun pull``: bring a host's artifacts home, verified, with progress bars."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional

import click

from orchestrator.cli.options import host_option, seconds


def show_path(path: str) -> str:
    from orchestrator.core.pull import show_path as show  # lazy: `gpurun --help` stays fast

    return show(path)


BAR_WIDTH = 12
FIGURES_WIDTH = BAR_WIDTH + 36  # "117.6/400.0 MB" "180.6 MB/s" "0:00:02" and the gaps


def fit_label(text: str, room: int) -> str:
    """``text`` cut to ``room`` characters in its middle, keeping the job id in front and the
    file's own name at the end (the part that tells files apart)."""
    room = max(room, 20)
    if len(text) <= room:
        return text
    head = min(13, room // 2)
    return text[:head] + "…" + text[len(text) - (room - head - 1):]


class RichProgress:
    """Per-file bars with throughput on stderr; a file bar disappears when it is done."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        from rich.table import Column

        # One line per file at any width (80 columns included): the bar is short and the name
        # gives way, never the figures (rich would otherwise wrap "117.6/400.0 MB" or drop the
        # bar behind a long path).
        fixed = {"table_column": Column(no_wrap=True)}
        self.progress = Progress(TextColumn("{task.description}", table_column=Column(
                                     ratio=1, no_wrap=True, overflow="ellipsis")),
                                 BarColumn(bar_width=BAR_WIDTH), DownloadColumn(**fixed),
                                 TransferSpeedColumn(**fixed), TimeRemainingColumn(**fixed),
                                 console=Console(stderr=True), transient=True, expand=True)
        self.task: Optional[Any] = None
        self.label = ""

    def __enter__(self) -> "RichProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def file_started(self, job: str, path: str, total: int, resumed_from: int) -> None:
        from rich.markup import escape

        text = f"{job[:12]} {show_path(path)}"
        self.label = escape(text)  # '[br].pt' is a name, not markup
        desc = fit_label(text + (" (resume)" if resumed_from else ""),
                         self.progress.console.width - FIGURES_WIDTH)
        self.task = self.progress.add_task(escape(desc), total=total, completed=resumed_from)

    def file_progress(self, pos: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=pos)

    def file_done(self, ok: bool) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.progress.console.print(("[green]verified[/] " if ok else "[red]MISMATCH[/] ") + self.label,
                                        markup=True, highlight=False)
            self.task = None

    def note(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)


class Notes:
    """No bars (not a terminal, or --json): only the engine's notes, one line each on stderr.
    It spells out ``sync.engine.NullProgress`` rather than subclassing it: importing the engine
    here would cost every ``gpurun pull --help`` ~35 ms (the engine is imported when pull runs)."""

    def file_started(self, job: str, path: str, total: int, resumed_from: int) -> None:
        pass

    def file_progress(self, pos: int) -> None:
        pass

    def file_done(self, ok: bool) -> None:
        pass

    def note(self, text: str) -> None:
        click.echo(text, err=True)


def _echo_problems(j: dict) -> None:
    """What went wrong with one job's files, one line each (names as ``show_path`` prints
    them, so a newline in a file name cannot break or forge a line)."""
    refused = set(j.get("refused") or [])
    for path in sorted(refused):
        click.echo(f"    warning: refused {show_path(path)}: it would land outside the job folder; "
                   "the job's other files were pulled", err=True)
    failed = [f for f in j["failed"] if f["path"] not in refused]
    for f in failed[:5]:
        click.echo(f"    failed {show_path(f['path'])}: {f['reason']}", err=True)
    if len(failed) > 5:
        click.echo(f"    ... and {len(failed) - 5} more (see --json)", err=True)
    if j.get("repaired"):
        names = ", ".join(show_path(p) for p in j["repaired"][:3])
        click.echo(f"    re-pulled {len(j['repaired'])} file(s) whose copy at home had changed since it "
                   f"was verified: {names}", err=True)


def _echo_refusals(summary: dict) -> None:
    """With --json stdout is the document; refusals still warn on stderr."""
    for j in summary["jobs"]:
        if j.get("refused") or j.get("repaired"):
            _echo_problems(j)


def _echo_pass(summary: dict) -> None:
    stamp = time.strftime("%H:%M:%S")
    if summary.get("error"):
        click.echo(f"[{stamp}] {summary['host']}: link problem, retrying next round: {summary['error']}", err=True)
        return
    for j in summary["jobs"]:
        flag = "verified" if j["verified"] else "NOT verified"
        extra = f", {j['pending']} still being written" if j["pending"] else ""
        fails = f", {len(j['failed'])} failed" if j["failed"] else ""
        click.echo(f"[{stamp}] {j.get('name') or j['job']} ({j['state']}): {len(j['pulled'])} pulled, "
                   f"{j['skipped']} already home{fails}{extra} -> {flag}  {j['dir']}", err=True)
        _echo_problems(j)
    state = "queue done, everything verified" if summary["done"] else "not done yet"
    click.echo(f"[{stamp}] {summary['host']} via {summary.get('method', '?')}: {state}", err=True)


def _pull_fleet(fleet: str, *, jobs: tuple[str, ...], dest: Optional[str], loop: bool, interval: Optional[float],
                use_s3: bool, rehash: bool, as_json: bool) -> None:
    """``pull --fleet``: every member into DEST/HOST/...; a member that fails is reported and
    the others go on (exit 1 at the end); ``--loop`` rebalances the fleet each round."""
    from orchestrator.cli.render import on_interrupt
    from orchestrator.core.fleet_views import Balancer, members, pull_fleet

    names = members(fleet, lambda w: click.echo(f"gpurun: warning: {w}", err=True))
    on_interrupt(f"pull stopped: files verified so far are home and a partial file resumes on the next pull; "
                 f"jobs keep running on the members of {fleet} (see `gpurun queue status --fleet {fleet}`)")

    def each(summary: dict) -> None:
        if summary.get("error"):
            click.echo(f"[{time.strftime('%H:%M:%S')}] {summary['host']}: pull failed: {summary['error']}"
                       + ("; trying again next round" if loop else ""), err=True)
        elif summary.get("absent"):  # --job names a job another member holds
            if not as_json:
                click.echo(f"[{time.strftime('%H:%M:%S')}] {summary['host']}: none of the named jobs is here", err=True)
        elif as_json:
            _echo_refusals(summary)
        else:
            _echo_pass(summary)

    def moved(lines: list[str]) -> None:
        for line in lines:
            click.echo(f"[{time.strftime('%H:%M:%S')}] {line}", err=True)

    bars = RichProgress() if not as_json and sys.stderr.isatty() else None
    kwargs = dict(jobs=list(jobs) or None, dest=dest, loop=loop, interval=interval, use_s3=use_s3, rehash=rehash,
                  on_pass=each, balance=Balancer(names) if loop else None, on_moves=moved)
    if bars is not None:  # bars draw one file at a time: members one after the other
        with bars:
            res = pull_fleet(names, progress=bars, **kwargs)
    else:
        res = pull_fleet(names, progress=Notes(), parallel=True, **kwargs)
    if as_json:
        click.echo(json.dumps({"fleet": fleet, **res}, indent=1, sort_keys=True))
    failed = [h["host"] for h in res["hosts"] if h.get("error") or (not h["done"] and
                                                                     any(j["failed"] for j in h["jobs"]))]
    if failed:
        click.echo(f"gpurun: pull --fleet {fleet}: {len(failed)} member(s) not pulled: {', '.join(failed)}", err=True)
        sys.exit(1)


@click.command("pull")
@host_option(help="Host from the inventory (default: $GPURUN_HOST or local).")
@click.option("--fleet", default=None, metavar="NAME",
              help="Pull every member of fleet NAME (each into DEST/HOST/...); with --loop, also rebalance "
                   "the fleet's queued jobs each round.")
@click.option("--job", "-j", "jobs", multiple=True, help="Only this job (id, name or number); repeatable.")
@click.option("--dest", default=None, help="Local destination (default: pull.dest, else artifacts/ in gpurun's data dir).")
@click.option("--loop", is_flag=True, help="Repeat until the queue is done and everything is home.")
@click.option("--interval", type=seconds(min=1), default=None,
              help="Seconds between passes with --loop (default: pull.interval_s or 60).")
@click.option("--s3", "use_s3", is_flag=True, help="Also push verified files to the configured S3 bucket.")
@click.option("--verify", "rehash", is_flag=True,
              help="Re-read every local copy now; re-pull any that changed (each pull also re-reads the "
                   "1/N checked longest ago: pull.reverify, default 10).")
@click.option("--json", "as_json", is_flag=True, help="Print the last pass as JSON (no progress bars).")
def pull(host: Optional[str], fleet: Optional[str], jobs: tuple[str, ...], dest: Optional[str], loop: bool,
         interval: Optional[float], use_s3: bool, rehash: bool, as_json: bool) -> None:
    """Bring a host's artifacts home, verified.

    Each file is staged under .gpurun-partial/, checked against the host's SHA-256, then
    renamed; an interrupted pull resumes. Remote files are never deleted. Files land in
    DEST/HOST/JOB_ID/ next to PULL_VERIFIED.json. With --fleet, every member in turn; one that
    fails is reported and the others still pulled (exit 1).
    """
    if fleet is not None:
        if host:
            from orchestrator.errors import BadInput
            raise BadInput("--fleet names the hosts itself: drop --host", f"e.g. `gpurun pull --fleet {fleet}`")
        _pull_fleet(fleet, jobs=jobs, dest=dest, loop=loop, interval=interval, use_s3=use_s3, rehash=rehash,
                    as_json=as_json)
        return
    from orchestrator.cli.render import on_interrupt
    from orchestrator.core.hosts import resolve
    from orchestrator.core.pull import pull as run_pull

    name = resolve(host)["name"]
    on_interrupt(f"pull stopped: files verified so far are home and a partial file resumes on the next "
                 f"pull; jobs keep running on {name} (see `gpurun queue status --host {name}`)")
    show = not as_json and sys.stderr.isatty()
    bars = RichProgress() if show else None
    kwargs = dict(jobs=list(jobs) or None, dest=dest, loop=loop, interval=interval, use_s3=use_s3,
                  rehash=rehash, on_pass=_echo_refusals if as_json else _echo_pass)
    if bars is not None:
        with bars:
            summary = run_pull(host, progress=bars, **kwargs)
    else:
        summary = run_pull(host, progress=Notes(), **kwargs)
    if as_json:
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
    if not summary["done"] and any(j["failed"] for j in summary["jobs"]):
        sys.exit(1)
