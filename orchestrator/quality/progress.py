"""A running job's latest (step, loss) from a cheap tail read: the watchdog's progress signal
every tick and the ``snapshot`` verb behind ``gpurun watch``.

It parses lines with the quality readers' own ``LineParser`` and picks the loss with
``Run.main_loss`` (the judge's choice: ``loss`` by its synonyms such as ``train/loss``, else
the validation loss), so ``gpurun watch`` and ``gpurun check`` never show two different
"losses" or steps for one job. Only the last ``TAIL_BYTES`` of a file are read: no cursor,
no history. Stdlib only (shipped with the agent).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple, Union

from orchestrator.quality.bars import bar_pairs, bar_step, has_postfix
from orchestrator.quality.lineparse import LineParser
from orchestrator.quality.steps import TQDM_STEP
from orchestrator.quality.series import Run
from orchestrator.quality.sources import sniff_kind

TAIL_BYTES = 16384
Number = Union[int, float]


def metrics_path(job: Dict[str, Any]) -> Optional[str]:
    """The job's declared metrics file, else ``metrics.jsonl`` in its run dir when present
    (the convention of the example trainer and of many training scripts)."""
    if job.get("metrics"):
        return job["metrics"]
    run_dir = job.get("run_dir")
    cand = os.path.join(run_dir or "", "metrics.jsonl")
    return cand if run_dir and os.path.isfile(cand) else None


def _tail(path: str) -> str:
    """The complete lines among the last ``TAIL_BYTES`` (a cut first line and an unfinished
    last line are dropped: a half-written number must not read as a value)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - TAIL_BYTES)
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    if start:
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""
    end = max(data.rfind(b"\n"), data.rfind(b"\r"))
    return data[:end + 1].decode("utf-8", "replace") if end >= 0 else ""


def _tail_run(path: str, kind: str = "text") -> Run:
    """The tail's records in a ``Run``. Lines without a step get the last progress bar's
    step when a bar was seen; otherwise they carry no step (a tail cannot count records
    from the start the way the full reader does)."""
    run = Run(path)
    text = _tail(path)
    if not text:
        return run
    # as ``sources.sniff``: JSONL keeps every numeric key, a text log only lines naming a metric
    parser = LineParser(strict=kind != "jsonl")
    bar: Optional[float] = None
    stepless = Run(path)
    for line in text.splitlines():
        if not line:
            continue
        if "%|" in line and "{" not in line:
            m = TQDM_STEP.search(line)
            if m:
                bar = float(m.group(1))
            if parser.strict and has_postfix(line):  # set_postfix(loss=...): the judge reads it (quality/bars)
                pairs = bar_pairs(line)
                if pairs:
                    run.add_record(bar_step(run, bar), pairs)
            continue
        rec = parser.parse(line)
        if rec is None:
            continue
        step, vals, _ = rec
        if step is None:
            step = bar
        if step is None:
            stepless.add_record(float(stepless.records), vals)
        else:
            run.add_record(step, vals)
    if not run.records and stepless.records:
        stepless.last_step = None  # positions, not steps
        return stepless
    return run


def _num(v: Optional[float]) -> Optional[Number]:
    if v is None:
        return None
    return int(v) if v == v and v not in (float("inf"), float("-inf")) and v == int(v) else v


def read_progress(metrics: Optional[str], log: Optional[str]) -> Tuple[Optional[Number], Optional[float]]:
    """Last (step, loss) of the metrics file's tail (JSONL or a text log), else the job log's.
    A metrics file in another format (CSV, TensorBoard, W&B) is left to the full readers:
    the job log is read instead."""
    step: Optional[Number] = None
    loss: Optional[float] = None
    for path in (metrics, log):
        if not path:
            continue
        try:
            kind = sniff_kind(path)  # by content, as the judge's readers choose
        except (OSError, ValueError):
            continue
        if kind not in ("jsonl", "text"):
            continue
        run = _tail_run(path, kind)
        if step is None:
            step = _num(run.last_step)
        if loss is None:
            s = run.main_loss()
            loss = float(s.values[-1]) if s is not None else None
        if step is not None:
            break
    return step, loss
