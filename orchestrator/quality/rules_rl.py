"""The rule on a reinforcement-learning run's episode return: a policy that had learned and then
fell back to where it started (or below), and stays there.

An RL run's return starts at what a random policy scores (CartPole's ~20, LunarLander's -200) and
rises as it learns; dips that recover are the norm (an exploration burst, a target network's lag,
a hard stretch of a curriculum). A healthy run rarely holds its random start's return, or worse,
for a quarter of its run after it had learned: the policy collapsed (a value function that
diverged, a policy at one action; CS285's pendulum at exactly 3 for 80 evaluations after 1000).
Rarely is not never (a DDPG quadcopter under its start for 150 episodes, then twice its best), so
only a return stuck at one value is a STOP; a noisy one is the reviewer's to judge.
Many RL logs carry no supervised loss at all, so this is often the only rule that can judge them.

Same contract as ``rules.py``.
"""

from __future__ import annotations

from typing import List

from orchestrator.quality import hints as H
from orchestrator.quality.roles import is_return
from orchestrator.quality.rules import Finding, _num, _r, finding
from orchestrator.quality.rules_level import block_noise
from orchestrator.quality.series import Run, isfinite, median

MIN_LOGS = 20  # returns logged before the rule judges a run
COLLAPSE_LOGS, TAIL_SHARE = 10, 0.25  # the collapsed stretch: this many logs at least, and a quarter of the run
BACK_SHARE = 0.1  # "back to the start": under the initial level plus this share of what it had gained


def return_collapse(run: Run, opts: dict) -> List[Finding]:
    """An episode return that had risen above its start (its best block of logs over its first,
    beyond 3 sigmas of the block noise) and has sat back at its start since (the median of its last
    quarter, and every block of it, under the first block plus ``BACK_SHARE`` of the gain), for
    ``COLLAPSE_LOGS`` logs and a quarter of the run at least: a STOP when it sits at one value all
    that time, else a warn for the reviewer."""
    out: List[Finding] = []
    for name in run.series:
        if not is_return(name):
            continue
        s = run.series[name]
        vals = [v for v in s.values[-4000:] if isfinite(v)]
        n = len(vals)
        if n < MIN_LOGS:
            continue
        b = max(3, n // 10)
        levels = [median(vals[i:i + b]) for i in range(0, n - b + 1, b)]
        start, best = levels[0], max(levels)
        gain = best - start
        if gain <= 0 or levels.index(best) == 0 or gain <= 3.0 * block_noise(levels):
            continue  # never learned (a flat start is the reviewer's), or no more than its noise
        tail = max(COLLAPSE_LOGS, int(n * TAIL_SHARE))
        line = start + BACK_SHARE * gain
        if median(vals[-tail:]) > line or median(vals[-b:]) > line or max(levels[-(tail // b):]) > line:
            continue
        at = s.steps[len(s) - tail]
        # stuck at one value (a policy that always does the same thing): a STOP; a noisy low stretch
        # may still be a long dip (a DDPG quadcopter under its start for 150 episodes, then twice
        # its old best): the reviewer's
        stuck = max(vals[-tail:]) - min(vals[-tail:]) <= 1e-9 * max(1.0, abs(start))
        out.append(finding("return_collapse", "stop" if stuck else "warn", at, {
            "series": name, "start_level": _r(start), "best_level": _r(best), "recent_level": _r(median(vals[-tail:])),
            "logs_collapsed": tail, "since_step": _num(at)}, H.RETURN_COLLAPSE, name))
    return out[:1]
