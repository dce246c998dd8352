"""Replay a log's every prefix through the judge, as the agent's checks see a run grow (the
last prefix judged as an ended run): the helpers of the blind-round case tests."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from orchestrator.quality.judge import judge
from orchestrator.quality.sources import Tracker


def write_log(tmp_path: Path, lines: List[str], name: str = "train.log") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def verdicts(path: Path, first: int = 3) -> List[Tuple[str, str]]:
    """(verdict, reason) on every prefix of ``path`` from ``first`` lines on; the whole file is
    judged as an ended run."""
    lines = path.read_text().splitlines()
    cut = path.with_name("cut_" + path.name)
    out = []
    for i in range(first, len(lines) + 1):
        cut.write_text("\n".join(lines[:i]) + "\n")
        res = judge(Tracker([str(cut)]).update(), final=i == len(lines))
        out.append((res["verdict"], res["reason"]))
    return out
