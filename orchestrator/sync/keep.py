"""Which checkpoints of a job are kept at home: the latest N, the best, and every one whose
name carries no step number (``best.pt``, ``final/``). Applies to local copies only; gpurun
never deletes a file on the host.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from orchestrator.quality.steps import checkpoint_step, record_step


def unit_step(unit: str) -> Optional[int]:
    """The step a checkpoint unit stands for, by the same rule as the agent's resume gate
    (``quality.steps.checkpoint_step``), so keep-latest-N and resume pick the same one."""
    return checkpoint_step(unit)


@dataclass
class KeepPolicy:
    keep_latest: Optional[int] = None   # None keeps every checkpoint
    best_key: Optional[str] = None      # metric name, e.g. "val_loss"
    best_mode: str = "min"              # "min" | "max"

    @classmethod
    def from_config(cls, pull_cfg: dict) -> "KeepPolicy":
        best = pull_cfg.get("best") or {}
        keep = pull_cfg.get("keep_latest")
        return cls(keep_latest=int(keep) if keep is not None else None,
                   best_key=best.get("metric"), best_mode=best.get("mode", "min"))

    def split(self, files: list[dict], metrics_paths: list[Path]) -> tuple[list[dict], list[dict], dict]:
        """(files to keep, superseded checkpoint files, why) for one job's manifest files."""
        units: dict[str, list[dict]] = {}
        for f in files:
            if f.get("kind") == "checkpoint" and f.get("unit"):
                units.setdefault(f["unit"], []).append(f)
        numbered = {u: unit_step(u) for u in units if unit_step(u) is not None}
        why: dict[str, str] = {}
        if self.keep_latest is None or len(numbered) <= (self.keep_latest or 0):
            return list(files), [], why
        ordered = sorted(numbered, key=lambda u: (numbered[u], max(f["mtime"] for f in units[u])))
        keep_units = set(ordered[-self.keep_latest:]) if self.keep_latest > 0 else set()
        for u in keep_units:
            why[u] = "latest"
        best = self._best_unit(numbered, metrics_paths)
        if best is not None:
            keep_units.add(best)
            why[best] = "best " + str(self.best_key)
        dropped = {u for u in numbered if u not in keep_units}
        keep = [f for f in files if f.get("unit") not in dropped or f.get("kind") != "checkpoint"]
        gone = [f for f in files if f.get("kind") == "checkpoint" and f.get("unit") in dropped]
        return keep, gone, why

    def _best_unit(self, numbered: dict[str, int], metrics_paths: list[Path]) -> Optional[str]:
        if not self.best_key:
            return None
        by_step: dict[int, float] = {}
        for path in metrics_paths:
            for rec in _records(path):
                step, val = record_step(rec), rec.get(self.best_key)
                try:
                    step_i, val_f = int(float(step)), float(val)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(val_f):
                    by_step[step_i] = val_f
        scored = [(by_step[s], u) for u, s in numbered.items() if s in by_step]
        if not scored:
            return None
        pick = min(scored) if self.best_mode == "min" else max(scored)
        return pick[1]


def _records(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl or csv metrics file; unreadable rows are skipped (metrics files of a
    running job may end mid-line)."""
    out: list[dict[str, Any]] = []
    try:
        if path.suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
        elif path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8", errors="replace") as fh:
                out.extend(csv.DictReader(fh))
    except OSError:
        pass
    return out
