"""Whole-run rules: level shifts and divergence of the main loss measured against the best level
the run reached (``level_shift``, ``divergence_best``; logs too short for them: ``rules_short``),
absurd magnitudes (``absurd_loss``), every eval metric worse while the train loss rises
(``eval_diverged``), and ``eval_improving``, the judge's veto for a run whose eval still improves.

Why whole-run: a window rule (``rules.divergence``, a warn while the run goes on) compares the
last logs with the ones just before, so a loss that jumps and stays flat reads "stable" one
window later, and a slow rise never makes a big enough ratio. Here each check judges the whole
series against the best level ever reached: the STOP holds until the loss comes back. Cost: O(n)
per check, bounded: index blocks whose level is the median of at most ``SAMPLE`` points, old
history folded into ``COARSE`` blocks (a 1M-point log costs about what a 20k-point one does)."""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import List, Optional, Sequence, Tuple

from orchestrator.quality import hints as H
from orchestrator.quality.rules import Finding, _exp, _num, _r, constant, finding, point_noise
from orchestrator.quality.roles import accuracy_names, is_eval_side
from orchestrator.quality.series import Run, Series, isfinite, median
from orchestrator.quality.witness import ACC_LOGS, accuracy_flat

ABSURD, ABSURD_FLAT_LOGS = 1e6, 30  # a failure (unless the run started there and is moving)
# broken whatever it started at, unless falling (a PINN's 1e12-1e14 start); past 1e30 always (D-FINE: 1.66e37)
HUGE, ASTRONOMICAL = 1e20, 1e30
SHIFT_STOP, SHIFT_WARN = math.log(1.5), math.log(1.2)  # the window rule's STOP ratio: x1.5 over the best level
NOISE_K = 5.0  # the shift must also clear this many block-noise sigmas
PERSIST = 2  # blocks that must all sit above the best level (never one noisy point)
FINE, COARSE = 200, 400  # recent blocks kept at full resolution; older history folded into at most COARSE
SAMPLE = 16  # points sampled per block median
RECOVERING = 0.6  # latest excess below this share of the post-jump peak excess: coming back
TREND_BLOCKS, TREND_S, TREND_STOP = 8, 22, math.log(1.3)  # a climb: S = rises - falls of 28 level pairs
LONG_BLOCKS, HELD_STOP = 5, math.log(1.15)  # a x1.15 plateau 5 blocks long: a shift that stays
MIN_LOGS = 24


def block_size(n: int) -> int:
    """Points per fine block: 3 on short logs, 20 once the log has 600+ points."""
    return min(20, max(3, n // 30))


def _block_median(vals: Sequence[float], lo: int, hi: int) -> Optional[float]:
    step = max(1, (hi - lo) // SAMPLE)
    got = vals[lo:hi:step]
    if got and min(got) > 0 and _all_finite(got):
        # all positive and finite (the usual block): the log of the middle values only, since
        # log keeps the order; the same floats as the median of the logs, at a fraction of the cost
        xs = sorted(got)
        m = len(xs) // 2
        return math.log(xs[m]) if len(xs) % 2 else 0.5 * (math.log(xs[m - 1]) + math.log(xs[m]))
    xs = [math.log(v) for v in got if v > 0 and v != math.inf]  # nan > 0 is False
    return median(xs) if xs else None


def _all_finite(xs: Sequence[float]) -> bool:
    """True when no value of ``xs`` is NaN or infinite (the sum of finite floats can still
    overflow to inf: then the slow path decides, which is only slower)."""
    t = sum(xs)
    return t - t == 0.0


def blocks(s: Series) -> Tuple[List[float], List[float], int]:
    """(levels, end steps, fine count): log-median level per block, oldest first. Blocks are
    aligned to the end so the newest block always holds exactly the last ``b`` points."""
    n, vals, steps = len(s), s.values, s.steps
    b = block_size(n)
    nf = min(FINE, n // b)
    fine_lo = n - nf * b
    levels: List[float] = []
    ends: List[float] = []
    if fine_lo > 0:
        cb = max(b, -(-fine_lo // COARSE))
        lo = fine_lo % cb
        if lo >= max(3, cb // 2):  # a leading stub large enough to be a level of its own
            m = _block_median(vals, 0, lo)
            if m is not None:
                levels.append(m)
                ends.append(steps[lo - 1])
        for k in range(lo, fine_lo, cb):
            m = _block_median(vals, k, k + cb)
            if m is not None:
                levels.append(m)
                ends.append(steps[k + cb - 1])
    coarse = len(levels)
    for k in range(fine_lo, n, b):
        m = _block_median(vals, k, k + b)
        if m is not None:
            levels.append(m)
            ends.append(steps[k + b - 1])
    return levels, ends, len(levels) - coarse


def block_noise(levels: List[float]) -> float:
    """Robust sigma of one block level: MAD of consecutive differences / sqrt 2 (immune to a
    slow trend and to one jump; captures autocorrelated noise that a per-point MAD misses)."""
    d = [b - a for a, b in zip(levels, levels[1:])]
    if len(d) < 3:
        return 0.0
    md = median(d)
    return 1.4826 * median([abs(x - md) for x in d]) / math.sqrt(2.0)


def level_shift(run: Run, opts: dict) -> List[Finding]:
    """STOP when the loss sits above the best level it reached before, persistently: the last 2
    block levels x1.5 above it, or the last 5 x1.15, or a climb (8 levels rising in order, the
    newest x1.3), each also 5 block-noise sigmas. The STOP stands at every later check until a
    block comes back under the warn line (the run recovered), not only while the newest blocks
    still qualify. Warn instead when the rise is coming back down or immaterial at the run's
    scale; the judge's eval veto downgrades it when an eval since the rise is at its best."""
    s = run.main_loss()
    if s is None or len(s) < MIN_LOGS:
        return []
    levels, ends, nf = blocks(s)
    nl = len(levels)
    if nl < PERSIST + 4 or nf < PERSIST + 1:
        return []
    # block noise from the blocks themselves, floored by the per-point noise over sqrt(b): a few
    # blocks of a 10x-spread per-step loss can look calm by luck (sparse-recon runs)
    sigma = max(block_noise(levels[-min(nl, FINE):]), 1.2533 * point_noise(s) / math.sqrt(block_size(len(s))))
    need_stop, warn_at = max(SHIFT_STOP, NOISE_K * sigma), max(SHIFT_WARN, 3.0 * sigma)
    smooth = [median(levels[max(0, k - 1):k + 2]) if 0 < k < nl - 1 else levels[k] for k in range(nl)]
    best_upto: List[float] = []  # best_upto[k]: the best smoothed level among blocks 0..k
    for v in smooth:
        best_upto.append(min(v, best_upto[-1]) if best_upto else v)
    last = levels[-1] - best_upto[nl - 1 - PERSIST]
    if last <= warn_at:
        return []
    # the earliest block end in the recent window where a STOP condition held and from which on
    # no block came back under the warn line: the STOP stands from there
    first, how, S = None, "", 0
    for e in range(max(PERSIST + 3, nl - FINE), nl):
        best = best_upto[e - PERSIST]
        if levels[e] - best <= warn_at:
            first = None  # recovered (or never left): a later STOP must qualify anew
            continue
        if first is not None:
            continue
        why, S = _stop_at(levels, e, best, sigma, need_stop)
        if why:
            first, how = e, why
    best = best_upto[(first if first is not None else nl - 1) - PERSIST]
    at = best_upto.index(best)
    k = at  # where the rise began: the first block after the best above the warn line
    while k < nl - 1 and levels[k] - best <= warn_at:
        k += 1
    onset = _first_above(s, ends[k - 2] if k > 1 else -math.inf, ends[k], best + warn_at) if k > 0 else s.steps[0]
    peak = max(levels[k:]) - best
    last = levels[-1] - best
    jump = max((b - a for a, b in zip(levels[k - 1:], levels[k:])), default=0.0) if k > 0 else last
    code = "level_shift" if jump >= 0.6 * peak else "divergence_best"
    head = levels[0]
    ev = {"series": s.name, "ratio_to_best": _r(_exp(last)), "best_level": _r(math.exp(best)),
          "recent_level": _r(math.exp(levels[-1])), "best_step": _num(ends[at]),
          "block_noise": _r(sigma), "threshold": _r(_exp(need_stop)),
          "rule": how or None, "since_step": _num(ends[first]) if first is not None else None,
          "blocks": nl, "block_points": block_size(len(s))}
    sev = "stop"
    if first is None:
        sev = "warn"
    elif last < RECOVERING * peak:
        sev, ev["recovering"] = "warn", True
    elif math.exp(levels[-1]) - math.exp(best) < 0.01 * abs(math.exp(head) - math.exp(best)):
        sev, ev["immaterial"] = "warn", True  # a rise of <1% of what the run learned: noise at a floor
    else:
        back = _plateau_before_dip(levels, smooth, at, k, best, warn_at)
        if back is not None:
            sev, ev["back_to_plateau"] = "warn", _r(math.exp(back))
    hint = (H.LEVEL_SHIFT if code == "level_shift" else H.divergence(run, onset)) if sev == "stop" else H.DIVERGE_WARN
    return [finding(code, sev, onset, ev, hint, s.name)]


def _plateau_before_dip(levels: List[float], smooth: List[float], at: int, k: int, best: float,
                        warn_at: float) -> Optional[float]:
    """The level of a flat stretch the run held before a short dip to its best, when the blocks
    since the dip sit (their median) within the warn line of it: a per-step loss spread over
    decades (a classifier fine-tune at 1e-3..0.3) dipped for a few blocks and came back to
    where it had been for longer than the dip lasted. That is the run's level, not a jump
    above it. None when the stretch before was a descent or shorter than twice the dip."""
    j0 = at
    while j0 > 0 and smooth[j0 - 1] - best <= warn_at:
        j0 -= 1  # where the dip began: the first block near the best level
    dip = max(1, k - j0)
    w = max(6, 2 * dip)
    if j0 < w:
        return None
    pre = levels[j0 - w:j0]
    half = w // 2
    if abs(median(pre[:half]) - median(pre[half:])) > warn_at:
        return None  # the stretch before the dip was still moving: a descent, not a plateau
    ref = median(pre)
    return ref if median(levels[k:]) - ref <= warn_at else None


def _first_above(s: Series, after: float, upto: float, line: float) -> float:
    """The step of the first logged point in (after, upto] whose log-loss is above ``line``: the
    onset to the log, not to the block (a checkpoint from before it is the one to resume)."""
    lo = bisect_right(s.steps, after)
    hi = bisect_right(s.steps, upto)
    for i in range(lo, hi):
        v = s.values[i]
        if v > 0 and v != math.inf and math.log(v) > line:
            return s.steps[i]
    return upto


def _stop_at(levels: List[float], e: int, best: float, sigma: float, need_stop: float) -> Tuple[str, int]:
    """Which STOP condition holds for the blocks ending at ``e`` ("" for none), and the climb's S."""
    noise = NOISE_K * sigma
    if min(levels[e - PERSIST + 1:e + 1]) - best > need_stop:
        return "x1.5 on %d blocks" % PERSIST, 0
    if e + 1 >= LONG_BLOCKS + 4 and min(levels[e - LONG_BLOCKS + 1:e + 1]) - best > max(HELD_STOP, noise):
        return "x1.15 on %d blocks" % LONG_BLOCKS, 0
    if e + 1 >= TREND_BLOCKS and levels[e] - best > max(TREND_STOP, noise):
        # a steady climb: the seed's "increasing for > N steps"; a level test alone waits until
        # the lagging block medians clear x1.5 (2-3 checks late on a slow divergence)
        t = levels[e - TREND_BLOCKS + 1:e + 1]
        S = sum((t[j] > t[i]) - (t[j] < t[i]) for i in range(TREND_BLOCKS) for j in range(i + 1, TREND_BLOCKS))
        if S >= TREND_S:
            return "climbing over %d blocks" % TREND_BLOCKS, S
    return "", 0


def eval_series(run: Run, opts: dict) -> Tuple[Optional[Series], str]:
    """The eval metric that vetoes a train-loss STOP: the declared primary, else eval/val loss,
    else an eval accuracy (never the main loss: a run judged on its val loss has no second opinion)."""
    main, primary = run.main_loss(), opts.get("primary")
    if primary:
        s, mode = run.get(primary[0]) or run.get("eval_" + primary[0]), primary[1]
    else:
        s, mode = run.get("eval_loss") or run.get("val_loss"), "min"
        if s is None:  # no eval loss logged: the first eval accuracy, higher is better
            s, mode = next(((run.series[n], "max") for n in accuracy_names(run.series, True)), (None, mode))
    if s is None or (main is not None and s.name == main.name):
        return None, mode
    return s, mode


def eval_improving(run: Run, opts: dict, since: float) -> bool:
    """True when an eval was logged at or after ``since`` and the newest eval is no worse than the
    best one before ``since`` (1% slack): the train loss rose, the model did not get worse."""
    s, mode = eval_series(run, opts)
    if s is None:
        return False
    sign = 1.0 if mode == "min" else -1.0
    # (an eval at ``since`` itself came after that step's update: an epoch's end, epochs as steps)
    before = [v for st, v in zip(s.steps, s.values) if st < since and isfinite(v)]
    after = [v for st, v in zip(s.steps, s.values) if st >= since and isfinite(v)]
    if not before or not after:
        return False
    best = min(before, key=lambda x: sign * x)
    return sign * (after[-1] - best) <= 0.01 * abs(best)


def absurd_loss(run: Run, opts: dict) -> List[Finding]:
    """A finite loss of 1e6+ on its last 2 logs: STOP when it blew up to that (started below), sits
    frozen, grew 10x from its start, is 1e20+ and not falling, or an accuracy beside it never rose.
    A run that started at that scale and moves (an unnormalised regression) is reported only."""
    s = run.get("loss") or run.main_loss()
    limit = float(opts.get("absurd_loss") or ABSURD)
    if s is None or len(s) < 2:
        return []
    st, tail = s.finite_tail(5)
    if len(tail) >= 2 and abs(tail[-1]) >= limit and abs(tail[-2]) < limit:
        return _absurd_witnessed(run, s, st[-2:], tail[-1], limit)
    if len(tail) < 2 or not (abs(tail[-1]) >= limit and abs(tail[-2]) >= limit):
        return []
    n = len(s)
    k = n - 1
    while k > 0 and len(s) - k < 100000 and (not isfinite(s.values[k - 1]) or abs(s.values[k - 1]) >= limit):
        k -= 1
    head = [abs(v) for v in s.values[:min(5, k) or 5] if isfinite(v)]  # (before the blow-up: SSD's 19.1)
    # "blew up": it lived below the limit at its start (a PINN's 1e12 start falls through 1e6 and back: its scale)
    blew_up = k > 0 and bool(head) and median(head) < limit
    frozen = tail[-1] == tail[-2]  # two identical huge values: nothing is computing it any more
    grew = bool(head) and abs(median(tail)) >= 10 * median(head)
    # started huge and never moved (within 2% after ABSURD_FLAT_LOGS logs): no learning at 1e23
    h0 = median(head) if head else 0.0  # 0.0: a loss first logged as 0 did not start huge
    stuck = n > ABSURD_FLAT_LOGS and h0 > 0 and abs(abs(median(tail)) / h0 - 1) < 0.02
    huge = abs(tail[-1]) >= HUGE and (abs(tail[-1]) >= abs(tail[-2]) or abs(tail[-1]) >= ASTRONOMICAL)  # DOPE 3e31
    blind = accuracy_flat(run) if n - k >= ACC_LOGS else None  # the loss's scale aside, nothing learned
    ev = {"series": s.name, "latest": _r(tail[-1]), "limit": _r(limit), "logs_above": n - k, "blew_up": blew_up,
          "frozen": frozen, "stuck": stuck, **({"huge": True} if huge else {}),
          **({"accuracy_flat": blind} if blind else {})}
    sev = "stop" if (blew_up or frozen or grew or stuck or huge or blind) else "info"
    return [finding("absurd_loss", sev, s.steps[k], ev, H.ABSURD, s.name)]


def _absurd_witnessed(run: Run, s: Series, steps: Sequence[float], latest: float, limit: float) -> List[Finding]:
    """One log of the loss blown up past ``limit`` is a STOP when a held-out loss logged after the
    loss's last sane point blew up past it too: two witnesses on two sets of data, not one noisy
    point (a train loss of 1.6e18 and a valid loss of 1.9e7 for one epoch, printed on two lines).
    The loss itself must have started below it: a PaiNN's first log of 4e11 is its scale."""
    since = steps[0]  # the loss's last sane log
    if median([abs(v) for v in s.values[:5] if isfinite(v)] or [0.0]) >= limit:
        return []  # it started there: its scale
    for name in run.series:  # names first: on a cut run (``series_cut``) a series read is a copy
        if name == s.name or "loss" not in name or not is_eval_side(name):
            continue  # (a loss term on the loss's own line is a part of the same blow-up)
        w = run.series[name]
        if len(w) < 2 or w.steps[-1] <= since or not (isfinite(w.values[-1]) and abs(w.values[-1]) >= limit):
            continue
        head = [abs(v) for v in w.values[:5] if isfinite(v)]
        if head and median(head) < limit and abs(w.values[-2]) < limit:
            return [finding("absurd_loss", "stop", steps[1],
                            {"series": s.name, "latest": _r(latest), "limit": _r(limit), "logs_above": 1,
                             "blew_up": True, "witness": name, "witness_latest": _r(w.values[-1])}, H.ABSURD, s.name)]
    return []


def _warm_restart(lr: Series, ev_loss: Series, patience: int) -> bool:
    """The LR jumped x2 or more in one log after it had decayed (SGDR), after the best eval before
    the last ``patience``: what came after is the restart's (a warmup only rises: no restart)."""
    ev = ev_loss.values[:len(ev_loss) - patience]
    best_at = ev_loss.steps[min(range(len(ev)), key=lambda j: ev[j] if isfinite(ev[j]) else math.inf)]
    peak = -math.inf
    prev = None
    for st, v in zip(lr.steps, lr.values):
        if not isfinite(v):
            continue
        if prev is not None and st > best_at and v > 2 * prev and peak > 1.5 * prev:
            return True
        peak, prev = max(peak, v), v
    return False


# which way an eval metric improves, by name; a metric of unknown direction is not judged
_LOWER = ("loss", "wer", "cer", "perplexity", "ppl", "error", "mse", "mae", "rmse", "nll", "mape")  # (MAPE: no mAP)
_HIGHER = ("acc", "f1", "bleu", "rouge", "auc", "precision", "recall", "map", "score", "exact_match")
_NOT_METRIC = ("runtime", "per_second", "epoch", "samples", "steps", "time", "flos", "tokens")
PATIENCE = 5  # evals in a row
TRAIN_RISE = 1.2  # eval_diverged: the train loss's rise over its best (a noisy loss's best is a lucky log)


def metric_sign(name: str) -> float:
    """+1 for a held-out metric that is better lower (a loss, WER, perplexity), -1 for one better
    higher (accuracy, F1, BLEU, mAP), 0 for a train-side series or one of unknown direction."""
    low = name.lower()
    if not is_eval_side(name) or any(w in low for w in _NOT_METRIC):
        return 0.0
    return 1.0 if any(w in low for w in _LOWER) else -1.0 if any(w in low for w in _HIGHER) else 0.0


def eval_diverged(run: Run, opts: dict) -> List[Finding]:
    """STOP when the last ``PATIENCE`` evals of every eval metric whose direction is known are no
    better than that metric's best before them, the eval loss by more than 10%, and the train
    loss has risen x1.2 over its best level (medians of 5 logs), with no LR rise meanwhile (a
    warm restart raises both), and the eval loss's rise clears 3 sigmas of its recent noise: the
    run got worse on every count (a Whisper fine-tune at LR 3e-3: eval loss 2.55 -> 3.2-4.5, WER
    never better than at epoch 2, train loss 1.24 -> 2.03).
    One improving metric (WER while eval loss rises) is enough to keep going."""
    train, ev_loss = run.get("loss"), run.get("eval_loss") or run.get("val_loss")
    if train is None or ev_loss is None:
        return []
    patience = PATIENCE
    _, tv = train.finite_tail(2)
    if len(ev_loss) <= patience or len(tv) < 2:
        return []
    tbest = train.low()  # kept on the series as it grows: a check pays for its new points only
    if not (tbest > 0 and median(tv) >= TRAIN_RISE * tbest):
        return []  # the cheap test first; then levels, not points: a noisy per-step loss sits
    _, tt = train.finite_tail(2000)  # 1.2x over its luckiest batch most of the time (a 0.01 RMSE)
    b = max(5, block_size(len(tt)))  # the least of many medians of a few noisy batches is a lucky
    blocks = [median(tt[i:i + b]) for i in range(0, len(tt) - b + 1, b)]  # streak: 3 sigmas, too
    sig = block_noise([math.log(v) for v in blocks if v > 0]) if len(blocks) > 3 else 0.0
    if blocks and median(tt[-2 * b:]) < max(TRAIN_RISE, math.exp(3.0 * sig)) * min(blocks):
        return []
    if not blocks and tv[-1] < TRAIN_RISE * tbest:
        return []  # too few logs for levels: its last must sit over its best (0.94, 0.08: no rise)
    since = ev_loss.steps[len(ev_loss) - patience]
    lr = run.get("lr")
    if lr is not None and _warm_restart(lr, ev_loss, patience):
        return []  # an LR that jumped back up after decaying raises both losses for a while
    judged = []
    for name in run.series:  # names first: on a cut run (``series_cut``) a series read is a copy
        sign = metric_sign(name)
        if not sign:
            continue
        s = run.series[name]
        if len(s) <= PATIENCE or (s is not ev_loss and constant(s)):
            continue
        vals = [v for v in s.values if isfinite(v)]
        if len(vals) <= patience:
            continue
        best = min(vals[:-patience], key=lambda x: sign * x)
        slack = 0.10 * abs(best) if s is ev_loss else 0.01 * abs(best)  # (an accuracy within 1%: held)
        if s is ev_loss and best > 0 and min(vals) > 0:
            # and clear of 3 sigmas of the eval loss's recent noise: a val MSE swinging by x2-x7
            # from one eval to the next early on (9770, 69535, 3510, 27696) is 10% over its best
            # for 5 evals by chance, and then falls 15x
            sigma = block_noise([math.log(v) for v in vals[-patience - 20:-patience]])  # its recent noise
            slack = max(slack, best * (math.exp(3.0 * sigma) - 1.0))
        if any(sign * (v - best) <= slack for v in vals[-patience:]):
            return []  # this metric improved (or the eval loss came within 10%): not every count
        judged.append(name)
    if ev_loss.name not in judged:
        return []
    ev = {"metrics": sorted(judged)[:6], "evals": patience, "train_recent": _r(median(tv)), "train_best": _r(tbest)}
    return [finding("eval_diverged", "stop", since, ev, H.EVAL_DIVERGED, ev_loss.name)]
