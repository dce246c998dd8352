"""``gpurun push``: send a project directory to a host (rsync, else tar or SFTP over SSH)."""

from __future__ import annotations

import click

from orchestrator.cli.options import host_option


@click.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=str))
@host_option(help="Host to push to (default: local, or $GPURUN_HOST).")
@click.option("--to", "remote_dir", default=None, metavar="PATH",
              help="Directory on the host (default: the host's workdir).")
@click.option("--dry-run", is_flag=True, help="Show what would be sent and where; send nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def push(directory: str, host: str | None, remote_dir: str | None, dry_run: bool,
         as_json: bool) -> None:
    """Send DIRECTORY (default: here) to a host and record its content hash there.

    Leaves out .git, __pycache__, *.pyc, virtualenvs, node_modules, wandb, what each
    .gitignore lists, and the patterns in DIRECTORY/.gpurunignore (one per line; name, dir/,
    /anchored, globs, ** across dirs). To the local host nothing is sent: its jobs run in the
    directory you submit them from.
    """
    from orchestrator.cli.render import emit_json
    from orchestrator.core.push import LOCAL_NOTE, push_tree

    out = push_tree(directory, host, remote_dir, dry_run=dry_run)
    if as_json:
        emit_json(out)
        return
    if out["method"] == "none" and out["remote_dir"] is None:   # the local host: nothing to send, and why
        click.echo(f"{out['host']}: nothing {'would be ' if dry_run else ''}sent: {LOCAL_NOTE}")
        return
    verb = "would send" if dry_run else f"sent ({out['method']})"
    click.echo(f"{out['host']}: {verb} {out['local_dir']} -> {out['remote_dir']}")
    what = "" if dry_run or out["method"] != "rsync" else " (changed files only)"
    click.echo(f"  files: {out['files']}  bytes: {out['bytes']:,}{what}  code: {out['code_hash'][:19]}")
    if out.get("fallback_reason"):
        click.echo(f"  note: {out['fallback_reason']}; used {out['method']}", err=True)
