"""Overfitting: the eval (or val) loss far above the best level it held, for several evals, while
the train loss falls and no held-out metric is any better. The model memorises its train set.

An eval loss is noisy (a small val set, a per-batch log) and may rise for reasons that are no
failure (an over-confident model whose accuracy or WER still improves: the eval-loss trap). So the
rise must clear the eval's own noise, a metric that held or improved vetoes, and an eval loss
logged per batch is judged one eval per step. Far above: 1.5x its best on 5 evals, 1.3x on the
last quarter, or a climb to 1.4x up on each of the last 5; an ended run's short log, up on every
eval since its best with a metric worse beside it (``_short``).

Same contract as ``rules.py``.
"""

from __future__ import annotations

import math
from typing import List, Optional

from orchestrator.quality import hints as H
from orchestrator.quality.rules import Finding, _num, _r, constant, finding, rises_at_end
from orchestrator.quality.rules_level import block_noise, metric_sign
from orchestrator.quality.series import Run, Series, isfinite
from orchestrator.quality.series_cut import per_step

# overfitting: the eval loss at OVERFIT_RATIO x its best (and 3 sigmas of its recent eval-to-eval
# noise) on its last OVERFIT_EVALS evals, the ratio the train-loss rules stop at
OVERFIT_RATIO, OVERFIT_EVALS = 1.5, 5
OVERFIT_SUSTAINED = 1.3  # ... or this ratio on the last quarter of the evals (5 at least)
OVERFIT_CLIMB, CLIMB_EVALS = 1.4, 5  # ... or a climb: each of the last 5 evals up, the last at 1.4x
SHORT_EVALS, SHORT_RISES = 4, 3  # a short log's climb: 4 evals at least, up on the last 3 (``_short``)
# ... above a floor: a near-perfect model's eval loss (3e-05 -> 1e-04, printed to one digit) moves
# by multiples on a handful of samples; no ratio says anything there
OVERFIT_FLOOR = 0.05


def overfit(run: Run, opts: dict) -> List[Finding]:
    """STOP when the eval (or val) loss sat at ``OVERFIT_RATIO``x its best or more on its last
    ``OVERFIT_EVALS`` evals (or at ``OVERFIT_SUSTAINED``x on the last quarter of its evals, 5 at
    least, or up on each of its last ``CLIMB_EVALS`` to ``OVERFIT_CLIMB``x) while the train loss
    went on falling below where it was at that best,
    and every other held-out metric (accuracy, F1, WER...) logged is 1% or more worse than at that
    best: the model is memorising its train set (a Keras classifier: val loss 0.79 -> 1.75 over 20
    epochs, val accuracy 0.70 -> 0.67, train loss 0.42 -> 0.05). Real overfitting shows in the
    metric too: one that held or improved is the eval-loss trap (an over-confident loss rising
    while accuracy or WER holds), no STOP."""
    ev, train = run.get("eval_loss") or run.get("val_loss"), run.get("loss")
    if ev is None or train is None or ev is train:
        return []
    if len(ev) < OVERFIT_EVALS + 2:
        return _short(run, ev, train) if opts.get("final") else []
    if len(set(ev.steps[-OVERFIT_EVALS:])) < OVERFIT_EVALS:  # logged per batch: an eval per step
        ev = per_step(ev)
    vals, steps = ev.values, ev.steps
    last = vals[-OVERFIT_EVALS:]
    # the run's lowest eval loss (kept on the series as it grows): when the last evals clear 1.5x
    # of it, it was logged before them, so it is their best; the common case costs 5 comparisons
    best, ratio = ev.low(), OVERFIT_RATIO
    if len(vals) < OVERFIT_EVALS + 2 or not best >= OVERFIT_FLOOR or not all(map(isfinite, last)):
        return []
    climbing = False
    if min(last) < OVERFIT_RATIO * best:
        if min(last) >= OVERFIT_SUSTAINED * best:
            # a milder rise that has lasted a quarter of the evals is no bump either (val ppl 2.98 ->
            # 4.41 on 66 evals); a noisy eval comes back within a few
            last, ratio = vals[-max(OVERFIT_EVALS, len(vals) // 4):], OVERFIT_SUSTAINED
            if len(last) + 2 > len(vals) or not all(map(isfinite, last)) or min(last) < ratio * best:
                return []
        elif last[-1] >= OVERFIT_CLIMB * best and rises_at_end(vals) >= CLIMB_EVALS:
            # ... nor a climb, each eval above the one before to 1.4x the best (a CNN's val loss
            # 1.28 -> 1.47, 1.53, 1.64, 1.79, 1.83): noise does not rise five times in a row
            climbing, ratio = True, OVERFIT_CLIMB
        else:
            return []  # (the common case: a few comparisons)
    at = steps[i := vals.index(best)]
    sigma = block_noise([math.log(v) for v in vals[max(0, len(vals) - len(last) - 20):-len(last)]
                         if isfinite(v) and v > 0])
    # clear of the eval's own noise too: every eval of the streak, or the climb's last
    if (last[-1] if climbing else min(last)) < best * max(ratio, math.exp(3.0 * sigma)):
        return []
    if not _train_fell(train, at, steps[-1]):
        return []  # the train loss rose too: ``rules_level.eval_diverged``'s case, not memorising
    if _metrics_worse(run, ev.name, at, steps[-1]) is None:
        return []
    k = len(vals) - len(last)
    while k > i + 1 and isfinite(vals[k - 1]) and vals[k - 1] >= ratio * best:
        k -= 1
    return [finding("overfit", "stop", steps[k], {"series": ev.name, "best": _r(best), "best_step": _num(at), "latest":
                    _r(vals[-1]), "ratio": _r(min(last) / best), "evals": len(last),
                    **({"climbing": True} if climbing else {})}, H.OVERFIT, ev.name)]


def _short(run: Run, ev: Series, train: Series) -> List[Finding]:
    """An ended run's log too short for the rule above (``SHORT_EVALS`` to 6 evals; a running
    job's first evals may still turn, a val spike in its first epochs): the eval loss rose on
    every eval since its best, ``SHORT_RISES`` times at least, to ``OVERFIT_RATIO``x it, the train
    loss fell, and a held-out metric logged beside it is worse, none held: what Keras'
    EarlyStopping(patience=3) stops (an LSTM's val loss 0.27 -> 0.30, 0.37, 0.46, 0.55 while its
    train loss fell 0.33 -> 0.05 and its val accuracy 0.908 -> 0.896). No metric, no STOP."""
    vals, steps = ev.values, ev.steps
    if len(vals) < SHORT_EVALS or len(set(steps)) < len(steps) or not all(map(isfinite, vals)):
        return []
    r = rises_at_end(vals)
    i = len(vals) - 1 - r  # the climb's first eval: the best, or no climb since the best
    if r < SHORT_RISES or vals[i] != min(vals) or vals[i] < OVERFIT_FLOOR or vals[-1] < OVERFIT_RATIO * vals[i]:
        return []
    worse = _metrics_worse(run, ev.name, steps[i], steps[-1]) if _train_fell(train, steps[i], steps[-1]) else None
    if not worse:
        return []
    ev_ = {"series": ev.name, "best": _r(vals[i]), "best_step": _num(steps[i]), "latest": _r(vals[-1]),
           "ratio": _r(vals[-1] / vals[i]), "evals": r, "short": True, "also_worse": worse}
    return [finding("overfit", "stop", steps[i + 1], ev_, H.OVERFIT, ev.name)]


def _train_fell(train: Series, at: float, end: float) -> bool:
    """The train loss lower at ``end`` than at ``at``, the eval loss's best (a best eval logged
    before the train loss's first log is compared with that first log)."""
    t_best, t_now = train.last_at(at), train.last_at(end)
    if t_best is None and len(train):
        t_best = train.last_at(train.steps[0])
    return t_best is not None and t_now is not None and t_now < t_best


def _metrics_worse(run: Run, ev_name: str, at: float, end: float) -> Optional[List[str]]:
    """The held-out metrics 1% or more worse at ``end`` than at ``at`` (the eval loss's best);
    None when one of them held (within 1%) or improved: the eval-loss trap, not memorising."""
    worse = []
    for name in run.series:  # names first: on a cut run (``series_cut``) a series read is a copy
        sign = metric_sign(name)
        if not sign or name == ev_name:
            continue
        m = run.series[name]
        if constant(m):
            continue  # (a top-5 at 1.0 on every eval of a 3-class task holds, and says nothing)
        then, now = m.last_at(at), m.last_at(end)
        if then is not None and now is not None:
            if sign * (now - then) < 0.01 * abs(then):
                return None
            worse.append(name)
    return worse
