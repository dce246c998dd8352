"""``gpurun down HOST``: the teardown gate, then the meter-stop verb, then the record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from orchestrator.errors import GateRefused


def _show(lines: list[str], as_json: bool) -> None:
    if not as_json:
        for line in lines:
            click.echo(line)


@click.command("down")
@click.argument("host")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before stopping the meter (the gate still applies).")
@click.option("--without-artifacts", is_flag=True,
              help="Stop even though artifacts are not verified at home (asks you to type the host name).")
@click.option("--dry-run", is_flag=True, help="Check the gate and say what would happen; change nothing.")
@click.option("--dest", default=None, help="Where `gpurun pull` put the artifacts (default: pull.dest).")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
def down(host: str, yes: bool, without_artifacts: bool, dry_run: bool, dest: Optional[str],
         as_json: bool) -> None:
    """Stop the meter on HOST, only after every job ended and every artifact is verified at home.

    Prints what the provider's verb does (reversible or not, what is deleted, what still
    bills), runs it where gpurun can, or says what to click. Every decision is appended to
    teardown.jsonl in gpurun's data dir. Exit 3 when the gate refuses.
    """
    from orchestrator.core import teardown as td
    from orchestrator.core.pull import DEFAULT_DEST, pull_config
    from orchestrator.core.session import open_session
    from orchestrator.hosts import get_host
    from orchestrator.profiles import load_profile
    from orchestrator.sync.keep import KeepPolicy

    entry = get_host(host)
    verb = td.describe_verb(load_profile(entry.get("profile") or "local"))
    cfg, _ = pull_config()
    out = Path(dest or cfg.get("dest") or DEFAULT_DEST).expanduser().resolve()
    with open_session(host) as session:
        a = td.assess(session, out, KeepPolicy.from_config(cfg))
        base = {"host": host, "profile": verb["profile"], "verb": verb, "assessment": a.as_dict(),
                "without_artifacts": without_artifacts}
        _show([f"{host}: {len(a.jobs)} job(s), {a.files} artifact file(s) verified at home "
               f"({a.bytes / 1e9:.2f} GB) in {out}"], as_json)
        for row in a.jobs:
            _show([f"  {row['name'] or row['id']}: {row['state']}, {row['files']} file(s), "
                   f"{row['missing']} missing -> {row['verdict']}"], as_json)
        if a.superseded:
            _show([f"  note: {len(a.superseded)} older checkpoint file(s) were not kept "
                   "(pull.keep_latest) and will be lost with the box"], as_json)
        _show(td.plain_lines(verb), as_json)

        def finish(decision: str, err: Optional[GateRefused] = None, **more: object) -> None:
            doc = dict(base, decision=decision, **more)
            if decision != "dry_run":
                td.record({k: doc[k] for k in ("host", "profile", "decision", "without_artifacts")}
                          | {"verb": verb["verb"], "blockers": a.blockers, "missing": a.missing[:50],
                             "verified_files": a.files, "verified_bytes": a.bytes,
                             "action": more.get("action")})
            if as_json:
                click.echo(json.dumps(doc, indent=1, sort_keys=True, default=str))
            if err is not None:
                raise err

        if a.blockers or (a.missing and not without_artifacts):
            if not as_json:
                for m in (a.blockers + a.missing)[:10]:
                    click.echo(f"  blocking: {m}", err=True)
            finish("dry_run" if dry_run else "refused", td.refusal(a))
        if dry_run:
            _show([f"dry run: the gate would let `{verb['verb']}` proceed; nothing was changed."], as_json)
            finish("dry_run")
            return
        if a.missing:
            click.echo(f"{len(a.missing)} artifact(s) are NOT safe at home and will be lost, e.g. {a.missing[0]}",
                       err=True)
            typed = click.prompt(f"Type the host name ({host}) to stop the meter anyway", default="",
                                 show_default=False, err=True)
            if typed.strip() != host:
                finish("aborted", GateRefused("confirmation did not match the host name; nothing was changed",
                                              "type the host name exactly, or pull the artifacts first"))
        elif not yes and not verb["no_meter"]:
            rev = "IRREVERSIBLE" if verb["irreversible"] else "reversible"
            if not click.confirm(f"Stop the meter on {host} with '{verb['verb']}' ({rev})?", default=False,
                                 err=True):
                finish("aborted", GateRefused("not confirmed; nothing was changed", "re-run and answer y, or pass --yes"))
        action = td.execute(session, verb)
        _show([f"{host}: {action['how']}: {action['detail']}"], as_json)
        finish("proceeded", action=action)
