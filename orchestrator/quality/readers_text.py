"""Incremental readers for line metrics: JSONL and plain log lines (CSV and trainer_state: ``readers_tables``).

Each reader keeps a byte cursor (offset of the end of the last complete line, inode, a hash
of the file head) and feeds new records into a ``Run``. A rotated or rewritten file, or a
CSV whose header changed, asks the caller for a fresh run (``poll`` returns ``"reset"``).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from orchestrator.quality.cursor import FileCursor
from orchestrator.quality.linekeys import (_CLOSERS, _GLOG, _GROUP, _HEADER_ENDS, _KNOWN, _METRICISH, NUM_SPLIT,
                                           PY_WARNING, as_float, _group_name, _key_of, _opens_index, config_dump, on_split,
                                           split_head, unwrap_values)
from orchestrator.quality.series import STEP_KEYS, SYNONYMS, Run
from orchestrator.quality.steps import (EPOCH_BATCHES, EPOCH_END, EPOCH_HEADER, EPOCH_ITER, EPOCH_OF, ITER_OF,
                                        KERAS_BATCH, KERAS_EPOCH, KERAS_EPOCH_LINE, KERAS_PAIR, MX_BATCH, TQDM_STEP,
                                        BatchCounter, Wrap, epoch_step, has_epoch_bar)
from orchestrator.quality.tables import (Table, abort_record, bare_nonfinite_row, checkpoint_record, coco_record,
                                         darknet_record, has_table_head, may_abort, table_head, yolo_results_row)
from orchestrator.quality.tables_box import Box

CHUNK = 8 << 20
_MAY_BE_NONFINITE = re.compile(r"nan|inf|#", re.IGNORECASE).search
COUNTING, BAR, LINE = 0, 1, 2  # where a log's steps come from (``LineSource.explicit``)


class LineParser:
    """Finds ``key <sep> number`` pairs in one line (``key: 1.5``, ``key=1``, ``key 2``, dicts).

    ``strict`` (text logs) keeps a line only when it names a known metric; JSONL keeps all.
    """

    def __init__(self, strict: bool = True, user_regex: Optional[str] = None):
        self.strict = strict
        self.cache: Dict[str, Tuple[str, str]] = {}
        self.user_re = re.compile(user_regex) if user_regex else None
        # what earlier lines said about the steps of later ones (Keras' "Epoch E/M" header,
        # the batches per epoch of "| epoch E | B/N batches |" for its "| end of epoch E |")
        self.keras_epoch: Optional[int] = None
        self.keras_epochs: Optional[int] = None
        self.per_epoch: Optional[int] = None
        self.by_epoch = False  # the last parse's step is an integer epoch, not a step
        self.table: Optional[Table] = None  # the last column header (``tables``): its rows follow
        self.epoch0 = False  # an "Epoch: [0]" was seen: epochs count from 0 (torchvision)
        self.batches = BatchCounter()  # MXNet's "Epoch[E] Batch[B]"
        self.box = Box()  # the rows of a boxed table so far (stable-baselines3)
        self.wrap = Wrap()  # "Iter: [B/N]" counters that restart every epoch
        self.header_epoch: Optional[int] = None  # the last "Epoch E/M" line's E (``_header``)
        self.rerun = False  # that count went back: the next stepless record starts a new timeline
        # a Hugging Face model card's "It achieves the following results on the evaluation set:"
        # bullets ("- Loss: 0.69", "- Wer: 0.21") repeat its results table's last row: not read
        self.summary = False

    def _keras(self, line: str) -> Optional[Tuple[Optional[float], List[Tuple[str, float]], Optional[float]]]:
        """A Keras header (remembered, no record) or batch line (step from its header)."""
        m = KERAS_EPOCH.match(line)
        if m:
            self.keras_epoch, self.keras_epochs = int(m.group(1)), int(m.group(2))
            return None
        m = KERAS_BATCH.match(line)
        if m is None:
            return None
        b, n = int(m.group(1)), int(m.group(2))
        vals = [(SYNONYMS.get(k, k), float(v)) for k, v in
                ((k.lower(), v) for k, v in KERAS_PAIR.findall(line, m.end() - 2)) if k != "eta"]
        if not vals:
            return None
        planned = float(n * self.keras_epochs) if self.keras_epochs else None
        return epoch_step(self.keras_epoch or 1, b, n), vals, planned

    def _header(self, line: str) -> None:
        """Remember an "Epoch E/M" line's count; one that went back starts a new run."""
        m = EPOCH_HEADER.match(line)
        if m:
            e = int(m.group(1))
            if self.header_epoch is not None and e < self.header_epoch:
                self.rerun = True
            self.header_epoch = e

    def parse(self, line: str) -> Optional[Tuple[Optional[float], List[Tuple[str, float]], Optional[float]]]:
        if self.user_re is not None:
            return self._parse_user(line)
        if self.summary or "evaluation set" in line:
            if line[:2] == "- " and self.summary:
                return None
            self.summary = "results on the evaluation set" in line
            if self.summary:
                return None
        self.by_epoch = False
        if "poch" in line and ("/" in line or " of " in line) and line.rstrip(" -=:.\r\n")[-1:] in _HEADER_ENDS:
            self._header(line)  # (the regex only for a line that ends on a count: "Epoch 3/10")
        if self.table is not None:
            rec = self.table.row(line)
            if rec is not None:
                return rec
        if "%|" in line and "{" not in line:
            return None  # tqdm progress bar
        c = line[:1]
        if (c == "|" and line.rstrip()[-1:] == "|") or (c == "-" and self.box.vals):
            rec = self.box.line(line)  # a boxed table's row, or its closing rule (``tables_box``)
            if rec is None:
                return None
            self.by_epoch = self.box.by_epoch and rec[0] is not None  # a row's epoch, as "Epoch 3 ..."
            return rec[0], rec[1], None
        if c in "IWEF" and line[1:5].isdigit():
            m = _GLOG.match(line)
            if m:  # its date, thread and source line are not metrics
                line = line[m.end():]
                c = line[:1]
        if (c == "E" or c == " " or c.isdigit()) and "/" in line and (KERAS_EPOCH.match(line)
                                                                      or KERAS_BATCH.match(line)):
            return self._keras(line)
        if "' reached " in line:  # a Lightning checkpoint line: the metric is quoted, its value after it
            ck = checkpoint_record(line)
            if ck is not None:
                return ck[0], ck[1], None
        if may_abort(line):
            ab = abort_record(line)  # the trainer stopped on a non-finite loss (``tables``)
            if ab is not None:
                return ab[0], ab[1], None
        if "(AP) @[" in line:
            ap = coco_record(line)  # pycocotools' summary: the eval's AP at the step trained so far
            return None if ap is None else (None, ap, None)
        if " avg" in line and " rate" in line:
            dk = darknet_record(line)
            if dk is not None:
                return dk[0], dk[1], None
        if "Warning: " in line and PY_WARNING.search(line):
            return None
        parts = NUM_SPLIT(line)
        if self.table is None and "/" in line and line.lstrip()[:1].isdigit() and len(parts) == 33:
            yr = yolo_results_row(line)  # 16 numbers: a YOLO results.txt row, a fixed column order
            if yr is not None:
                return yr
        if self.table is None and "/" in line and line.lstrip()[:1].isdigit() and _MAY_BE_NONFINITE(line):
            bare = bare_nonfinite_row(line)
            if bare is not None:
                return bare[0], bare[1], None
        if len(parts) < 3:
            if len(parts) == 1 and line[:1] in " Eeis":
                head = table_head(line)
                if head is not None and (self.table is None or head.names != self.table.names):
                    self.table = head  # (YOLO repeats its header every epoch: the same table goes on,
                    # and knows its epochs count from 0)
            return None
        cache = self.cache
        if len(cache) > 20000:
            cache.clear()
        step = None
        step_rank = 0
        epoch = None
        planned = None
        prev_key = ""
        known = not self.strict
        vals: List[Tuple[str, float]] = []
        split = split_head(parts[0])
        of_step: Optional[float] = None  # the total printed after the step ("Iter: [3800/3877]")
        held: Optional[Tuple[str, str]] = None  # a metric whose value follows its bracket (_opens_index)
        in_index = in_group = False
        for i in range(1, len(parts), 2):
            seg = parts[i - 1]
            if in_group and not _CLOSERS.isdisjoint(seg):
                in_group = False
            elif "oss" in seg and _GROUP.search(seg):
                in_group = True
            if in_index:
                if "]" not in seg:
                    continue  # a number inside the bracket: where, not what
                in_index = False
            ent = cache.get(seg)
            if ent is None:
                raw = _key_of(seg)
                ent = cache[seg] = (raw, SYNONYMS.get(raw, raw))
            raw, name = ent
            if raw and _opens_index(seg):
                held, in_index = ent, True
                continue
            if held is not None:
                if not raw:
                    raw, name = held  # "](epoch, minibatch):  9.66": the held metric's value
                held = None
            if in_group and raw and raw not in STEP_KEYS and raw != "epoch":
                raw = name = _group_name(raw)
            if split and raw:
                name = on_split(raw, name)
            if not raw:
                if prev_key and seg.strip() == "/" and planned is None:
                    planned = of_step = as_float(parts[i])
                prev_key = ""
                continue
            prev_key = ""
            tok = parts[i]
            if raw in STEP_KEYS:
                rank = STEP_KEYS[raw]
                if step is None or (rank > step_rank and step_rank < 3):
                    step, step_rank = as_float(tok), rank
                    prev_key = raw
                continue
            if raw == "epoch":
                if "." not in tok:
                    epoch = as_float(tok)
                continue
            if not known and (name in _KNOWN or any(m in name for m in _METRICISH)):
                known = True
            vals.append((name, float(tok) if tok[-1] != "x" else as_float(tok)))
        if not vals or not known:
            return None
        m = EPOCH_OF.search(line) if "poch" in line and "/" in line else None
        if m:  # a batch of an epoch: its "Step 100" restarts every epoch, it is not the global step
            step = self.batches.step(int(m.group(1)), int(m.group(2)))
            vals = [kv for kv in vals if kv[0] != "batch"]
        elif of_step is not None and step is not None:
            step = self.wrap.step(step, of_step)  # no epoch on the line: the count may still wrap
        if step is None:
            m = EPOCH_ITER.search(line) if "][" in line or "] " in line else None
            if m:
                e = int(m.group(1))
                self.epoch0 = self.epoch0 or e == 0
                step = epoch_step(e + self.epoch0, int(m.group(2)), int(m.group(3)))
            elif "Batch" in line and MX_BATCH.search(line):
                m = MX_BATCH.search(line)
                step = self.batches.step(int(m.group(1)), int(m.group(2)))  # type: ignore[union-attr]
                vals = [kv for kv in vals if kv[0] != "batch"]
            elif "Iter(" in line:
                m = ITER_OF.search(line)
                if m:
                    step, planned = float(m.group(1)), planned or float(m.group(2))
            if "batches" in line:
                m = EPOCH_BATCHES.search(line)
                if m:
                    self.per_epoch = int(m.group(3))
                    step = epoch_step(int(m.group(1)), int(m.group(2)), self.per_epoch)
            elif "end of epoch" in line:
                m = EPOCH_END.search(line)
                if m:  # the epoch's last batch; unknown length: the caller's next step
                    return (float(int(m.group(1)) * self.per_epoch) if self.per_epoch else None), vals, planned
            if step is None and self.keras_epoch is not None and KERAS_EPOCH_LINE.match(line):
                step = float(self.keras_epoch)  # one summary line per epoch: the epoch is its step
            if step is None and self.strict and config_dump(line):
                return None
        if step is None and epoch is None and self.rerun:
            # the first record of a run logged after another one in the same file: step 0 rewinds
            # the timeline (a log that names its steps keeps them: by_epoch yields to them)
            self.rerun, self.by_epoch = False, True
            return 0.0, vals, planned
        if step is None and epoch is not None:
            self.by_epoch = True
            return epoch, vals, planned
        return step, vals, planned

    def _parse_user(self, line: str):
        m = self.user_re.search(line)  # type: ignore[union-attr]
        if not m:
            return None
        step = None
        vals = []
        for k, v in m.groupdict().items():
            if v is None:
                continue
            try:
                f = float(v)
            except ValueError:
                continue
            if k in STEP_KEYS or k == "epoch":
                step = f
            else:
                vals.append((SYNONYMS.get(k, k), f))
        return (step, vals, None) if vals else None


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
                 self.bar_post, p.keras_epoch, p.keras_epochs, p.per_epoch)
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
             self.bar_post, p.keras_epoch, p.keras_epochs, p.per_epoch) = state
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
                self._bar_record(line, run, self.bar_step if m else None)
                continue
            rec = parse(line)
            if rec is None:
                continue
            step, vals, planned = rec
            if step is None or (parser.by_epoch and self.explicit):
                last = run.last_step
                bar = self.bar_step
                if bar is not None and (self.explicit != LINE or last is None or bar >= last):
                    step, self.bar_step = bar, None  # a bar that went backwards is a restart
                    self.explicit = self.explicit or BAR
                elif self.explicit and last is not None:
                    step = last
                elif step is None:
                    step = (last + 1) if last is not None else 0.0
            elif not parser.by_epoch:
                self.explicit = LINE
            if planned and not run.planned_steps:
                run.planned_steps = planned
            add(step, vals)
