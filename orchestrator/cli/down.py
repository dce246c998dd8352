"""``gpurun down HOST``: the teardown gate (live, or from home records when the box cannot be
reached or its host key changed), then the meter-stop verb (or, with ``--destroy``, the
provider's destroy), then the record. A typed host name is read only from a terminal, or
given as ``--confirm-host`` (``core/teardown_destroy.typed_answer``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click

from orchestrator.cli.options import host_argument
from orchestrator.errors import GateRefused

if TYPE_CHECKING:
    from orchestrator.core.teardown import Assessment


def _show(lines: list[str], as_json: bool) -> None:
    if not as_json:
        for line in lines:
            click.echo(line)


def _headline(a: Assessment, host: str, out: Path) -> list[str]:
    lines = []
    from orchestrator.core.teardown_offline import host_key_changed
    if host_key_changed(a):
        lines.append(f"{host}: HOST KEY CHANGED: possible man-in-the-middle, or the box was re-provisioned; "
                     "gpurun will not talk to it and judges it as if it were unreachable.")
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


def _down_fleet(fleet: str, *, yes: bool, confirm_fleet: Optional[str], dry_run: bool, dest: Optional[str],
                as_json: bool) -> None:
    """``down --fleet``: the gate of ``down`` judged per member (``core/fleet_views.judge_members``),
    one line per member, then one confirmation for the members whose meter would stop, then each
    member's verb. A member whose results are not verified at home is refused, never stopped."""
    from contextlib import ExitStack

    from orchestrator.core import teardown as td
    from orchestrator.core import teardown_destroy as tdd
    from orchestrator.core.fleet_views import judge_members, members, outcome

    names = members(fleet, lambda w: click.echo(f"gpurun: warning: {w}", err=True))
    rows: list[dict] = []
    with ExitStack() as stack:
        gates = judge_members(stack, names, dest=dest, dry_run=dry_run)
        judged = [g for g in gates if g.error is None]
        passing = [g for g in judged if g.decision.step != td.REFUSE]
        # the members whose meter gpurun would stop: those are what a confirmation is about
        meters = [g for g in passing if not (g.target.verb.get("manual") or g.target.verb.get("no_meter"))]
        typed = [g for g in meters if g.decision.step == td.ASK_TYPED]  # unreachable: judged from home
        how: Optional[str] = None
        confirmed = True
        if meters and not dry_run:
            for g in meters:
                for w in g.decision.warnings:
                    click.echo(f"{g.host}: {w}", err=True)
            listed = ", ".join(f"{g.host} ({g.target.verb['verb']})" for g in meters)
            try:
                if typed or confirm_fleet is not None:
                    confirmed, how, refused = tdd.typed_answer(
                        fleet, f"Type the fleet name ({fleet}) to stop the meter on {listed}",
                        confirm_host=confirm_fleet, isatty=sys.stdin.isatty,
                        prompt=lambda q: click.prompt(q, default="", show_default=False, err=True))
                    if refused is not None:  # not a terminal and no --confirm-fleet: refused as such
                        confirmed = False
                        click.echo(f"gpurun: {refused.message}; hint: pass --confirm-fleet {fleet}", err=True)
                elif not yes:
                    confirmed = click.confirm(f"Stop the meter on {listed}?", default=False, err=True)
            except click.Abort:
                confirmed = False
        for g in gates:
            action, word, why, decision = None, "", "", "refused"
            if g.error is None and g.decision.step != td.REFUSE and not dry_run:
                if g in meters and not confirmed:
                    word, why, decision = "not stopped", "not confirmed; nothing was changed", "aborted"
                else:
                    try:
                        action = td.execute(g.session, g.target.verb, offline=g.assessment.offline,
                                            provider_state=g.assessment.provider_state)
                        decision = "proceeded"
                    except GateRefused as exc:
                        word, why = "refused", exc.message
            if not word:
                word, why = outcome(g, action)
                if dry_run:
                    decision = "dry_run"
            if g.assessment is not None:
                td.record_decision(g.assessment, g.target.verb, decision, without_artifacts=False, action=action,
                                   fleet=fleet, confirmation=how if g in meters else None)
            rows.append({"host": g.host, "outcome": word, "why": why, "decision": decision, "action": action,
                         "assessment": g.assessment.as_dict() if g.assessment is not None else None,
                         "error": g.error})
    if as_json:
        click.echo(json.dumps({"fleet": fleet, "dry_run": dry_run, "hosts": rows}, indent=1, sort_keys=True,
                              default=str))
    else:
        for r in rows:
            click.echo(f"{r['host']}: {r['outcome']}: {r['why']}")
    refused = [r["host"] for r in rows if r["outcome"] in ("refused", "not stopped")]  # a dry run's too
    if refused:
        raise GateRefused(f"down --fleet {fleet}: {len(refused)} of {len(rows)} member(s) not stopped: "
                          + ", ".join(refused),
                          f"pull their results first (`gpurun pull --fleet {fleet}`) or wait for their jobs; "
                          "`gpurun down HOST` says more about one member")


@click.command("down")
@host_argument(required=False)
@click.option("--fleet", default=None, metavar="NAME",
              help="Every member of fleet NAME: the gate judged per member, one line each (stopped / refused and "
                   "why / nothing to stop); exit 3 if any member is refused.")
@click.option("--confirm-fleet", default=None, metavar="NAME",
              help="With --fleet, for scripts: the typed confirmation, given explicitly (must be the fleet's name).")
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask before stopping the meter (the gate still applies; not enough when the box "
                   "is unreachable).")
@click.option("--without-artifacts", is_flag=True,
              help="Stop even though artifacts are not verified at home (asks you to type the host name).")
@click.option("--destroy", is_flag=True,
              help="Destroy the instance (provider API) instead of stopping it: its disk and everything on it "
                   "are deleted and the bill ends. Only once every result is verified at home; always asks for "
                   "the typed host name.")
@click.option("--confirm-host", default=None, metavar="NAME",
              help="For scripts: the typed confirmation, given explicitly (must be HOST). Without it the host "
                   "name must be typed at a terminal; piped input is refused.")
@click.option("--dry-run", is_flag=True, help="Check the gate and say what would happen; the box and its meter are "
              "left alone (a copy at home that changed since it was verified is still re-pulled).")
@click.option("--dest", default=None, help="Where `gpurun pull` put the artifacts (default: where the last pull "
              "of this host went, else pull.dest, else the data dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
def down(host: Optional[str], fleet: Optional[str], confirm_fleet: Optional[str], yes: bool,
         without_artifacts: bool, destroy: bool, confirm_host: Optional[str], dry_run: bool, dest: Optional[str],
         as_json: bool) -> None:
    """Stop the meter on HOST, only after every job ended and every artifact is verified at home.

    Prints what the provider's verb does (reversible or not, what is deleted, what still
    bills), runs it where gpurun can, or says what to click. When the box cannot be reached,
    the gate judges from the last verified pulls at home and always asks you to type the host
    name. Every decision is appended to teardown.jsonl in gpurun's data dir. Exit 3 when the
    gate refuses. Artifacts are checked where the last `gpurun pull` of HOST put them, from
    any directory (--dest to check elsewhere). For a box gpurun cannot stop (generic-ssh) it
    reports, asks nothing, and says what you must do.
    """
    if fleet is not None:
        from orchestrator.errors import BadInput
        if host or destroy or without_artifacts or confirm_host:
            raise BadInput("--fleet takes no HOST, --destroy, --without-artifacts or --confirm-host",
                           "a fleet's meters stop only once each member's results are verified at home; "
                           "for one host's exceptions use `gpurun down HOST ...`")
        _down_fleet(fleet, yes=yes, confirm_fleet=confirm_fleet, dry_run=dry_run, dest=dest, as_json=as_json)
        return
    if confirm_fleet is not None:
        raise click.UsageError("--confirm-fleet goes with --fleet NAME")
    if host is None:
        raise click.UsageError("name the host: HOST or --host NAME (see `gpurun host ls`), or --fleet NAME")
    from orchestrator.core import teardown as td
    from orchestrator.core import teardown_destroy as tdd
    from orchestrator.core.session import open_session
    from orchestrator.core.teardown_offline import assess_gate, host_key_changed

    t = td.target(host, dest)
    verb, out = (tdd.describe_destroy(t.entry) if destroy else t.verb), t.dest
    how: dict[str, Optional[str]] = {"confirmation": None}
    with open_session(host) as session:
        a = assess_gate(session, t)
        base = {"host": host, "profile": verb["profile"], "verb": verb, "assessment": a.as_dict(),
                "without_artifacts": without_artifacts, "offline": a.offline, "destroy": destroy,
                "host_key_changed": host_key_changed(a)}
        _show(_headline(a, host, out) + (tdd.plain_lines(verb) if destroy else td.plain_lines(verb)), as_json)

        def finish(decision: str, err: Optional[GateRefused] = None, **more: object) -> None:
            td.record_decision(a, verb, decision, without_artifacts=without_artifacts,
                               action=more.get("action"), destroy=destroy,  # type: ignore[arg-type]
                               confirmation=how["confirmation"], host_key_changed=base["host_key_changed"])
            if as_json:
                click.echo(json.dumps(dict(base, decision=decision, **more), indent=1, sort_keys=True,
                                      default=str))
            if err is not None:
                raise err

        def ask(question: str, typed: bool) -> bool:
            """A typed host name (from a terminal, or --confirm-host) or a y/N; end of input is a
            no, recorded like one. Piped input never counts as a typed name."""
            try:
                if typed:
                    okd, how["confirmation"], refused = tdd.typed_answer(
                        host, question, confirm_host=confirm_host, isatty=sys.stdin.isatty,
                        prompt=lambda q: click.prompt(q, default="", show_default=False, err=True))
                    if refused is not None:
                        finish("aborted", refused)
                    return okd
                return click.confirm(question, default=False, err=True)
            except click.Abort:
                return False

        d = (tdd.decide_destroy(a, verb, dry_run=dry_run) if destroy else
             td.decide(a, verb, yes=yes, without_artifacts=without_artifacts, dry_run=dry_run))
        if d.step == td.REFUSE:
            if not as_json:
                # core.teardown has loaded core.pull already: no import cost
                from orchestrator.core.pull import show_path
                for m in d.blocking:  # a file name may hold a newline or an escape: one line each
                    click.echo(f"  blocking: {show_path(m)}", err=True)
            finish(d.record_as or "refused", d.error)
        if d.step == td.DRY_RUN:
            _show([d.message or ""], as_json)
            finish("dry_run")
            return
        for w in d.warnings:
            click.echo(w, err=True)
        if d.step in (td.ASK_TYPED, td.ASK):
            if not ask(d.question or "", typed=d.step == td.ASK_TYPED):
                finish("aborted", d.error)
        action = (tdd.execute_destroy(verb, host, offline=a.offline, provider_state=a.provider_state) if destroy
                  else td.execute(session, verb, offline=a.offline, provider_state=a.provider_state))
        # a box gpurun cannot stop gets the plain sentence, not a "how: manual" label
        _show([f"{host}: {action['detail']}" if verb["manual"] else f"{host}: {action['how']}: {action['detail']}"],
              as_json)
        finish("proceeded", action=action)


def _when(ts: Optional[float]) -> str:
    from orchestrator.core.teardown import when
    return when(ts)
