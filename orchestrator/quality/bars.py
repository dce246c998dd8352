"""Metrics in a tqdm bar's postfix (``bar.set_postfix(loss=...)``): "| 18/781 [00:10<08:12,
1.7it/s, loss=2.31]" or a custom format's ", total_loss=nan". For many scripts the bar is the only
place the loss is printed. Used by ``readers_text.LineSource`` and ``linescan.OrderedScan`` alike,
so the per-line loop and the ordered scan read a bar the same way. Stdlib only.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from orchestrator.quality.linekeys import _NUM, NUM_SPLIT, _key_of, metricish
from orchestrator.quality.series import STEP_KEYS, SYNONYMS, Run
from orchestrator.quality.steps import BAR_EPOCH, epoch_step

_POSTFIX = re.compile(r"([A-Za-z_][\w/.\-]*)=\s*" + _NUM + r"(?![\w.])")
# a postfix written "Name value" (``set_postfix_str("Loss %.4f, Val Loss %.4f" % ...)``): after the
# rate, comma-separated items of words then one number ("Raw Acc (0.39, 2.49)" names no one value)
_RATE_THEN = re.compile(r"(?:/s|/it)\s*,\s*(?=[A-Za-z])")
_ITEMS = re.compile(r",(?![^()]*\))")  # the commas outside parentheses: "Raw Acc (0.39, 2.49)" is one item
_SPACED = re.compile(r"\s*([A-Za-z][A-Za-z_/.\- ]*?)(?:\s*:\s*|\s+)" + _NUM + r"\s*\Z")  # "Loss 2.3", "Batch Loss: 2.3"


def has_postfix(line: str) -> bool:
    """True when a bar line may carry metrics after its bar: ``name=value`` or, after the rate,
    ``Name value`` items (``bar_pairs`` reads both)."""
    return "=" in line or _RATE_THEN.search(line) is not None


def bar_pairs(line: str) -> List[Tuple[str, float]]:
    """The metrics a tqdm bar line shows after its bar as ``name=value`` (none unless one of them
    names a loss or another known metric): for many scripts the only place a loss is printed."""
    vals: List[Tuple[str, float]] = []
    known = False
    pairs = _POSTFIX.findall(line, line.find("%|") + 2) or _spaced(line)
    for k, tok in pairs:
        raw = k.lower()
        if raw in STEP_KEYS or raw == "epoch":
            continue
        name = SYNONYMS.get(raw, raw)
        known = known or metricish(name)
        vals.append((name, float(tok)))
    return vals if known else []


def _spaced(line: str) -> List[Tuple[str, str]]:
    """``(name, number)`` of a "Name value, Name value" postfix after the bar's rate."""
    m = _RATE_THEN.search(line, line.find("%|") + 2)
    if m is None:
        return []
    tail = line[m.end():]
    end = tail.find("]")  # the bar's closing bracket: what a script printed after it is no postfix
    tail = tail[:end] if end >= 0 else tail.rstrip()
    out = []
    for item in _ITEMS.split(tail):
        sm = _SPACED.match(item)
        if sm:
            out.append((_key_of(sm.group(1) + " ") or sm.group(1).strip(), sm.group(2)))
    return out


_PERCENT = re.compile(r"\d+%\|")
_DIGIT = re.compile(r"\d")


def desc_pairs(line: str) -> List[Tuple[str, float]]:
    """The metrics a tqdm bar's DESCRIPTION shows before its percentage, as a log line writes them
    ("Epoch [000/210] | Loss 0.0029 | LR 0.00000000 | Step: 100%|": ``bar.set_description``), none
    unless one names a loss or another known metric. Steps and epochs are the bar's to tell."""
    m = _PERCENT.search(line)
    if m is None or not _DIGIT.search(line, 0, m.start()):
        return []
    parts = NUM_SPLIT(line[:m.start()])
    vals: List[Tuple[str, float]] = []
    known = False
    for i in range(1, len(parts), 2):
        raw = _key_of(parts[i - 1])
        if not raw or raw in STEP_KEYS or raw == "epoch":
            continue
        name = SYNONYMS.get(raw, raw)
        known = known or metricish(name)
        vals.append((name, float(parts[i])))
    return vals if known else []


def bar_step(run: Run, bar: Optional[float]) -> float:
    """The step of a bar's postfix record: the bar's own count when it is not behind the run, else
    the run's last step. Never a rewind: a bar's count starts over every epoch and at every eval
    loop, which is no restart of the run."""
    last = run.last_step
    if bar is not None and (last is None or bar >= last):
        return bar
    return last if last is not None else 0.0


def bar_count(line: str, m, run: Run, parser) -> float:
    """A bar's step from its ``TQDM_STEP`` match ``m``: its count, or (epoch, count) when its
    description names the epoch ("Epoch 8: 100%|...| 266/266 [": the count restarts each epoch).
    Sets the run's planned steps when the bar tells them."""
    b, n = int(m.group(1)), int(m.group(2))
    e = BAR_EPOCH.match(line)
    if e is None:
        run.planned_steps = run.planned_steps or float(n)
        return float(b)
    ep = int(e.group(1))
    parser.epoch0 = parser.epoch0 or ep == 0  # Lightning's "Epoch 0:": epochs count from 0
    if e.group(2) and not run.planned_steps:
        run.planned_steps = float(int(e.group(2)) * n)
    return epoch_step(ep + parser.epoch0, b, n)
