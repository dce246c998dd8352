"""Finding and opening a run's metrics: format sniffing, run-dir discovery, the ``Tracker``.

A ``Tracker`` owns the chosen sources (in preference order, with fallbacks) and one ``Run``;
``update()`` reads only what was appended since the last call. An unreadable source is
reported (``Tracker.problems``), never raised: the judge turns it into WAIT.
"""

from __future__ import annotations

import glob
import os
from typing import List, Optional

from orchestrator.quality.readers_text import CsvSource, LineSource, TrainerStateSource
from orchestrator.quality.series import Run
from orchestrator.quality.tfevents import TfEventsSource
from orchestrator.quality.wandb_reader import WandbApiSource, WandbFileSource

# discovery order inside a run dir: structured metrics first, the job's own log last
DISCOVER = ("metrics.jsonl", "*.jsonl", "checkpoint-*/trainer_state.json", "trainer_state.json",
            "metrics.csv", "lightning_logs/version_*/metrics.csv", "*.csv",
            "events.out.tfevents.*", "*/events.out.tfevents.*", "wandb/offline-run-*/run-*.wandb",
            "wandb/run-*/run-*.wandb", "*.wandb", "log.txt", "*.log", "stdout.log", "output.log")


def sniff(path: str, user_regex: Optional[str] = None):
    """Pick a reader for one file by name, then by its first bytes."""
    base = os.path.basename(path)
    if path.startswith("wandb:"):
        return WandbApiSource(path)
    if base.startswith("events.out.tfevents") or base.endswith(".tfevents"):
        return TfEventsSource(path)
    if base.endswith(".wandb"):
        return WandbFileSource(path)
    if base.endswith(".csv"):
        return CsvSource(path)
    if user_regex:
        return LineSource(path, "text", user_regex)
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b":W&B"):
        return WandbFileSource(path)
    if base.endswith(".json") or (head.lstrip().startswith(b"{") and b'"log_history"' in head):
        if b'"log_history"' in head or base == "trainer_state.json":
            return TrainerStateSource(path)
    if base.endswith(".jsonl") or head.lstrip().startswith(b'{"'):
        return LineSource(path, "jsonl")
    return LineSource(path, "text")


def _newest(paths: List[str]) -> List[str]:
    def key(p: str):
        try:
            return os.path.getmtime(p)
        except OSError:
            return 0.0
    return sorted(paths, key=key, reverse=True)


def discover(run_dir: str) -> List[str]:
    """Metrics candidates in a run dir, best first (newest checkpoint / version first)."""
    found: List[str] = []
    for pat in DISCOVER:
        hits = [p for p in glob.glob(os.path.join(run_dir, pat)) if os.path.isfile(p)]
        if "tfevents" in pat:
            # all event files of one dir form one timeline (a restart writes a new file)
            hits = [os.path.dirname(_newest(hits)[0])] if hits else []
        for p in _newest(hits):
            if p not in found:
                found.append(p)
    return found


class TfDirSource:
    """Every event file of one directory, oldest first; new files appear after restarts."""

    kind = "tfevents"

    def __init__(self, d: str):
        self.path = d
        self.files: dict = {}

    def poll(self, run: Run) -> str:
        names = sorted(glob.glob(os.path.join(self.path, "events.out.tfevents.*")))
        for p in names:
            src = self.files.get(p)
            if src is None:
                src = self.files[p] = TfEventsSource(p)
            if src.poll(run) == "reset":
                self.files = {}
                return "reset"
        return "ok"

    def state(self) -> dict:
        return {p: s.offset for p, s in self.files.items()}


def open_source(path: str, user_regex: Optional[str] = None):
    if os.path.isdir(path):
        if glob.glob(os.path.join(path, "events.out.tfevents.*")):
            return TfDirSource(path)
        raise IsADirectoryError(path)
    return sniff(path, user_regex)


class Tracker:
    """The metrics of one run, kept up to date incrementally."""

    def __init__(self, paths: List[str], user_regex: Optional[str] = None):
        self.paths = list(paths)
        self.user_regex = user_regex
        self.active: Optional[str] = None
        self.source = None
        self.run = Run()
        self.problems: List[str] = []

    @classmethod
    def for_target(cls, target: str, user_regex: Optional[str] = None) -> "Tracker":
        """A file, a TB dir, a run dir (discovered), or ``wandb:entity/project/id``."""
        if os.path.isdir(target) and not glob.glob(os.path.join(target, "events.out.tfevents.*")):
            return cls(discover(target) or [target], user_regex)
        return cls([target], user_regex)

    def update(self) -> Run:
        """Read new data; fall back to the next candidate when the active one is unreadable."""
        self.problems = []
        for path in self.paths:
            if self.active is not None and path != self.active and self.source is not None:
                continue
            try:
                if self.source is None or self.active != path:
                    self.source, self.active, self.run = open_source(path, self.user_regex), path, Run(path)
                if self.source.poll(self.run) == "reset":
                    self.run = Run(path)
                    self.source = open_source(path, self.user_regex)
                    self.source.poll(self.run)
                return self.run
            except (OSError, ValueError, IndexError, UnicodeError) as exc:
                self.problems.append("%s: %s" % (path, _why(exc)))
                self.source, self.active = None, None
                continue
        return self.run

    def readable(self) -> bool:
        return self.source is not None

    @property
    def kind(self) -> Optional[str]:
        """The active reader's format (``jsonl``, ``csv``, ``tfevents``...), None when unreadable."""
        return getattr(self.source, "kind", None)


def _why(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, IsADirectoryError):
        return "is a directory with no known metrics file"
    return str(exc) or type(exc).__name__
