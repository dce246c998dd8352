"""Views of a run's series that copy no more than a rule reads: ``Run.upto``'s cut, and one
point per step (``per_step``).

The judge confirms a trend STOP on the run cut a few logs earlier, and the resume gate judges the
run up to a checkpoint. Copying every 1M-point array for that cost more than judging; a rule
reads two or three series, so each is cut on first access. Stdlib only.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Dict, Iterator, Mapping

from orchestrator.quality.series import Series, isfinite


class Cut(Mapping):
    """``Run.upto``'s read-only series: each one cut at ``step`` on first access. The keys and
    lengths are taken at the cut, so points appended to the source later never show."""

    def __init__(self, src: Mapping[str, Series], step: float):
        if isinstance(src, Cut):  # a cut of a cut (the resume gate's run, confirmed): one cut
            self._n: Dict[str, int] = src._n
            step, src = min(step, src._step), src._src
        else:
            self._n = {k: len(s) for k, s in src.items()}
        self._src = src
        self._step = step
        self._done: Dict[str, Series] = {}

    def __getitem__(self, key: str) -> Series:
        s = self._done.get(key)
        if s is None:
            n = self._n[key]  # KeyError for a series the run did not have at the cut
            src = self._src[key]
            i = min(n, len(src), bisect_left(src.steps, self._step + 1e-9))
            s = self._done[key] = Series(key)
            s.steps, s.values = src.steps[:i], src.values[:i]  # as Series.upto
        return s

    def __contains__(self, key: object) -> bool:
        return key in self._n

    def __iter__(self) -> Iterator[str]:
        return iter(self._n)

    def __len__(self) -> int:
        return len(self._n)


def per_step(s: Series) -> Series:
    """One point per step, the mean of its finite values (NaN when none): a test loss logged per
    batch at one step (20 at step 117) is one eval, and its luckiest batch no best of the run."""
    out, i = Series(s.name), 0
    while i < len(s):
        j = bisect_right(s.steps, s.steps[i], i)
        ok = [v for v in s.values[i:j] if isfinite(v)]
        out.add(s.steps[i], sum(ok) / len(ok) if ok else math.nan)
        i = j
    return out
