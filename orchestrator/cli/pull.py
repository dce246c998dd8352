"""``gpurun pull``: bring a host's artifacts home, verified, with progress bars."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional

import click

from orchestrator.cli.options import host_option


class RichProgress:
    """Per-file bars with throughput on stderr; a file bar disappears when it is done."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.task: Optional[Any] = None
        self.label = ""

    def __enter__(self) -> "RichProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def file_started(self, job: str, path: str, total: int, resumed_from: int) -> None:
        self.label = f"{job[:12]} {path}"
        desc = self.label + (" (resume)" if resumed_from else "")
        self.task = self.progress.add_task(desc, total=total, completed=resumed_from)

    def file_progress(self, pos: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=pos)

    def file_done(self, ok: bool) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.progress.console.print(("[green]verified[/] " if ok else "[red]MISMATCH[/] ") + self.label)
            self.task = None


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
        for f in j["failed"][:5]:
            click.echo(f"    failed {f['path']}: {f['reason']}", err=True)
    state = "queue done, everything verified" if summary["done"] else "not done yet"
    click.echo(f"[{stamp}] {summary['host']} via {summary.get('method', '?')}: {state}", err=True)


@click.command("pull")
@host_option(help="Host from the inventory (default: $GPURUN_HOST or local).")
@click.option("--job", "-j", "jobs", multiple=True, help="Only this job (id, name or number); repeatable.")
@click.option("--dest", default=None, help="Local destination (default: pull.dest, else artifacts/ in gpurun's data dir).")
@click.option("--loop", is_flag=True, help="Repeat until the queue is done and everything is home.")
@click.option("--interval", type=click.FloatRange(min=1), default=None,
              help="Seconds between passes with --loop (default: pull.interval_s or 60).")
@click.option("--s3", "use_s3", is_flag=True, help="Also push verified files to the configured S3 bucket.")
@click.option("--verify", "rehash", is_flag=True, help="Re-read every local copy; re-pull any that changed.")
@click.option("--json", "as_json", is_flag=True, help="Print the last pass as JSON (no progress bars).")
def pull(host: Optional[str], jobs: tuple[str, ...], dest: Optional[str], loop: bool,
         interval: Optional[float], use_s3: bool, rehash: bool, as_json: bool) -> None:
    """Bring a host's artifacts home, verified.

    Each file is staged under .gpurun-partial/, checked against the host's SHA-256, then
    renamed; an interrupted pull resumes. Remote files are never deleted. Files land in
    DEST/HOST/JOB_ID/ next to PULL_VERIFIED.json.
    """
    from orchestrator.cli.render import on_interrupt
    from orchestrator.core.hosts import resolve
    from orchestrator.core.pull import pull as run_pull

    name = resolve(host)["name"]
    on_interrupt(f"pull stopped: files verified so far are home and a partial file resumes on the next "
                 f"pull; jobs keep running on {name} (see `gpurun queue status --host {name}`)")
    show = not as_json and sys.stderr.isatty()
    bars = RichProgress() if show else None
    kwargs = dict(jobs=list(jobs) or None, dest=dest, loop=loop, interval=interval, use_s3=use_s3,
                  rehash=rehash, on_pass=None if as_json else _echo_pass)
    if bars is not None:
        with bars:
            summary = run_pull(host, progress=bars, **kwargs)
    else:
        summary = run_pull(host, **kwargs)
    if as_json:
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
    if not summary["done"] and any(j["failed"] for j in summary["jobs"]):
        sys.exit(1)
