"""What keeps a periodic check's judge bounded on a long run: the running lowest value kept on a
``Series`` (``low``) and ``Run.upto``'s lazy cut give exactly what the whole-array versions gave."""

from __future__ import annotations

import math
import random

from orchestrator.quality.series import Run, Series, isfinite

NAN, INF = math.nan, math.inf


def _brute(vals) -> float:
    fin = [v for v in vals if isfinite(v)]
    return min(fin) if fin else NAN


def _same(a: float, b: float) -> bool:
    return (a != a and b != b) or a == b


def test_low_follows_appends_rewinds_and_reordering():
    rng = random.Random(3)
    s = Series("loss")
    assert _same(s.low(), NAN)
    for v in (NAN, INF, -INF):  # a non-finite first value is never the lowest
        s.add(len(s), v)
        assert _same(s.low(), NAN)
    for r in range(60):
        for _ in range(rng.randint(0, 40)):
            s.add(len(s), rng.choice([NAN, INF, -INF]) if rng.random() < 0.1 else rng.uniform(0.5, 9))
        if r % 7 == 3:  # a restart from a checkpoint drops the newer points (and maybe the lowest)
            s.truncate_from(rng.randint(0, len(s)))
        assert _same(s.low(), _brute(s.values)), r


def test_low_after_settle_and_in_the_judge_rule():
    run = Run()
    run.merging = True
    for st, v in ((1, 3.0), (3, 2.0), (2, 1.0), (4, NAN)):
        run.add_record(st, [("loss", v)])
    s = run.series["loss"]
    assert s.low() == 1.0
    run.settle({})
    assert list(s.steps) == [1, 2, 3, 4] and s.low() == 1.0
    run.series["loss"].truncate_from(2)
    assert s.low() == 3.0


def _run(n: int) -> Run:
    run = Run("x")
    for i in range(n):
        run.add_record(float(i), [("loss", 3.0 - i / n), ("lr", 1e-3)] + ([("val_loss", 2.5)] if i % 50 == 0 else []))
    return run


def test_cut_reads_as_the_copy_did_and_is_taken_at_the_cut():
    run = _run(1000)
    cut = run.upto(499.0)
    assert "loss" in cut.series and "nope" not in cut.series and sorted(cut.series) == ["loss", "lr", "val_loss"]
    assert cut.series.get("nope") is None and len(cut.series) == 3
    assert list(cut.series["loss"].steps) == [float(i) for i in range(500)]
    assert list(cut.series["val_loss"].steps) == [float(i) for i in range(0, 500, 50)]
    assert cut.get("loss") is cut.series["loss"] and cut.main_loss().name == "loss"
    assert cut.last_step == 499.0 and cut.first_step == 0.0
    # what the source gets later never shows in the cut (the tracker keeps reading)
    cut2 = run.upto(2000.0)
    run.add_record(1000.0, [("loss", 9.0), ("grad_norm", 1.0)])
    assert len(cut2.series["loss"]) == 1000 and "grad_norm" not in cut2.series
    # a cut of a cut is one cut: the lower step and the first cut's series
    cc = cut2.upto(99.0)
    assert len(cc.series["loss"]) == 100 and sorted(cc.series) == ["loss", "lr", "val_loss"]
    assert cc.upto(5000.0).series["loss"].values[-1] == run.series["loss"].values[99]


def test_block_level_of_positive_finite_blocks_is_the_median_of_logs():
    # the fast path (log of the middle values only) against the definition, on blocks with and
    # without the values that send it to the slow path (NaN, inf, 0, negatives, huge)
    from array import array

    from orchestrator.quality import rules_level as L
    from orchestrator.quality.series import median

    rng = random.Random(1)
    for _ in range(5000):
        n = rng.randint(1, 60)
        vals = array("d", [rng.choice([NAN, INF, -INF, 0.0, -1.0, 1e308]) if rng.random() < 0.05
                           else rng.lognormvariate(0, 2) for _ in range(n)])
        lo = rng.randint(0, n - 1)
        hi = rng.randint(lo + 1, n)
        xs = [math.log(v) for v in vals[lo:hi:max(1, (hi - lo) // L.SAMPLE)] if v > 0 and v != INF]
        want = median(xs) if xs else None
        assert L._block_median(vals, lo, hi) == want


def test_peak_is_max_of_the_slice_with_its_nan_rules():
    from orchestrator.quality import series as SM

    rng = random.Random(5)
    s = Series("lr")
    old = SM.PEAK_BLOCK
    SM.PEAK_BLOCK = 16  # small blocks: every case of partial and whole blocks on a short series
    try:
        for r in range(300):
            for _ in range(rng.randint(0, 30)):
                s.add(len(s), rng.choice([NAN, INF, -0.0, 0.0]) if rng.random() < 0.1 else rng.uniform(-1, 1))
            if r % 37 == 5:
                s.truncate_from(rng.randint(0, len(s)))
            if len(s) < 2:
                continue
            lo = rng.randrange(len(s))
            hi = rng.randint(lo + 1, len(s))
            assert _same(s.peak(lo, hi), max(s.values[lo:hi])), (r, lo, hi)
    finally:
        SM.PEAK_BLOCK = old


def test_the_rules_on_a_cut_run_copy_only_the_series_they_read():
    # the judge re-checks a trend on the run cut a few logs back (``series_cut``): a rule that
    # walked every series by value there copied all of them each check (word-LM bench: 8 -> 35 ms)
    from orchestrator.quality.rules_flat import no_learning
    from orchestrator.quality.judge import RULES
    r = Run("mem")
    rng = random.Random(5)
    for i in range(400):
        row = [("loss", 4.05), ("eval_loss", 4.1 + rng.random() * 1e-3), ("val_acc", 0.3 + rng.random() / 10)]
        r.add_record(10 * (i + 1), row + [("m%d" % k, rng.random()) for k in range(40)])
    cut = r.upto(3000)
    assert no_learning(cut, {}) is not None
    for fn in RULES.values():
        fn(cut, {})
    read = set(cut.series._done)
    assert not any(name.startswith("m") for name in read), sorted(read)
