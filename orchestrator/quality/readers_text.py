"""Incremental readers for line metrics: JSONL and plain log lines (CSV and trainer_state: ``readers_tables``).

Each reader keeps a byte cursor (offset of the end of the last complete line, inode, a hash
of the file head) and feeds new records into a ``Run``. A rotated or rewritten file, or a
CSV whose header changed, asks the caller for a fresh run (``poll`` returns ``"reset"``).
"""

from __future__ import annotations

from typing import Dict, Optional

from orchestrator.quality.cursor import FileCursor
from orchestrator.quality.lineparse import LineParser
from orchestrator.quality.linekeys import unwrap_values
from orchestrator.quality.series import Run
from orchestrator.quality.steps import TQDM_STEP, has_epoch_bar
from orchestrator.quality.tables import has_table_head

CHUNK = 8 << 20
COUNTING, BAR, LINE = 0, 1, 2  # where a log's steps come from (``LineSource.explicit``)


def other_loop(explicit: int, bar: float, done_n: Optional[str], step_n: Optional[str],
               last: Optional[float]) -> bool:
    """Whether a bar below the last step is another loop's, not a restart: steps come from bars,
    and this bar ran to its end (``done_n``: its total, None while it runs) counting to another
    total than the bar that gave them (an eval's 103/103 after training's 410, pointnet2's loop).
    Its count is no step: the lines after it belong to the step trained so far (read as a restart,
    every epoch's eval dropped the train points before it). A new run's bar that has just begun
    ("0/2260" of a second fine-tune in the same log) is still a restart."""
    return explicit == BAR and done_n is not None and step_n is not None and done_n != step_n and \
        last is not None and bar < last


def _tied(run: Run, marks: Dict[str, int], fast: Dict[str, int]) -> bool:
    """Whether a series got points at one step from both the fast path (``marks`` to ``fast``)
    and the lines it left (after ``fast``)."""
    for name, s in run.series.items():
        m, f = marks.get(name, 0), fast.get(name, 0)
        if m < f < len(s) and not set(s.steps[m:f]).isdisjoint(s.steps[f:]):
            return True
    return False


class LineSource:
    """JSONL or plain text log read line by line from a byte cursor."""

    kind = "text"

    def __init__(self, path: str, kind: str = "text", user_regex: Optional[str] = None):
        self.path = path
        self.kind = kind
        self.cursor = FileCursor(path)
        self.parser = LineParser(strict=(kind == "text"), user_regex=user_regex)
        self.bar_step: Optional[float] = None
        # once a line named its step, a line without one (or with only an epoch) belongs to
        # that step (Caffe's "Train net output" lines, a summary line); before, lines count.
        # COUNTING, BAR (steps from tqdm bars) or LINE (from the lines: a lower bar is then an
        # eval loop's, not a restart)
        self.explicit = COUNTING
        self.fast = None
        self.scan = None
        self.bar_post: Optional[tuple] = None  # the last bar postfix read: a refresh repeats it
        self.bar_n: Optional[str] = None  # the total of the last bar read ("410" of "17/410")
        self.done_n: Optional[str] = None  # ... when that bar ran to its end ("410/410"), else None
        self.step_n: Optional[str] = None  # the total of the bar whose count is the last step

    def poll(self, run: Run) -> str:
        """Read what was appended since the last poll into ``run``; ``"reset"`` if replaced."""
        with open(self.path, "rb") as f:
            if not self.cursor.check(f):
                self.cursor = FileCursor(self.path)
                return "reset"
            f.seek(self.cursor.offset)
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
                if end < 0:
                    if len(chunk) < CHUNK:
                        break  # an unfinished last line: wait for its end
                    end = len(chunk) - 1
                self._feed(chunk[:end + 1].decode("utf-8", "replace"), run)
                self.cursor.offset += end + 1
                f.seek(self.cursor.offset)
            self.cursor.seal(f)
        return "ok"

    def _feed(self, text: str, run: Run) -> None:
        text = unwrap_values(text)
        if self.fast is None:
            from orchestrator.quality.fastpath import FastPath
            self.fast = FastPath(self.parser)
        pre = run.last_step
        marks = run.marks()
        p = self.parser
        state = (run.last_step, run.first_step, run.records, run.planned_steps, self.bar_step, self.explicit,
                 self.bar_post, self.bar_n, self.done_n, self.step_n, p.keras_epoch, p.keras_epochs, p.keras_auto,
                 p.keras_last, p.per_epoch)
        rest = self.fast.take(text, run, marks)
        if rest is text:
            self._slow(text, run)
            return
        fast = run.marks()
        # the other lines were interleaved with the fast ones: a lower step among them is
        # ordering, not a restart (a restart inside a chunk makes the fast path decline)
        post, run.last_step, run.merging = run.last_step, pre, True
        first = run.first_step  # the slow lines restart "first" from ``pre`` (None in a first chunk)
        tied = False
        try:
            self._slow(rest, run)
            tied = _tied(run, marks, fast)
        finally:
            self.explicit = LINE  # the fast path only takes lines that name their step
            run.merging = False
            run.last_step = post if run.last_step is None else max(post, run.last_step)  # type: ignore[type-var]
            if first is not None and run.first_step is not None:
                run.first_step = min(first, run.first_step)  # the file's first line: the lower
            # the fast lines went in first, the others after them: a series both feed (``loss``
            # on every line, ``eval_loss`` on some) is out of order even when neither part was
            run.unsorted = True
            run.settle(marks)
        if tied:
            # both kinds of line logged one series at one step: only the file's order says which
            # point is the later one, and the fast path did not keep it. Read the chunk again,
            # line by line, as the plain reader does.
            for name in list(run.series):
                if name in marks:
                    run.series[name].cut_to(marks[name])
                else:
                    del run.series[name]
            run.__dict__.pop("_roles", None)
            (run.last_step, run.first_step, run.records, run.planned_steps, self.bar_step, self.explicit,
             self.bar_post, self.bar_n, self.done_n, self.step_n, p.keras_epoch, p.keras_epochs, p.keras_auto,
             p.keras_last, p.per_epoch) = state
            self._slow(text, run)

    def _bar_record(self, line: str, run: Run, bar: Optional[float]) -> None:
        """A bar's postfix metrics, once per change (a bar redrawn with the same postfix is a
        refresh, not a new log: counted again it would read as a frozen loss)."""
        if self.parser.strict:
            from orchestrator.quality.bars import bar_pairs, bar_step, desc_pairs, has_postfix
            desc = desc_pairs(line)
            vals = desc + bar_pairs(line) if has_postfix(line) else desc
            key = tuple(vals)
            if vals and key != self.bar_post:
                self.bar_post = key
                run.add_record(bar_step(run, bar), vals)
                if desc:  # the bar is where this log prints its steps: a summary line after it is
                    self.explicit = self.explicit or BAR  # at the bar's step, not a restart at its epoch

    def _slow(self, text: str, run: Run) -> None:
        from orchestrator.quality.bars import bar_count  # bars imports this module
        if (self.parser.user_re is None and len(text) >= 4096 and self.parser.table is None
                and not has_table_head(text) and not has_epoch_bar(text)):
            if self.scan is None:
                from orchestrator.quality.linescan import OrderedScan
                self.scan = OrderedScan(self.parser)
            saved = self.parser.wrap.save()
            try:
                return self.scan.scan(text, run, self)
            except ValueError:
                self.parser.wrap.restore(saved)  # the lines are read again, one by one
                # (a token the shape regex took for a number is not one: go line by line)
        parser = self.parser
        parse = parser.parse
        add = run.add_record
        for line in text.splitlines():
            if not line:
                continue
            if "%|" in line and "{" not in line:
                if parser.table is not None:  # a table's row with its bar (``tables``)
                    rec = parser.table.row(line)
                    if rec is not None:
                        self.explicit = LINE
                        run.planned_steps = run.planned_steps or rec[2]
                        add(rec[0], rec[1])
                        continue
                # a tqdm bar knows the step that HF dict lines leave out
                m = TQDM_STEP.search(line)
                if m:
                    self.bar_step = bar_count(line, m, run, parser)
                    self.bar_n = m.group(2)
                    self.done_n = self.bar_n if m.group(1) == self.bar_n else None
                    if m.group(1) == "0":
                        # a bar at 0 of N has run no batch: its running means are 0/0 (tqdm shows
                        # "total_loss=inf" before the first batch), not a measurement
                        continue
                self._bar_record(line, run, self.bar_step if m else None)
                continue
            rec = parse(line)
            if rec is None:
                continue
            step, vals, planned = rec
            if step is None or (parser.by_epoch and self.explicit):
                last = run.last_step
                bar = self.bar_step
                if bar is not None and (self.explicit != LINE or last is None or bar >= last) and \
                        not other_loop(self.explicit, bar, self.done_n, self.step_n, last):
                    step, self.bar_step = bar, None  # a bar that went backwards is a restart
                    self.explicit, self.step_n = self.explicit or BAR, self.bar_n
                elif self.explicit and last is not None:
                    step = last
                elif step is None:
                    step = (last + 1) if last is not None else 0.0
            elif not parser.by_epoch:
                self.explicit = LINE
            if planned and not run.planned_steps:
                run.planned_steps = planned
            add(step, vals)
