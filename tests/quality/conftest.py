"""Fixtures of the quality tests: the shared real-curve corpus beside the clone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CURVES = Path(__file__).resolve().parents[2].parent / "shared" / "curves"


@pytest.fixture(scope="session")
def curves() -> Path:
    if not (CURVES / "labels.json").is_file():
        pytest.skip("real-curve corpus missing: expected %s (shared/ beside the clone)" % CURVES)
    return CURVES


def labelled(curves_dir: Path) -> list:
    lab = json.loads((curves_dir / "labels.json").read_text())
    return lab["curves"] + lab["issue_excerpts"]
