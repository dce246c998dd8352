"""``gpurun down HOST``: the teardown gate (live, or from home records when the box cannot be
reached), then the meter-stop verb, then the record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click

from orchestrator.errors import GateRefused


def _show(lines: list[str], as_json: bool) -> None:
    if not as_json:
        for line in lines:
            click.echo(line)


def _assess(session: Any, entry: dict, out: Path, cfg: dict) -> Any:
    """The live gate; when the agent cannot be reached (and only then), the offline one.
    A changed host key is not "unreachable": it may be someone else's box, so it stays an error."""
    from orchestrator.core import teardown as td
    from orchestrator.core import teardown_offline as tdo
    from orchestrator.errors import HostKeyError, TransportError
    from orchestrator.sync.keep import KeepPolicy

    try:
        return td.assess(session, out, KeepPolicy.from_config(cfg))
    except HostKeyError:
        raise
    except TransportError as exc:   # ConnectError included: no manifest could be read
        state, note = tdo.provider_state(entry)
        return tdo.assess_offline(entry, out, str(exc), state, note)


def _headline(a: Any, host: str, out: Path) -> list[str]:
    lines = []
    if a.offline:
        lines += [f"{host}: box unreachable: judged from the last verified pull on {_when(a.last_pull_at)}; "
                  "files written on the box after that pull would be lost." if a.last_pull_at else
                  f"{host}: box unreachable: judged from home records, which hold no verified pull; "
                  "everything on the box would be lost.",
                  f"  why: {a.unreachable}",
                  f"  provider says: {a.provider_state or 'unknown'}; job list last refreshed "
                  f"{_when(a.snapshot_at)}"]
    lines.append(f"{host}: {len(a.jobs)} job(s), {a.files} artifact file(s) verified at home "
                 f"({a.bytes / 1e9:.2f} GB) in {out}")
    for row in a.jobs:
        pulled = f", last verified pull {_when(row['pulled_at'])}" if a.offline and row.get("pulled_at") else ""
        lines.append(f"  {row['name'] or row['id']}: {row['state']}, {row['files']} file(s), "
                     f"{row['missing']} missing{pulled} -> {row['verdict']}")
    lines += [f"  note: {n}" for n in a.notes]
    if a.superseded:
        lines.append(f"  note: {len(a.superseded)} older checkpoint file(s) were not kept "
                     "(pull.keep_latest) and will be lost with the box")
    return lines


@click.command("down")
@click.argument("host")
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask before stopping the meter (the gate still applies; not enough when the box "
                   "is unreachable).")
@click.option("--without-artifacts", is_flag=True,
              help="Stop even though artifacts are not verified at home (asks you to type the host name).")
@click.option("--dry-run", is_flag=True, help="Check the gate and say what would happen; change nothing.")
@click.option("--dest", default=None, help="Where `gpurun pull` put the artifacts (default: pull.dest).")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
def down(host: str, yes: bool, without_artifacts: bool, dry_run: bool, dest: Optional[str],
         as_json: bool) -> None:
    """Stop the meter on HOST, only after every job ended and every artifact is verified at home.

    Prints what the provider's verb does (reversible or not, what is deleted, what still
    bills), runs it where gpurun can, or says what to click. When the box cannot be reached,
    the gate judges from the last verified pulls at home and always asks you to type the host
    name. Every decision is appended to teardown.jsonl in gpurun's data dir. Exit 3 when the
    gate refuses.
    """
    from orchestrator.core import teardown as td
    from orchestrator.core.pull import DEFAULT_DEST, pull_config
    from orchestrator.core.session import open_session
    from orchestrator.hosts import get_host
    from orchestrator.profiles import load_profile

    entry = get_host(host)
    verb = td.describe_verb(load_profile(entry.get("profile") or "local"))
    cfg, _ = pull_config()
    out = Path(dest or cfg.get("dest") or DEFAULT_DEST).expanduser().resolve()
    with open_session(host) as session:
        a = _assess(session, entry, out, cfg)
        base = {"host": host, "profile": verb["profile"], "verb": verb, "assessment": a.as_dict(),
                "without_artifacts": without_artifacts, "offline": a.offline}
        _show(_headline(a, host, out) + td.plain_lines(verb), as_json)

        def finish(decision: str, err: Optional[GateRefused] = None, **more: object) -> None:
            doc = dict(base, decision=decision, **more)
            if decision != "dry_run":
                td.record({k: doc[k] for k in ("host", "profile", "decision", "without_artifacts", "offline")}
                          | {"verb": verb["verb"], "blockers": a.blockers, "missing": a.missing[:50],
                             "verified_files": a.files, "verified_bytes": a.bytes, "basis": a.basis,
                             "last_pull_at": a.last_pull_at, "provider_state": a.provider_state,
                             "action": more.get("action")})
            if as_json:
                click.echo(json.dumps(doc, indent=1, sort_keys=True, default=str))
            if err is not None:
                raise err

        def ask(question: str, typed: bool) -> bool:
            """A typed host name or a y/N; end of input is a no, recorded like one."""
            try:
                if typed:
                    return click.prompt(question, default="", show_default=False, err=True).strip() == host
                return click.confirm(question, default=False, err=True)
            except click.Abort:
                return False

        if a.blockers or (a.missing and not without_artifacts):
            if not as_json:
                for m in (a.blockers + a.missing)[:10]:
                    click.echo(f"  blocking: {m}", err=True)
            finish("dry_run" if dry_run else "refused", td.refusal(a))
        if dry_run:
            more = " once you type the host name (the box is unreachable)" if a.offline or a.missing else ""
            _show([f"dry run: the gate would let `{verb['verb']}` proceed{more}; nothing was changed."], as_json)
            finish("dry_run")
            return
        if a.missing or a.offline:
            if a.missing:
                click.echo(f"{len(a.missing)} artifact(s) are NOT safe at home and will be lost, e.g. {a.missing[0]}",
                           err=True)
            if a.offline:
                since = f"after {_when(a.last_pull_at)}" if a.last_pull_at else "(nothing was ever verified at home)"
                click.echo(f"{host} cannot be reached: anything it wrote {since} is unknown and will be lost.",
                           err=True)
            if not ask(f"Type the host name ({host}) to stop the meter anyway", typed=True):
                finish("aborted", GateRefused(
                    "confirmation did not match the host name; nothing was changed",
                    "type the host name exactly (--yes is not enough while the box is unreachable)"
                    if a.offline else "type the host name exactly, or pull the artifacts first"))
        elif not yes and not verb["no_meter"]:
            rev = "IRREVERSIBLE" if verb["irreversible"] else "reversible"
            if not ask(f"Stop the meter on {host} with '{verb['verb']}' ({rev})?", typed=False):
                finish("aborted", GateRefused("not confirmed; nothing was changed",
                                              "re-run and answer y, or pass --yes"))
        action = td.execute(session, verb, offline=a.offline, provider_state=a.provider_state)
        _show([f"{host}: {action['how']}: {action['detail']}"], as_json)
        finish("proceeded", action=action)


def _when(ts: Optional[float]) -> str:
    from orchestrator.core.teardown_offline import when
    return when(ts)
