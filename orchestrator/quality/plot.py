"""Pictures of a run: a terminal sparkline and an SVG (stdlib) or PNG (matplotlib) loss plot
with the anomaly marked.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple
from xml.sax.saxutils import escape

from orchestrator.quality.series import Run, Series, isfinite

BARS = "▁▂▃▄▅▆▇█"


def _points(s: Series, width: int) -> List[Tuple[float, float]]:
    """Down-sample to ``width`` buckets (mean of log values per bucket; NaN kept as NaN)."""
    n = len(s)
    if n == 0:
        return []
    per = max(1, -(-n // width))
    out = []
    values = s.values
    for i in range(0, n, per):
        vals = values[i:i + per]
        total = sum(vals)
        if total == total and total not in (math.inf, -math.inf):  # all finite: same sum as below
            out.append((s.steps[i], total / len(vals)))
            continue
        fin = [v for v in vals if isfinite(v)]
        if len(fin) < len(vals):
            out.append((s.steps[i], math.nan))
        elif fin:
            out.append((s.steps[i], sum(fin) / len(fin)))
    return out


def sparkline(s: Optional[Series], width: int = 60) -> str:
    if s is None or not len(s):
        return ""
    pts = _points(s, width)
    fin = [v for _, v in pts if isfinite(v)]
    if not fin:
        return "!" * len(pts)
    logy = min(fin) > 0 and max(fin) / min(fin) > 20
    tr = (lambda v: math.log(v)) if logy else (lambda v: v)
    lo, hi = tr(min(fin)), tr(max(fin))
    span = (hi - lo) or 1.0
    return "".join("!" if not isfinite(v) else BARS[min(7, int((tr(v) - lo) / span * 7.999))] for _, v in pts)


def write_plot(path: str, run: Run, verdict: dict) -> str:
    """Write ``path`` (.svg always works; .png needs matplotlib, the ``gpurun[plot]`` extra).
    Returns the path."""
    if path.lower().endswith(".png"):
        return _png(path, run, verdict)
    if not path.lower().endswith(".svg"):
        raise ValueError("plot file must end in .svg or .png")
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg(run, verdict))
    return path


def _marks(verdict: dict) -> List[Tuple[float, str]]:
    return [(float(f["step"]), str(f["code"])) for f in verdict.get("findings", [])
            if f.get("severity") in ("stop", "warn") and isinstance(f.get("step"), (int, float))]


def svg(run: Run, verdict: dict, w: int = 720, h: int = 300) -> str:
    s = run.main_loss()
    pad = 40
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h),
             '<rect width="100%" height="100%" fill="white"/>']
    title = "%s: %s" % (verdict.get("verdict", "?"), verdict.get("reason", ""))
    parts.append('<text x="%d" y="16">%s</text>' % (pad, escape(title[:110])))
    pts = _points(s, 600) if s is not None else []
    fin = [(x, y) for x, y in pts if isfinite(y)]
    if fin:
        xs = [x for x, _ in pts]
        x0, x1 = min(xs), max(xs) or 1.0
        ys = [y for _, y in fin]
        logy = min(ys) > 0
        tr = (lambda v: math.log(v)) if logy else (lambda v: v)
        lo, hi = tr(min(ys)), tr(max(ys))
        span, xspan = (hi - lo) or 1.0, (x1 - x0) or 1.0

        def X(x: float) -> float:
            return pad + (x - x0) / xspan * (w - 2 * pad)

        def Y(y: float) -> float:
            return h - pad - (tr(y) - lo) / span * (h - 2 * pad - 10)
        parts.append('<polyline fill="none" stroke="#1f77b4" stroke-width="1.2" points="%s"/>'
                     % " ".join("%.1f,%.1f" % (X(x), Y(y)) for x, y in fin))
        for x, y in pts:
            if not isfinite(y):
                parts.append('<circle cx="%.1f" cy="%d" r="3" fill="red"/>' % (X(x), pad + 8))
        for step, code in _marks(verdict):
            if x0 <= step <= x1 or step > x1:
                xx = X(min(step, x1))
                parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="red" stroke-dasharray="4,3"/>' % (xx, pad, xx, h - pad))
                parts.append('<text x="%.1f" y="%d" fill="red">%s @ %s</text>' % (xx + 3, pad + 22, escape(code), _fmt(step)))
        parts.append('<text x="%d" y="%d">step %s</text><text x="%d" y="%d" text-anchor="end">step %s</text>'
                     % (pad, h - 12, _fmt(x0), w - pad, h - 12, _fmt(x1)))
        parts.append('<text x="4" y="%d">%.4g</text><text x="4" y="%d">%.4g</text>'
                     % (pad + 12, max(ys), h - pad, min(ys)))
        parts.append('<text x="%d" y="%d" fill="#555">%s%s</text>' % (w // 2, h - 12, escape(s.name if s else ""),
                                                                      " (log scale)" if logy else ""))
    else:
        parts.append('<text x="%d" y="%d">no finite loss values</text>' % (pad, h // 2))
    parts.append("</svg>\n")
    return "\n".join(parts)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else "%.4g" % x


def _png(path: str, run: Run, verdict: dict) -> str:
    try:
        import matplotlib  # type: ignore
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore
    except ImportError:
        raise ImportError("PNG plots need matplotlib: pip install 'gpurun[plot]'; "
                          "or write --plot FILE.svg (no extra dependency)")
    s = run.main_loss()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    if s is not None:
        ax.plot(list(s.steps), [v if isfinite(v) else float("nan") for v in s.values], lw=0.8)
        if all(v > 0 for v in s.values if isfinite(v)):
            ax.set_yscale("log")
    for step, code in _marks(verdict):
        ax.axvline(step, color="red", ls="--")
        ax.text(step, ax.get_ylim()[1], code, color="red", fontsize=8, va="top")
    ax.set_title("%s: %s" % (verdict.get("verdict"), verdict.get("reason", ""))[:100], fontsize=9)
    ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
