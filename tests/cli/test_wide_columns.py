"""Columns gpurun pads itself align by terminal cells: a CJK character takes two.

``profiles ls`` piped shows autodl's meter stop, ``关机 (power off)``: padded by code points,
every column after it started two cells late on that row. Checked through the real command,
and on the job table (piped and on a terminal) with a job named in Chinese.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest


def _cells(line: str) -> str:
    """``line`` as the terminal lays it out: one character per cell (a wide one and a filler)."""
    return "".join(ch + ("\0" if unicodedata.east_asian_width(ch) in "WF" else "") for ch in line
                   if not unicodedata.combining(ch))


def _assert_aligned(lines: list[str], header: str, names: list[str]) -> None:
    """Every line has a cell starting at each header column's start, after two blanks."""
    head = _cells(header)
    starts = [head.index(n) for n in names]
    for line in lines:
        row = _cells(line)
        for s in starts:
            assert row[s - 2:s] == "  " and row[s] != " ", (s, line)


def test_profiles_ls_piped_aligns_a_row_with_cjk(tmp_path: Path):
    env = dict(os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), TTY_COMPATIBLE="0")
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "profiles", "ls"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("关机" in ln for ln in lines), r.stdout
    _assert_aligned(lines[1:], lines[0], ["kind", "meter stop", "bills when stopped", "danger clocks", "detach"])


@pytest.mark.parametrize("tty", [False, True])
def test_job_table_aligns_a_cjk_name(tty: bool, monkeypatch):
    from orchestrator.agent.protocol import wire_job
    from orchestrator.cli.render import print_job_table

    jobs = [wire_job({"id": f"j{i}", "seq": i + 1, "name": name, "state": "succeeded", "exit_code": 0,
                      "attempt": 1, "gpus": 0, "gpu_ids": [], "submitted_at": 0.0, "started_at": 1.0,
                      "ended_at": 61.0}) for i, name in enumerate(["训练-基线", "e\u0301tude", "plain"])]
    monkeypatch.setenv("TTY_COMPATIBLE", "1" if tty else "0")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TERM", "dumb")  # no styles: the bytes are the layout
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_job_table("local", jobs, 1)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.lstrip()[:1].isdigit() or "NAME" in ln]
    header = next(ln for ln in lines if "NAME" in ln)
    rows = [ln for ln in lines if ln is not header]
    assert len(rows) == 3 and "训练-基线" in rows[0], buf.getvalue()
    _assert_aligned(rows, header, ["STATE", "RUNTIME"])
