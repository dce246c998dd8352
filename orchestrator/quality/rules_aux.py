"""Rules on the auxiliary series: learning rate, grad norm, throughput, loss sign, and the
loss against the accuracy logged beside it.

Same contract as ``rules.py``. Throughput is an infrastructure signal, never a quality STOP.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Dict, List, Optional, Tuple

from orchestrator.quality import hints as H
from orchestrator.quality.roles import RL_WORDS, accuracy_names, as_fraction, is_quality_metric, names_with
from orchestrator.quality.rules import Finding, _num, _r, finding
from orchestrator.quality.rules_eval import still_learning
from orchestrator.quality.rules_zero import _AVERAGED
from orchestrator.quality.series import Run, Series, isfinite, median
from orchestrator.quality.tables import OVERFLOW_SERIES


def lr_schedule(run: Run, opts: dict) -> List[Finding]:
    s = run.get("lr")
    if s is None:
        return []
    out = []
    tail = s.values[-5:]
    bad = [v for v in tail if not isfinite(v) or v < 0]
    if len(bad) >= 2:
        out.append(finding("lr_invalid", "stop", s.steps[-1], {"last_values": [_r(v) for v in tail]},
                           H.LR_INVALID, "lr"))
    elif bad:
        out.append(finding("lr_invalid", "warn", s.steps[-1], {"last_values": [_r(v) for v in tail]},
                           H.LR_INVALID, "lr"))
    out += lr_zero(run, s) + lr_rising(run, s, opts)
    declared = (opts.get("lr_schedule") or "").lower()
    if declared and declared not in ("constant", "none", "fixed") and len(s) >= 20:
        vals = [v for v in s.values[-200:] if isfinite(v)]
        if vals and max(vals) - min(vals) <= 1e-9 * max(abs(max(vals)), 1e-30):
            out.append(finding("lr_flat", "warn", s.steps[-1],
                               {"declared": declared, "value": _r(vals[-1]), "logs": len(vals)}, H.LR_FLAT, "lr"))
    return out


CYCLIC = ("cyclic", "cyclical", "sgdr", "cosine_restarts", "cosine_with_restarts", "restarts", "triangular")
LR_ZERO_LOGS = 3  # LR 0 on this many logs in a row (one 0 can be the schedule's last step)


def lr_zero(run: Run, s: Series) -> List[Finding]:
    """LR at 0 (or non-finite) on the last logs after it was positive, before the schedule's end:
    a sudden drop (the last positive LR was >= 5% of the peak) or a planned step count not yet
    reached. STOP when it lasted ``LR_ZERO_LOGS`` logs and the loss stopped improving."""
    vals = s.values
    n = len(vals)
    k = 0
    while k < n and k < 100000 and (vals[n - 1 - k] == 0.0 or not isfinite(vals[n - 1 - k])):
        k += 1
    if k == 0 or k == n:
        return []
    prev = vals[n - k - 1]
    window = vals[max(0, n - k - 100000):n - k]
    peak = max(window)  # C speed; a NaN in the window would hide the peak: then filter
    if not isfinite(peak):
        peak = max((v for v in window if isfinite(v)), default=0.0)
    start = s.steps[n - k]
    planned = run.planned_steps
    sudden = peak > 0 and prev >= 0.05 * peak
    early = bool(planned) and s.steps[-1] < 0.95 * float(planned)  # type: ignore[arg-type]
    if not (sudden or early):
        return []  # a schedule that decayed smoothly to 0 at its end
    # "lr: 0.0001, 0.0001, 0.0000": a log printed to fixed decimals rounds a small LR to 0; the
    # smallest positive value is then one unit of the last decimal and the drop comes from it
    quantum = min((v for v in vals[max(0, n - k - 1000):n - k] if isfinite(v) and v > 0), default=0.0)
    rounded = quantum > 0 and prev <= 2 * quantum and abs(math.log10(quantum) - round(math.log10(quantum))) < 1e-6
    ev = {"zero_logs": k, "since_step": _num(start), "last_positive": _r(prev), "peak": _r(peak),
          "planned_steps": _num(planned) if planned else None, "rounded_print": rounded}
    loss = run.main_loss()
    flat = None
    if loss is not None:
        after = [v for st, v in zip(loss.steps[-max(k * 50, 200):], loss.values[-max(k * 50, 200):])
                 if st >= start and isfinite(v)]
        _, before = loss.upto(start - 1e-9).finite_tail(10)
        if len(after) >= 2 and before:  # with LR 0 the loss cannot improve: 3% covers the noise
            flat = median(after) >= 0.97 * median(before)
            ev.update(loss_before=_r(median(before)), loss_since=_r(median(after)), loss_flat=flat)
    sev = "stop" if k >= LR_ZERO_LOGS and flat and not rounded else "warn"
    return [finding("lr_zero", sev, start, ev, H.LR_ZERO, "lr")]


def lr_rising(run: Run, s: Series, opts: dict) -> List[Finding]:
    """A warn when the LR rises now (last 5 logs >= 1.25x the lowest of the 20 before) after it had
    decayed below 0.8x an earlier peak: a schedule that rises where it should decay. Declared
    cyclic schedules are exempt."""
    declared = (opts.get("lr_schedule") or "").lower()
    if declared in CYCLIC or len(s) < 30:
        return []
    st, vals = s.finite_tail(25)
    if len(vals) < 25:
        return []
    recent, prev = vals[-5:], vals[-25:-5]
    n = len(s)
    # max(values[-100000:-25]) from the series' cached block maxima; a NaN first skips the rule
    peak = s.peak(max(0, n - 100000), n - 25) if n > 25 else 0.0
    if not isfinite(peak):
        return []
    lo = min(prev)
    if peak > 0 and lo <= 0.8 * peak and lo > 0 and max(recent) >= 1.25 * lo:
        return [finding("lr_rising", "warn", st[-5], {"peak_before": _r(peak), "low": _r(lo),
                                                       "now": _r(recent[-1]), "declared": declared or None},
                        H.LR_RISING, "lr")]
    return []


def grad_norm(run: Run, opts: dict) -> List[Finding]:
    s = run.get("grad_norm")
    if s is None or len(s) < 60:
        return []
    n = len(s)
    lo, hi = max(20, n // 10), max(40, (3 * n) // 10)
    base_vals = [v for v in s.values[lo:min(hi, lo + 500)] if isfinite(v)]
    st, tail = s.finite_tail(20)
    if len(base_vals) < 10 or len(tail) < 20:
        return []
    base, recent = median(base_vals), median(tail)
    _, prev = s.finite_tail(100)
    prev_med = median(prev[:-20]) if len(prev) > 40 else base
    ev = {"baseline_median": _r(base), "recent_median": _r(recent), "previous_median": _r(prev_med)}
    if base > 0 and recent > 10 * base:
        sev = "stop" if recent > 2 * prev_med else "warn"
        return [finding("grad_explosion", sev, st[0], ev, H.GRAD_EXPLODE, "grad_norm")]
    if base > 0 and (all(v == 0.0 for v in tail) or recent < 1e-3 * base):
        loss = run.get("loss")
        flat = False
        if loss is not None:
            _, lt = loss.finite_tail(20)
            flat = bool(lt) and (max(lt) - min(lt)) <= 0.01 * abs(median(lt) or 1.0)
        return [finding("grad_vanishing", "stop" if flat else "warn", st[0], dict(ev, loss_flat=flat),
                        H.GRAD_VANISH, "grad_norm")]
    return []


def _speed(run: Run) -> Tuple[Optional[Series], bool, str]:
    """(series, higher_is_better, label); per-step time is derived from cumulative train time."""
    for name in ("throughput", "iters_per_s"):
        s = run.get(name)
        if s is not None:
            return s, True, name
    s = run.get("step_time")
    if s is not None:
        return s, False, "step_time"
    tt = run.get("train_time")
    if tt is not None and len(tt) > 2:
        d = Series("step_time")
        steps, vals = tt.steps[-1100:], tt.values[-1100:]
        for i in range(1, len(vals)):
            ds = steps[i] - steps[i - 1]
            if ds > 0 and isfinite(vals[i]) and isfinite(vals[i - 1]) and vals[i] >= vals[i - 1]:
                d.add(steps[i], (vals[i] - vals[i - 1]) / ds)
        return d, False, "step_time (from train_time)"
    return None, True, ""


def throughput(run: Run, opts: dict) -> List[Finding]:
    s, higher, label = _speed(run)
    if s is None or len(s) < 60:
        return []
    st, recent = s.finite_tail(30)
    _, hist = s.finite_tail(1030)
    ref = hist[:-30]
    if len(ref) < 30 or len(recent) < 30:
        return []
    r, b = median(recent), median(ref)
    if r <= 0 or b <= 0:
        return []
    rate = r / b if higher else b / r
    if rate < 0.7:
        return [finding("throughput_drop", "warn", st[0],
                        {"series": label, "recent_median": _r(r), "run_median": _r(b), "relative_speed": _r(rate)},
                        H.THROUGHPUT, label)]
    return []


def negative_loss(run: Run, opts: dict) -> List[Finding]:
    """A loss that started above 0 and sits below it: a STOP when the profile says the loss is
    bounded below (``quality.loss_bounded_below: true``: a cross-entropy, an MSE); else a warn, the
    reviewer's to settle: a Gaussian NLL, a flow's or a VAE's log-density goes below 0 by design
    (WaveGlow's), and nothing in the log tells the two apart. As a STOP on the real-log corpus it
    caught no failed run in time (it stopped two before their onset) and stopped a WaveGlow."""
    bounded = opts.get("loss_bounded_below")
    if bounded is False:
        return []
    s = run.get("loss")
    if s is None or len(s) < 5 or names_with(run.series, RL_WORDS):  # an RL loss may go below 0
        return []
    first = next((v for v in s.values[:20] if isfinite(v)), None)
    tail = s.values[-3:]
    if first is not None and first > 0 and all(isfinite(v) and v < 0 for v in tail):
        k = len(s) - 1
        while k > 0 and isfinite(s.values[k - 1]) and s.values[k - 1] < 0:
            k -= 1
        return [finding("negative_loss", "stop" if bounded else "warn", s.steps[k], {"last_values": [_r(v) for v in tail],
                                                               "negative_logs": len(s) - k},
                        H.NEGATIVE, "loss")]
    return []



# A mean cross-entropy below 0.01 needs the true class at p >= 0.99 on nearly every sample, so an
# accuracy of 95% or less counted on the same batches cannot sit beside it (the 5% it gets wrong
# alone cost 0.05 x ln 2 = 0.035): the loss is not computed over the samples the accuracy counts;
# every label is ignored or masked (mmseg's ignore_index: decode.loss_seg 0.0000 at acc_seg 92%).
# Above 20% only: an "accuracy" near 0 beside a tiny loss is a regression's meaningless metric.
# Below 0.001, not 0.01: a loss divided by more than its samples (ERICA's relation loss 0.0031 at
# 91-95% accuracy, healthy) sits at 0.003 by its scale; 0.0000-0.0009 is a print of nothing
MASKED_LOSS, MASKED_ACC, MASKED_LOGS = 0.001, (0.2, 0.95), 2


_REGRESSION = ("mse", "l1_loss", "l2_loss", "mae", "heatmap", "smooth_l1")  # losses with no ln K floor


def _averaged(name: str) -> bool:
    return any(w in name.lower() for w in _AVERAGED)


def masked_loss(run: Run, opts: dict) -> List[Finding]:
    """STOP when the train loss sits below ``MASKED_LOSS`` on its last ``MASKED_LOGS`` logs while
    a train-side accuracy logged at the same steps reads 20-95%: two witnesses that disagree in
    a way no working loss allows. A validation accuracy proves nothing here (a memorised train
    set has loss 0 and a val accuracy of 92%), nor does an RL run's loss."""
    s = run.get("loss")
    if s is None or len(s) < MASKED_LOGS or names_with(run.series, RL_WORDS) or names_with(run.series, _REGRESSION):
        return []  # (a heatmap MSE of 0.0009 beside a 76% keypoint accuracy is its scale, not a mask)
    tail = s.values[-MASKED_LOGS:]
    if not all(isfinite(v) and 0.0 <= v < MASKED_LOSS for v in tail):
        return []
    steps = s.steps[-MASKED_LOGS:]
    averaged = _averaged(s.name)
    for name in accuracy_names(run.series, False):  # names first: on a cut run a series read is a copy
        if _averaged(name) != averaged:
            continue  # a running mean's accuracy ("avg_acc") is not counted on the loss's own batch
        a = run.series[name]
        accs = [as_fraction(a.at(st)) for st in steps]
        if all(MASKED_ACC[0] <= v <= MASKED_ACC[1] for v in accs):
            k = len(s) - MASKED_LOGS  # the onset: back to where the pair first disagreed
            while k > 0 and 0.0 <= s.values[k - 1] < MASKED_LOSS and \
                    MASKED_ACC[0] <= as_fraction(a.at(s.steps[k - 1])) <= MASKED_ACC[1]:
                k -= 1
            return [finding("loss_collapse", "stop", s.steps[k],
                            {"series": s.name, "last_values": [_r(v) for v in tail], "accuracy": name,
                             "accuracy_beside": [_r(v) for v in accs]}, H.MASKED, s.name)]
    return []


# fp16 tops out at 65504: for a loss that is a mean (DeepSpeed, apex), a dynamic loss scale of 4
# or less that still overflows means gradients or activations past 16,000 before any scaling,
# which no working fp16 run has (both start at 2^16-2^32 and settle near 2^10-2^17; their floor
# is 1). Two overflows in a row at that level: steps are being skipped, the run no longer trains.
OVERFLOW_FLOOR, OVERFLOW_LOGS = 4.0, 2


def loss_scale_floor(run: Run, opts: dict) -> List[Finding]:
    """STOP when the scale set after an overflow (``tables.OVERFLOW_SERIES``) was at most
    ``OVERFLOW_FLOOR`` on the last ``OVERFLOW_LOGS`` notes. The many halvings at a healthy fp16
    run's start come down from 2^16 or more. A reported ``loss_scale`` series proves nothing
    alone: Megatron prints 1.0 for a bf16 run (nothing scaled), fairseq 0.004 for a healthy one.
    Or when DeepSpeed reports every step skipped since the start, past the first overflows' few
    dozen (``_all_skipped``)."""
    ov = run.get(OVERFLOW_SERIES)
    if ov is not None and len(ov) >= OVERFLOW_LOGS and all(
            0.0 <= v <= OVERFLOW_FLOOR for v in ov.values[-OVERFLOW_LOGS:]):
        k = len(ov) - OVERFLOW_LOGS
        while k > 0 and 0.0 <= ov.values[k - 1] <= OVERFLOW_FLOOR:
            k -= 1
        return [finding("loss_scale_floor", "stop", ov.steps[k],
                        {"series": OVERFLOW_SERIES, "last_values": [_r(v) for v in ov.values[-4:]],
                         "overflows_at_floor": len(ov) - k, "floor": OVERFLOW_FLOOR}, H.SCALE_FLOOR, OVERFLOW_SERIES)]
    return _all_skipped(run)


# DeepSpeed's "step=N, skipped=M": a fp16 run's first overflows halve a scale of 2^16 or more, a few
# dozen skipped steps at most (with hysteresis); every step skipped up to step 40 and on, report
# after report, means the optimizer never updated a weight
SKIP_FROM, SKIP_LOGS = 40, 2


def _all_skipped(run: Run) -> List[Finding]:
    sk = run.series.get("skipped")
    if sk is None or len(sk) < SKIP_LOGS or sk.steps[-1] < SKIP_FROM:
        return []
    last = list(zip(sk.steps[-SKIP_LOGS:], sk.values[-SKIP_LOGS:]))
    if not all(isfinite(v) and v >= st - 1 > 0 for st, v in last):
        return []
    if last[-1][1] - last[0][1] < last[-1][0] - last[0][0]:
        return []  # some steps between the reports went through
    return [finding("loss_scale_floor", "stop", last[0][0],
                    {"series": "skipped", "steps_skipped": _num(last[-1][1]), "of_steps": _num(last[-1][0])},
                    H.SCALE_FLOOR, "skipped")]


# the flat start's second witness: held-out quality metrics (accuracy, mAP, Dice, F1...) logged on
# this many evals since the loss's first log, none better at the end than at the start by more
# than FLAT_METRIC_GAIN (as a fraction: one point of accuracy)
FLAT_METRIC_EVALS, FLAT_METRIC_GAIN = 8, 0.01


def metrics_flat(run: Run, since: float) -> Dict[str, Tuple[float, float]]:
    """What the held-out metrics say of a loss flat from its first log (``rules_flat.flat_start``):
    {name: (first-third mean, last-third mean)} when every quality metric logged on
    ``FLAT_METRIC_EVALS`` evals or more since ``since`` ends no better than it began (no eval above
    its first third's best, its last third's mean not above its first's) and no eval loss is still
    falling to new lows (``still_learning``); else {}. The seed's "eval metrics worse than
    baseline" row: a flat loss beside flat evals learned nothing, a flat loss alone is unsure."""
    seen: Dict[str, Tuple[float, float]] = {}
    for name in run.series:
        if not is_quality_metric(name):
            continue
        m = run.series[name]
        i = bisect_left(m.steps, since)
        vals = [as_fraction(v) for v in m.values[i:] if isfinite(v)]
        if len(vals) < FLAT_METRIC_EVALS or len(set(m.steps[i:])) < FLAT_METRIC_EVALS:
            continue
        k = len(vals) // 3
        head, tail = sum(vals[:k]) / k, sum(vals[-k:]) / k
        if max(vals[k:]) > max(vals[:k]) + FLAT_METRIC_GAIN or tail > head + FLAT_METRIC_GAIN:
            return {}  # one metric learned: the flat loss is the unsure row's
        seen[name] = (_r(head), _r(tail))
    if seen and still_learning(run, since):
        return {}
    return seen
