"""The rule on held-out quality metrics that fall to exactly zero: a detector whose mAP, precision
and recall read 0 after it had learned, a translator whose BLEU went to 0.

Same contract as ``rules.py``. A metric that was 0 from its first eval says nothing here: a
detector trained from scratch prints P 0, R 0, mAP 0 for its first epochs, and a healthy run
cannot be told from a broken one by that alone. Only a fall from a level the run had reached is
judged, and never on one metric's one eval (a rare class can score 0 once).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from orchestrator.quality import hints as H
from orchestrator.quality.roles import is_quality_metric
from orchestrator.quality.rules import Finding, _num, _r, finding
from orchestrator.quality.series import Run, isfinite

# the level (as a fraction: a metric printed in percent is divided by 100) a metric must have
# reached before its fall to 0 is a collapse: 0.1 mAP is a detector that finds things
FELL_FROM = 0.1
ZERO_EVALS = 2  # one metric at 0 on this many evals in a row, or two metrics at 0 on one


def metric_zero(run: Run, opts: dict) -> List[Finding]:
    """STOP when held-out quality metrics that had reached ``FELL_FROM`` read exactly 0 now: two
    of them at the same eval (P, R and mAP together: the model predicts nothing), or one of them
    on ``ZERO_EVALS`` evals in a row. One metric at 0 once is a warning."""
    fallen: Dict[str, Tuple[int, float, float]] = {}
    for name in run.series:  # names first: on a cut run (``series_cut``) a series read is a copy
        if not is_quality_metric(name):
            continue
        s = run.series[name]
        n = len(s)
        if n < 2 or s.values[-1] != 0.0:
            continue
        k = 0
        while k < n and s.values[n - 1 - k] == 0.0:
            k += 1
        before = [v for v in s.values[max(0, n - k - 200):n - k] if isfinite(v)]
        if not before:
            continue
        best = max(before)
        scale = 100.0 if best > 1.0 else 1.0  # a percent (mAP 45.2) or a fraction (0.452)
        if best / scale >= FELL_FROM:
            fallen[name] = (k, s.steps[n - k], best)
    if not fallen:
        return []
    last = {run.series[n].steps[-1] for n in fallen}
    together = len(fallen) >= 2 and len(last) == 1
    stays = max(k for k, _, _ in fallen.values()) >= ZERO_EVALS
    onset = min(at for _, at, _ in fallen.values())
    names = sorted(fallen)
    ev = {"metrics": names[:6], "best_before": {n: _r(fallen[n][2]) for n in names[:6]},
          "zero_evals": max(k for k, _, _ in fallen.values()), "onset_step": _num(onset)}
    return [finding("metric_zero", "stop" if together or stays else "warn", onset, ev, H.METRIC_ZERO, names[0])]


# the eval loss identical to its last printed digit on this many evals in a row, while the train
# loss moves: the model being evaluated never changes (weights not updated, a stale checkpoint
# evaluated, the eval set or model cached). 4 digits at least: a "0.18" can repeat on its own.
EVAL_FROZEN_EVALS, EVAL_FROZEN_DIGITS = 8, 4


def eval_frozen(run: Run, opts: dict) -> List[Finding]:
    """STOP when the eval (or val) loss read the same ``EVAL_FROZEN_DIGITS``-digit value on its
    last ``EVAL_FROZEN_EVALS`` evals while the train loss took other values meanwhile, and the
    LR is not down to a thousandth of its peak (a schedule's annealed tail stops the weights)."""
    ev = run.get("eval_loss") or run.get("val_loss")
    if ev is None or len(ev) < EVAL_FROZEN_EVALS:
        return []
    last = ev.values[-1]
    if not (isfinite(last) and last > 0) or any(v != last for v in ev.values[-EVAL_FROZEN_EVALS:]):
        return []
    if len(("%.6g" % last).replace(".", "").lstrip("0")) < EVAL_FROZEN_DIGITS:
        return []
    since = ev.steps[-EVAL_FROZEN_EVALS]
    train = run.get("loss")
    if train is None or ev is train:
        return []
    moved = {v for v, st in zip(train.values[-500:], train.steps[-500:]) if st >= since and isfinite(v)}
    if len(moved) < 2:
        return []  # the train loss is frozen too: the frozen rule's, on the train loss
    lr = run.get("lr")
    if lr is not None and len(lr) >= 2:
        peak = max((v for v in lr.values if isfinite(v)), default=0.0)
        if peak > 0 and lr.values[-1] < 1e-3 * peak:
            return []
    return [finding("eval_frozen", "stop", since, {"series": ev.name, "value": _r(last), "equal_evals": EVAL_FROZEN_EVALS,
                                                   "train_values_meanwhile": len(moved)}, H.EVAL_FROZEN, ev.name)]
