"""Shared rendering helpers for the CLI: rich tables, state colours, durations, JSON out, the
job table (a fitted table on a terminal, plain whitespace columns when piped), the padding of
every hand-made column by terminal cells (``cells``, ``pad``: a CJK character takes two) and the
note a command leaves for ``main`` to print when Ctrl-C interrupts it."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import unicodedata
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from orchestrator.core.queue import Job

STATE_STYLE = {"queued": "cyan", "running": "yellow", "succeeded": "green", "failed": "red",
               "cancelled": "magenta", "quality_stopped": "bold red", "moved": "dim"}


# what `main` says after "gpurun: interrupted" (set by a command before it blocks)
_interrupt_note: Optional[str] = None


def on_interrupt(note: Optional[str]) -> None:
    """Remember what a Ctrl-C during the rest of this command leaves behind (e.g. "jobs keep
    running on box"); ``main`` prints it after ``gpurun: interrupted`` (None: nothing)."""
    global _interrupt_note
    _interrupt_note = note


def interrupt_note() -> Optional[str]:
    return _interrupt_note


def stdout_is_tty() -> bool:
    """Whether stdout is a terminal, for layout (fitted table vs. plain lines).

    ``TTY_COMPATIBLE=1``/``0`` (rich's own switch, which ``console()`` honours as well) wins
    over ``isatty`` so tests and terminals rich cannot detect can ask for either form.
    ``FORCE_COLOR`` is deliberately not a reason to lay out for a terminal: CI sets it, and
    its piped output must stay greppable."""
    forced = os.environ.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return sys.stdout.isatty()
    except ValueError:  # closed stream at interpreter exit
        return False


def console(stderr: bool = False) -> Any:
    from rich.console import Console
    # messages on stderr are never wrapped (they get grepped and logged); tables on stdout fit the terminal
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def cells(text: str) -> int:
    """The terminal cells ``text`` takes: a wide or full-width character (East Asian width W or
    F: CJK, full-width forms) two, a combining mark none, any other one. ``len`` counts code
    points, so a column padded by it ends early by one cell per wide character in the row."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def width_of(values: Any) -> int:
    """The widest of ``values`` in cells (0 for none); a column of ASCII costs one ``len`` each."""
    values = list(values)
    if "".join(values).isascii():
        return max(map(len, values), default=0)
    return max(map(cells, values), default=0)


def pad(text: str, width: int, right: bool = False) -> str:
    """``text`` padded with spaces to ``width`` cells, on the right (or on the left: ``right``)."""
    room = width - cells(text) + len(text)
    return text.rjust(room) if right else text.ljust(room)


def pad_column(values: list[str], width: int, right: bool = False) -> list[str]:
    """Every value of a column padded to ``width`` cells (``str.ljust`` when all are ASCII)."""
    if "".join(values).isascii():
        return [v.rjust(width) for v in values] if right else [v.ljust(width) for v in values]
    return [pad(v, width, right) for v in values]


def clip(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` cells, with ``…`` where it was cut."""
    if cells(text) <= width:
        return text
    out, used = [], 1
    for ch in text:
        used += cells(ch)
        if used > width:
            break
        out.append(ch)
    return "".join(out) + "…"


def print_plain_rows(columns: list[str], rows: list[list[str]]) -> None:
    """A listing as plain lines for a pipe: a header, one line per row, columns padded with
    two spaces, an empty cell as ``-``, a cell's lines joined with ``; ``, no trailing spaces
    (a drawn table piped is box characters at a guessed width: neither ``grep`` nor ``awk``
    likes it). Commands print their fitted ``rich`` table only on a terminal."""
    body = [[" ".join(str(c or "").replace("\n", "; ").split()) or "-" for c in r] for r in rows]
    widths = [width_of([h] + [r[i] for r in body]) for i, h in enumerate(columns)]
    padded = [pad_column(list(col), w) for col, w in zip(zip(columns, *body), widths)]
    for line in zip(*padded):
        sys.stdout.write("  ".join(line).rstrip() + "\n")
    sys.stdout.flush()


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def json_job(j: Job) -> dict[str, Any]:
    """The documented ``--json`` shape of one job (README, "JSON contract"): a projection of
    the wire job with ``seq`` as ``number`` and the times as ISO 8601 UTC."""
    return {"id": j["id"], "number": j["seq"], "name": j["name"], "state": j["state"],
            "exit_code": j["exit_code"], "attempt": j["attempt"], "gpus": j["gpus"], "gpu_ids": j["gpu_ids"],
            "command": j["command"], "cwd": j["cwd"], "log": j["log"], "run_dir": j["run_dir"],
            "reason": j["reason"], "secrets": list(j.get("secrets") or []), "submitted_at": iso(j["submitted_at"]), "started_at": iso(j["started_at"]),
            "ended_at": iso(j["ended_at"]), "quality": json_quality(j.get("quality")),
            "failure_class": j.get("failure_class"), "failure_hint": j.get("failure_hint"),
            "moved_to": j.get("moved_to"), "backend_id": j.get("backend_id")}


QUALITY_KEYS = ("verdict", "reason", "rule", "step", "last_step", "final", "attempt", "source", "url", "evidence")


def json_quality(q: Optional[dict]) -> Optional[dict[str, Any]]:
    """The documented ``quality`` object (README, "JSON contract"): the latest verdict of the
    training-quality check, ``checked_at`` as ISO 8601 UTC; null before the first check."""
    if not q:
        return None
    return {**{k: q.get(k) for k in QUALITY_KEYS}, "checked_at": iso(q.get("checked_at"))}


# --- the job table (queue status, submit --wait) ---------------------------------------------
JOB_COLUMNS = ("#", "NAME", "STATE", "EXIT", "QUALITY", "TRY", "GPUS", "RUNTIME", "ID")
# piped: QUALITY goes last before the reason, so `awk '{print $4}'` etc. keep their columns
PLAIN_COLUMNS = ("#", "NAME", "STATE", "EXIT", "TRY", "GPUS", "RUNTIME", "ID", "QUALITY")
_RIGHT = ("#", "EXIT", "TRY")
QUALITY_STYLE = {"STOP": "bold red", "WAIT": "yellow", "CONTINUE": "green"}
# dropped in this order when a terminal is too narrow; #, NAME, STATE, QUALITY and EXIT always stay
_DROPPABLE = ("ID", "RUNTIME", "GPUS", "TRY")
_SHORT_ID = 8
_REASON_STATES = ("failed", "quality_stopped", "queued", "cancelled")


def cpu_host(jobs: list[Job]) -> bool:
    """Whether the jobs show a host without GPUs: some job started without GPU ids and none
    got any (the runner gives every job on a GPU host at least one GPU)."""
    started = [j for j in jobs if j.get("started_at") is not None]
    return bool(started) and not any(j.get("gpu_ids") for j in jobs)


def _gpu_cell(j: Job, cpu: bool) -> str:
    if j.get("gpu_ids"):
        return ",".join(str(g) for g in j["gpu_ids"])
    if cpu or j.get("started_at") is not None:
        return "slot"  # a host without GPUs runs each job in one of its slots
    return str(j.get("gpus") or 1)  # not placed yet: what the job asks for


def _cells(j: Job, cpu: bool, now: float) -> tuple[str, ...]:
    """One job's cells, in ``JOB_COLUMNS`` order (a tuple: no dict per row on a 50,000-job table)."""
    started, code, q = j.get("started_at"), j.get("exit_code"), j.get("quality")
    runtime = ((j.get("ended_at") or now) - started) if started else None
    return (str(j["seq"]), j["name"], j["state"], "" if code is None else str(code),
            str((q.get("verdict") if q else None) or "-"), str(j.get("attempt") or 0), _gpu_cell(j, cpu),
            human_duration(runtime), j["id"])


def quality_word(j: Job) -> str:
    """The QUALITY cell: the latest verdict (STOP, WAIT, CONTINUE); ``-`` before any check or
    for a run that left no metrics."""
    return str((j.get("quality") or {}).get("verdict") or "-")


def _reason(j: Job) -> str:
    q = j.get("quality") or {}
    why = j.get("reason") if j["state"] in _REASON_STATES else None
    if q.get("verdict") == "STOP" and j["state"] != "quality_stopped":
        # a run that exited 0 (or still runs, under action: alert) yet diverged: say why here
        why = "quality STOP%s: %s" % (" (final)" if q.get("final") else "", q.get("reason") or q.get("rule"))
    why = " ".join(str(why).split()) if why else ""  # one line, whatever the agent wrote
    # the failure class (agent/failures) as a short suffix, where it says more than the state
    # and the reason already do ("error" is no class at all; a STOP or a cancel is in the state)
    cls = j.get("failure_class")
    return why + " [%s]" % cls if why and cls and cls not in _CLASS_SAID else why


_CLASS_SAID = ("error", "quality_stop", "cancelled")  # agent/failures classes the state already names


def job_header(host: str, jobs: list[Job], slots: Optional[int] = None) -> str:
    """``queue on HOST``, with the slot count when the host runs jobs without GPUs."""
    head = f"queue on {host}"
    if cpu_host(jobs) and slots:
        head += f" (no GPU: {slots} slot{'s' if slots != 1 else ''}, one job per slot)"
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    if counts:
        head += ": " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    stops = sum(1 for j in jobs if (j.get("quality") or {}).get("verdict") == "STOP")
    if stops:
        head += f"; {stops} judged STOP"  # by the quality check: the QUALITY column says which
    return head


def plain_job_lines(rows: list[tuple[Optional[str], Job]]) -> list[str]:
    """The piped form: a header, then one line per job in whitespace-separated columns, empty
    cells as ``-``, the full id, and the reason last (so ``grep``, ``awk``, ``wc -l`` work).
    ``rows`` pairs each job with its host, or ``None`` for a single-host listing (no HOST column)."""
    with_host = any(h is not None for h, _ in rows)
    cols = (("HOST",) if with_host else ()) + PLAIN_COLUMNS
    now = time.time()
    by_host: dict[Optional[str], bool] = {}
    for h, _ in rows:
        if h not in by_host:
            by_host[h] = cpu_host([j for hh, j in rows if hh == h])
    order = [JOB_COLUMNS.index(c) for c in PLAIN_COLUMNS]
    table = []
    for h, j in rows:
        cells = _cells(j, by_host[h], now)
        table.append(((h or "-",) if with_host else ()) + tuple(cells[i] or "-" for i in order))
    # column by column: one width pass, then each column padded in one go, joined per row
    columns = list(zip(*table)) or [() for _ in cols]
    widths = [max(len(c), width_of(col)) for c, col in zip(cols, columns)]
    padded = [pad_column(list(col), w, c in _RIGHT) for c, col, w in zip(cols, columns, widths)]
    head = "  ".join(c.rjust(w) if c in _RIGHT else c.ljust(w) for c, w in zip(cols, widths))
    join = "  ".join
    return [(head + "  REASON").rstrip()] + [(join(row) + "  " + _reason(j)).rstrip()
                                            for row, (_, j) in zip(zip(*padded), rows)]


def terminal() -> tuple[int, bool, bool]:
    """``(width, styles, colours)`` of stdout as rich's ``Console`` decides them (rich 13-15:
    ``is_terminal``, ``is_dumb_terminal``, ``size``, ``no_color``), without importing rich: its
    import was ~20 ms of a 1,000-job ``queue status``. A terminal is ``TTY_COMPATIBLE``, then
    ``FORCE_COLOR``, then ``isatty``; a dumb ``TERM`` gets no styles and 80 columns; ``NO_COLOR``
    drops colours but keeps bold and dim, as rich does; the width is ``COLUMNS``, else the first
    of stdin, stdout, stderr that is a terminal, else 80."""
    env = os.environ
    tty = env.get("TTY_COMPATIBLE", "")
    if tty in ("0", "1"):
        is_term = tty == "1"
    elif env.get("FORCE_COLOR") is not None:
        is_term = env["FORCE_COLOR"] != ""
    else:
        try:
            is_term = sys.stdout.isatty()
        except ValueError:
            is_term = False
    dumb = is_term and env.get("TERM", "").lower() in ("dumb", "unknown")
    cols, lines = env.get("COLUMNS", ""), env.get("LINES", "")
    if cols.isdigit() and lines.isdigit():
        width = int(cols)
    elif dumb:
        width = 80
    else:
        width = 0
        for fd in (0, 1, 2):
            try:
                width = os.get_terminal_size(fd)[0]
                break
            except (AttributeError, ValueError, OSError):
                continue
        width = int(cols) if cols.isdigit() else (width or 80)
    styles = is_term and not dumb
    return width, styles, styles and env.get("NO_COLOR", "") == ""


def print_job_table(host: str, jobs: list[Job], slots: Optional[int] = None) -> None:
    """One host's jobs: a table fitted to the terminal, or plain lines when stdout is piped."""
    if not stdout_is_tty():
        sys.stdout.write("\n".join(plain_job_lines([(None, j) for j in jobs])) + "\n")
        sys.stdout.flush()
        return
    width, styles, color = terminal()
    plain = (lambda text, style: text)
    # the header wraps at the terminal's width like the table fits it (a CPU host's slot note
    # and many states make it long); continuation lines are indented under it
    head = textwrap.wrap(job_header(host, jobs, slots), width=max(40, width), subsequent_indent="  ",
                         break_on_hyphens=False)
    out = [(_sgr if styles else plain)(line, "bold") for line in head]
    if not jobs:
        out.append((_sgr if styles else plain)("  no jobs; add some with `gpurun queue submit FILE`", "dim"))
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
        return
    cpu, now = cpu_host(jobs), time.time()
    table = dict(zip(JOB_COLUMNS, map(list, zip(*[_cells(j, cpu, now) for j in jobs]))))
    table["ID"] = [i[:_SHORT_ID] for i in table["ID"]]  # the full id is in --json and the piped form
    widths = {c: max(len(c), width_of(table[c])) for c in JOB_COLUMNS}
    cols = list(JOB_COLUMNS)
    for drop in _DROPPABLE:
        if sum(widths[c] for c in cols) + 2 * (len(cols) - 1) <= width:
            break
        cols.remove(drop)

    def cell(c: str, v: str) -> str:
        return pad(v, widths[c], c in _RIGHT)

    sgr = _sgr if color else plain
    # The rows are text with the few SGR codes they need, in one write: rich's per-line
    # rendering cost ~0.3 ms a job (3 s for 10,000). Per row, one %-format of padded cells:
    # the STATE and QUALITY cells (a handful of distinct values) are padded and coloured once.
    styled = {"STATE": STATE_STYLE, "QUALITY": QUALITY_STYLE}
    values = []
    for c in cols:
        vals = table[c]
        if c in styled:
            look = {v: sgr(cell(c, v), styled[c].get(v, "")) for v in set(vals)}
            vals = [look[v] for v in vals]
        else:
            vals = pad_column(vals, widths[c], c in _RIGHT)
        values.append(vals)
    out.append(sgr("  ".join(cell(c, c) for c in cols).rstrip(), "bold"))
    indent = " " * (widths["#"] + 2)
    room = max(10, width - len(indent))
    join = "  ".join
    for j, row in zip(jobs, zip(*values)):
        # never cropped: a name longer than the terminal wraps rather than losing its end
        out.append(join(row).rstrip())
        why = _reason(j)
        if why:
            out.append(sgr(indent + clip(why, room),
                           "red" if why.startswith("quality STOP") else "dim"))
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()


_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "magenta": "35", "cyan": "36"}


def _sgr(text: str, style: str) -> str:
    """``text`` in ``style`` (space-separated names of ``_SGR``) as ANSI codes; unstyled as is."""
    codes = ";".join(_SGR[w] for w in style.split() if w in _SGR)
    return "\x1b[%sm%s\x1b[0m" % (codes, text) if codes else text
