"""Use case ``check``: judge a training run from its metrics, here (a file, run dir, wandb
ref) or on a host (a queue job, judged by the agent next to its files), and the verdict's
exit code (0 CONTINUE, 10 WAIT, 11 STOP) for the CLI.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from orchestrator.errors import BadInput, Unsupported
from orchestrator.quality.judge import EXIT_CODES
from orchestrator.quality.series import Run

__all__ = ["EXIT_CODES", "Run", "check_local", "check_plot_path", "check_remote", "exit_code", "options",
           "write_plot"]


def exit_code(verdict: str) -> int:
    """The ``gpurun check`` contract: 0 CONTINUE, 10 WAIT, 11 STOP."""
    return EXIT_CODES[verdict]


def options(primary: Optional[str] = None, baseline: Optional[str] = None,
            reviewer: Optional[str] = None) -> dict[str, Any]:
    """The judge's options from ``--primary METRIC:min|max``, ``--baseline FILE`` and
    ``--reviewer CMD``. Raises BadInput naming the bad value."""
    from orchestrator.quality.options import load_baseline, parse_primary

    opts: dict[str, Any] = {}
    try:
        if primary:
            opts["primary"] = parse_primary(primary)
        if baseline:
            opts["baseline"] = load_baseline(baseline)
    except ValueError as exc:
        raise BadInput(str(exc), "see `gpurun check --help` for the accepted forms")
    if reviewer:
        opts["reviewer_command"] = reviewer
    return opts


def check_plot_path(plot: Optional[str]) -> None:
    """Refuse a plot path that cannot be written, before any work: BadInput for a wrong
    suffix or a missing directory, Unsupported for PNG without matplotlib."""
    if not plot:
        return
    low = plot.lower()
    if not low.endswith((".svg", ".png")):
        raise BadInput("--plot %s: the file must end in .svg or .png" % plot, "SVG needs nothing extra")
    if low.endswith(".png"):
        try:
            import matplotlib  # noqa: F401  # type: ignore
        except ImportError:
            raise Unsupported("--plot %s: PNG output needs matplotlib, which is not installed" % plot,
                              "pip install 'gpurun[plot]', or write --plot FILE.svg (no extra dependency)")
    d = os.path.dirname(os.path.abspath(plot))
    if not os.path.isdir(d):
        raise BadInput("--plot %s: directory %s does not exist" % (plot, d))


def check_local(source: str, opts: Optional[dict] = None, *, upto_step: Optional[float] = None,
                user_regex: Optional[str] = None) -> tuple[dict[str, Any], Run]:
    """Judge ``source`` on this machine; returns ``(verdict dict with sparkline, the run)``.
    Raises BadInput for a ``user_regex`` that does not compile."""
    from orchestrator.quality.judge import check_run
    from orchestrator.quality.plot import sparkline

    if user_regex:
        try:
            re.compile(user_regex)
        except re.error as exc:
            raise BadInput("--regex: %s" % exc, "use named groups: (?P<step>\\d+) ... (?P<loss>[\\d.eE+-]+|nan)")
    out, run = check_run(source, opts or {}, upto_step, user_regex)
    out["sparkline"] = sparkline(run.main_loss())
    return out, run


def check_remote(host: Optional[str], job: str, opts: Optional[dict] = None, *,
                 upto_step: Optional[float] = None) -> tuple[dict[str, Any], Run]:
    """Have the agent on ``host`` judge queue ``job`` (one round trip); returns ``(verdict
    dict, the loss series rebuilt from the reply, for the plot)``. ``upto_step`` set: judge
    only up to the job's last checkpoint (the resume gate's view)."""
    from orchestrator.core.session import open_session

    opts = opts or {}
    req = {"job": job, "primary": list(opts["primary"]) if opts.get("primary") else None,
           "baseline": {k: ({str(s): v for s, v in b.items()} if isinstance(b, dict) else b)
                        for k, b in (opts.get("baseline") or {}).items()} or None,
           "upto_checkpoint": upto_step is not None}
    with open_session(host) as s:
        out = dict(s.check(req))
    run = Run(out.get("source") or "")
    name = out.get("loss_series") or "loss"
    for a, b in out.pop("loss_points", None) or []:  # non-finite values travel as "nan"/"inf"
        run.add_record(float(a), [(name, float(b))])
    return out, run


def write_plot(path: str, run: Run, verdict: dict[str, Any]) -> str:
    """Write the loss plot with the verdict's anomalies marked (SVG, or PNG via matplotlib)."""
    from orchestrator.quality.plot import write_plot as _write

    return _write(path, run, verdict)
