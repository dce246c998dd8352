"""``gpurun check`` driven through the real CLI: exit codes, --json contract, plots, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from quality.synth import make_curve, write

KEYS = {"verdict", "reason", "findings", "source", "format", "last_step", "points", "series", "resumed",
        "restarts", "unreadable", "checker_version", "final", "sparkline"}


def _run(args, home):
    return CliRunner().invoke(cli, ["check"] + args, catch_exceptions=False)


@pytest.mark.parametrize("cls,fmt,code,verdict", [
    ("healthy", "jsonl", 0, "CONTINUE"), ("nan", "tfevents", 11, "STOP"), ("divergence", "wandb", 11, "STOP"),
])
def test_exit_codes_and_json(isolated_home, tmp_path, cls, fmt, code, verdict):
    p = write(make_curve(cls, 0), fmt, str(tmp_path / "run"))
    r = _run([p, "--json"], isolated_home)
    assert r.exit_code == code, r.output
    out = json.loads(r.output)
    assert KEYS <= set(out) and out["verdict"] == verdict
    for f in out["findings"]:
        assert {"code", "severity", "step", "series", "evidence", "hint"} <= set(f)
    if verdict == "STOP":
        assert out["findings"][0]["hint"]


def test_run_dir_human_output_and_svg(isolated_home, tmp_path):
    d = tmp_path / "run"
    write(make_curve("nan", 2), "csv", str(d))
    svg = tmp_path / "p.svg"
    r = _run([str(d), "--plot", str(svg)], isolated_home)
    assert r.exit_code == 11
    assert "STOP" in r.output and "nonfinite_loss" in r.output and "hint:" in r.output
    assert any(ch in r.output for ch in "▁▂▃▄▅▆▇█")
    text = svg.read_text()
    assert text.startswith("<svg") and "nonfinite_loss" in text and "<polyline" in text


def test_wait_for_short_or_missing(isolated_home, tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "loss": 2.0}\n')
    assert _run([str(p)], isolated_home).exit_code == 10
    # a path that is not there is bad input (exit 2, the path named), not a WAIT to poll forever
    proc = subprocess.run(["gpurun", "check", str(tmp_path / "missing.jsonl"), "--json"],
                          capture_output=True, text=True, timeout=60)
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 2 and err["code"] == "metrics_source", proc.stdout + proc.stderr
    assert str(tmp_path / "missing.jsonl") in err["message"] and err["hint"]
    # an empty file is a run that has not logged yet: WAIT
    (tmp_path / "empty.log").write_text("")
    assert _run([str(tmp_path / "empty.log")], isolated_home).exit_code == 10


def test_primary_and_baseline(isolated_home, tmp_path):
    rows = [{"step": 100 * i, "eval_loss": 1.0 + 0.05 * i, "eval_acc": 0.3 + 0.02 * i, "loss": 3 - 0.1 * i}
            for i in range(1, 15)]
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _run([str(p), "--primary", "eval_acc:max"], isolated_home).exit_code == 0
    assert _run([str(p), "--primary", "eval_loss:min"], isolated_home).exit_code == 11
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"eval_acc": {str(100 * i): 0.9 + 0.001 * i for i in range(1, 15)}}))
    r = _run([str(p), "--primary", "eval_acc:max", "--baseline", str(base), "--json"], isolated_home)
    assert r.exit_code == 11 and json.loads(r.output)["findings"][0]["code"] == "below_baseline"


@pytest.mark.parametrize("args,needle", [
    (["--primary", "eval_wer"], "--primary"),
    (["--plot", "x.gif"], "--plot"),
    ([], "missing SOURCE"),
    (["--host", "local"], "--job"),
    (["--regex", "(unclosed"], "--regex"),
])
def test_bad_input_exit_2_one_line(isolated_home, tmp_path, args, needle):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "loss": 2.0}\n')
    argv = ([str(p)] if "missing SOURCE" != needle and "--job" != needle else []) + args
    proc = subprocess.run(["gpurun", "check"] + argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.gif").exists()


def _gpurun_without(module: str, args: list) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter where ``import <module>`` fails (as when the extra
    that brings it is not installed)."""
    code = ("import sys; sys.modules[%r] = None; sys.argv = ['gpurun'] + sys.argv[1:]; "
            "from orchestrator.cli.main import main; main()" % module)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_png_without_matplotlib_is_clear(isolated_home, tmp_path):
    p = write(make_curve("healthy", 0), "jsonl", str(tmp_path))
    proc = _gpurun_without("matplotlib", ["check", p, "--plot", str(tmp_path / "a.png")])
    assert proc.returncode == 2 and "matplotlib" in proc.stderr and ".svg" in proc.stderr, proc.stderr
    assert "pip install 'gpurun[plot]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "a.png").exists()
    proc = _gpurun_without("matplotlib", ["check", p, "--plot", str(tmp_path / "a.png"), "--json"])
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 2 and err["code"] == "unsupported" and "gpurun[plot]" in err["hint"]
    # SVG needs nothing extra, with or without matplotlib
    proc = _gpurun_without("matplotlib", ["check", p, "--plot", str(tmp_path / "a.svg")])
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.svg").read_text().startswith("<svg")


def test_png_with_matplotlib(isolated_home, tmp_path):
    pytest.importorskip("matplotlib")  # the test extra installs gpurun[plot]
    p = write(make_curve("nan", 0), "jsonl", str(tmp_path))
    png = tmp_path / "a.png"
    r = _run([p, "--plot", str(png), "--json"], isolated_home)
    assert r.exit_code == 11, r.output
    assert json.loads(r.output)["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hints_fit_80_columns_on_a_terminal_and_stay_whole_lines_piped(isolated_home, tmp_path):
    import os
    import re
    p = write(make_curve("nan", 2), "csv", str(tmp_path / "run"))
    env = dict(os.environ, COLUMNS="80", TTY_COMPATIBLE="1", NO_COLOR="1")
    tty = subprocess.run([sys.executable, "-m", "orchestrator.cli", "check", p], capture_output=True, text=True,
                         env=env)
    visible = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in tty.stdout.splitlines()]
    hint = [i for i, ln in enumerate(visible) if ln.lstrip().startswith("hint:")]
    assert tty.returncode == 11 and hint and len(visible) > hint[0] + 1
    assert all(len(ln) <= 80 for ln in visible if not ln.startswith("source:")), visible
    assert visible[hint[0] + 1].startswith(" " * 14) and visible[hint[0] + 1][14] != " "  # under the hint's text
    env = dict(os.environ, COLUMNS="80", TTY_COMPATIBLE="0")
    piped = subprocess.run([sys.executable, "-m", "orchestrator.cli", "check", p], capture_output=True, text=True,
                           env=env)
    lines = piped.stdout.splitlines()
    one = [ln for ln in lines if ln.lstrip().startswith("hint:")]
    assert len(one) == 1 and len(one[0]) > 80 and "\x1b" not in piped.stdout  # one whole line to grep


def test_each_finding_names_its_series(isolated_home, tmp_path):
    # the train loss and the val loss NaN at one step: two findings, told apart by their series
    p = tmp_path / "train.log"
    p.write_text("".join("step %d loss %s val_loss %s\n" % (i, v, v) for i, v in
                         enumerate(["2.0", "1.8", "1.6", "nan", "nan", "nan"])))
    res = _run([str(p)], isolated_home)
    assert res.exit_code == 11, res.output
    assert "nonfinite_loss at step 3 (loss)" in res.output and "nonfinite_loss at step 3 (val_loss)" in res.output
