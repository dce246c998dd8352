"""What a run's other series say of its loss. Of a loss gone NaN or Inf (``rules.nonfinite_loss``):
a held-out quality metric that still works (it moves, holds near its best, improves after the
NaN), a train loss finite all the while. NaN weights score one constant output, and a step the
scaler skipped leaves them unchanged: neither moves a metric, so a metric that moves says the NaN
is in the loss's own computation (an fp16 eval, an empty batch, a logging mean), not in the model.
Of a loss at an absurd scale (``rules_level.absurd_loss``): an accuracy that never rose.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Optional

from orchestrator.quality.roles import as_fraction, is_accuracy, is_quality_metric
from orchestrator.quality.series import Run, Series, isfinite


def finite_since(train: Optional[Series], step: float) -> bool:
    """The train loss logged since ``step`` (once at least), every value finite."""
    if train is None or not len(train):
        return False
    i = bisect_left(train.steps, step)
    vals = train.values[i:]
    return len(vals) > 0 and all(isfinite(v) for v in vals[-1000:])


def metric_holds(run: Run, train: Optional[Series]) -> Optional[str]:
    """A held-out quality metric whose latest eval is finite, at half its best or more and not
    one value throughout, beside a train loss whose latest log is finite: the model still
    predicts, only the held-out loss's own computation overflows (YOLO's val losses nan in its
    first epochs under AMP, mAP rising). A metric frozen at one value proves nothing (TextGCN's
    val_acc 0.19512 on every epoch beside its nan val loss)."""
    if train is None or not len(train) or not isfinite(train.values[-1]):
        return None
    for name in run.series:
        if not is_quality_metric(name):
            continue
        vals = [v for v in run.series[name].values if isfinite(v)]
        if vals and vals[-1] > 0 and vals[-1] >= 0.5 * max(vals) and min(vals) != max(vals):
            return name
    return None


def has_quality_metric(run: Run) -> bool:
    return any(is_quality_metric(n) for n in run.series)


def metric_moves(run: Run) -> bool:
    """A held-out quality metric that has taken two values or more (its last 1000 evals)."""
    for name in run.series:
        if is_quality_metric(name):
            vals = [v for v in run.series[name].values[-1000:] if isfinite(v)]
            if vals and min(vals) != max(vals):
                return True
    return False


def metric_improved(run: Run, since: float) -> Optional[str]:
    """A held-out quality metric (accuracy, F1, mAP...) logged twice or more from ``since`` on, now
    1% or more above its value at ``since``: the model whose loss reads NaN still gets better."""
    for name in run.series:
        if not is_quality_metric(name):
            continue
        m = run.series[name]
        i = bisect_left(m.steps, since)
        vals = [v for v in m.values[i:] if isfinite(v)]
        if len(vals) >= 2 and vals[-1] > vals[0] * 1.01 and vals[0] > 0:
            return name
    return None


ACC_LOGS, ACC_ROSE = 5, 0.02  # an accuracy logged 5 times or more, never 2 points above its first


def accuracy_flat(run: Run) -> Optional[str]:
    """An accuracy (either side) logged ``ACC_LOGS`` times or more that never rose ``ACC_ROSE``
    above its first log: a classifier whose loss reads 1e9 and whose accuracy sits at 0.50 learns
    nothing, whatever its loss's scale (an unnormalised regression has no accuracy to ask)."""
    for name in run.series:
        if not is_accuracy(name):
            continue
        vals = [as_fraction(v) for v in run.series[name].values[-1000:] if isfinite(v)]
        if len(vals) >= ACC_LOGS and max(vals) <= vals[0] + ACC_ROSE:
            return name
    return None
