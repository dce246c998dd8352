"""``gpurun check SOURCE``: judge a training run from its metrics (file, run dir, queue job).

``--final``: SOURCE is a run that has ended, so a last train loss of NaN/Inf is a STOP even
alone (a running job's check WAITs on one point); with ``--job`` the job's state decides.
Exit codes (contract): 0 CONTINUE, 10 WAIT, 11 STOP; 2 bad input (also a SOURCE that does not
exist, cannot be read or is in no known metrics format: code ``metrics_source``); 1 host/agent
failure.
``--json`` prints ``{"verdict", "reason", "findings": [{code, severity, step, series,
evidence, hint}], "source", "url", "format", "last_step", "points", "series", "resumed",
"restarts", "unreadable", "checker_version", "final", "sparkline"}`` (+ ``note``, ``plot``, ``reviewer``
and ``job`` when they apply: README, "Other `--json` contracts").
"""

from __future__ import annotations

import json
from typing import Any, Optional

import click

from orchestrator.cli.options import FiniteFloat, host_option, seconds
from orchestrator.errors import BadInput

SEV_STYLE = {"stop": "bold red", "warn": "yellow", "info": "dim"}
VERDICT_STYLE = {"STOP": "bold red", "WAIT": "bold yellow", "CONTINUE": "bold green"}


@click.command()
@click.argument("source", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON (documented keys).")
@click.option("--baseline", type=click.Path(dir_okay=False), help="Reference run metrics, or JSON {metric: value | {step: value}}.")
@click.option("--primary", metavar="METRIC:min|max", help="The metric that decides eval regressions, e.g. eval_wer:min.")
@click.option("--plot", metavar="FILE.svg|png", help="Write a loss plot with the anomaly marked.")
@host_option(help="Judge a queue job on this host (with --job).")
@click.option("--job", "job", help="Queue job name, id or number (with --host).")
@click.option("--regex", "user_regex", help="Your own line regex with named groups, e.g. '(?P<step>\\d+) (?P<loss>\\S+)'.")
@click.option("--upto-step", type=FiniteFloat(),
              help="Judge only the history up to this step (the resume gate's view).")
@click.option("--final", is_flag=True,
              help="SOURCE is a run that has ended: a last loss of NaN/Inf is STOP even alone "
                   "(--job: the job's state says).")
@click.option("--reviewer", help="Command that gets the JSON summary on stdin for ambiguous cases.")
@click.option("--reviewer-url", metavar="URL",
              help="OpenAI-compatible endpoint asked on ambiguous verdicts, e.g. https://api.openai.com/v1.")
@click.option("--reviewer-model", metavar="MODEL", help="The reviewer's model name (with --reviewer-url).")
@click.option("--reviewer-key-env", metavar="NAME",
              help="Variable holding the reviewer's key: here for SOURCE, the host's secret or environment with --job.")
@click.option("--reviewer-timeout", type=seconds(min=1), metavar="SECONDS",
              help="Give up on the reviewer after this long (then WAIT); default 60.")
@click.pass_context
def check(ctx: click.Context, source: Optional[str], as_json: bool, baseline: Optional[str], primary: Optional[str],
          plot: Optional[str], host: Optional[str], job: Optional[str], user_regex: Optional[str],
          upto_step: Optional[float], final: bool, reviewer: Optional[str], reviewer_url: Optional[str],
          reviewer_model: Optional[str], reviewer_key_env: Optional[str], reviewer_timeout: Optional[float]) -> None:
    """Judge a training run: STOP, CONTINUE or WAIT, with reasons and hints.

    SOURCE is a metrics file (JSONL, CSV, trainer_state.json, a Keras history JSON, a log, a
    TensorBoard event file, a .wandb file), a run directory, or wandb:ENTITY/PROJECT/RUN_ID. Exit
    code: 0 CONTINUE, 10 WAIT, 11 STOP.
    """
    from orchestrator.core import check as core
    core.check_plot_path(plot)
    opts = core.options(primary, baseline, reviewer, reviewer_url, reviewer_model, reviewer_key_env, reviewer_timeout)
    if final:
        opts["final"] = True  # judge's final word; a job's ended state sets it on the agent (--job)
    if job or host:
        if not job or source:
            raise BadInput("use either SOURCE, or --job NAME [--host H]",
                           "e.g. `gpurun check run/metrics.jsonl` or `gpurun check --job toy-diverge-lr3`")
        out, run = core.check_remote(host, job, opts, upto_step=upto_step)
    elif not source:
        raise BadInput("missing SOURCE (a metrics file or run dir) or --host H --job NAME",
                       "gpurun check runs/exp1/metrics.jsonl")
    else:
        out, run = core.check_local(source, opts, upto_step=upto_step, user_regex=user_regex)
    if plot:
        core.write_plot(plot, run, out)
        out["plot"] = plot
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
    else:
        _human(out)
    ctx.exit(core.exit_code(out["verdict"]))


def _hint_text(hint: str, con: Any) -> str:
    """A hint wrapped at the terminal's width under its label (``hint: `` is 14 cells in); piped,
    one whole line, so ``grep`` finds it."""
    from rich.markup import escape  # "[0, C)" in a hint is text, not markup
    if not con.is_terminal:
        return escape(hint)
    import textwrap
    lines = textwrap.wrap(hint, width=max(40, con.width - 14), break_long_words=False, break_on_hyphens=False)
    return escape(("\n" + " " * 14).join(lines))


def _human(out: dict[str, Any]) -> None:
    from rich.markup import escape

    from orchestrator.cli.render import console
    con = console()
    con.soft_wrap = True  # paths and hints stay whole lines: piped or in 80 columns, never cut mid-word
    head = "[%s]%s[/]  %s" % (VERDICT_STYLE[out["verdict"]], out["verdict"], out["reason"])
    con.print(head)
    src = out.get("source") or ""
    if out.get("job"):
        src = "job %s (%s) %s" % (out["job"]["name"], out["job"]["state"], src)
    con.print("[dim]source:[/] %s  [dim]format:[/] %s  [dim]last step:[/] %s  [dim]points:[/] %s%s"
              % (src, out.get("format") or "?", out.get("last_step"), out.get("points"),
                 "  [dim](resumed run)[/]" if out.get("resumed") else ""), markup=True)
    if out.get("url"):
        con.print("[dim]run:[/] %s" % out["url"], markup=True)
    if out.get("sparkline"):
        con.print("[dim]loss:[/] %s" % out["sparkline"])
    for p in out.get("unreadable") or []:
        con.print("[yellow]unreadable:[/] %s" % p)
    for f in out["findings"]:
        style = SEV_STYLE.get(str(f["severity"]), "")
        # which series, so a loss and a val loss NaN at one step read as two findings, not one twice
        con.print("  [%s]%-5s[/] %s at step %s%s" % (style, f["severity"], f["code"], f["step"],
                                                    " (%s)" % escape(str(f["series"])) if f.get("series") else ""))
        if f.get("hint") and f["severity"] != "info":
            con.print("        [dim]hint:[/] %s" % _hint_text(f["hint"], con))
    rev = out.get("reviewer")
    if rev:
        con.print("[dim]reviewer:[/] %s answered %s on %s%s" % (rev.get("model") or rev.get("kind"), rev.get("answer"),
                                                                rev.get("in_doubt"),
                                                                (" (%s)" % rev["note"]) if rev.get("note") else ""),
                  markup=True)
    if out.get("plot"):
        con.print("[dim]plot:[/] %s" % out["plot"])
