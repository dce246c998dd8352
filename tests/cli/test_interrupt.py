"""Ctrl-C: a real SIGINT to a real ``gpurun`` in the middle of ``queue submit --wait`` exits 130
with one ``gpurun: interrupted`` line (and what the command leaves behind), no traceback and no
bare line from click; ``watch``, which Ctrl-C is the way out of, exits 0 (with --json, whole
documents only); the note a command leaves for that line (``render.on_interrupt``) lives for one
invocation of ``main`` only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rigs.agents import gpurun


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(cwd), env=dict(os.environ))


def _reached(name: str, states: tuple[str, ...] = ("running",), timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = json.loads(gpurun("queue", "status", "--json").stdout)
        if any(j["name"] == name and j["state"] in states for j in st["jobs"]):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never reached {states}")


def _sigint(p: subprocess.Popen) -> tuple[str, str]:
    p.send_signal(signal.SIGINT)
    return p.communicate(timeout=30)


def test_ctrl_c_in_submit_wait_is_one_line(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("[name=napper] sleep 60\n")
    p = _start(["queue", "submit", str(q), "--wait"], tmp_path)
    try:
        _reached("napper")
        time.sleep(0.5)                      # inside wait_for, after its note is set
        out, err = _sigint(p)
        assert p.returncode == 130, err
        assert "Traceback" not in err and "aborted" not in err and out == ""
        lines = err.splitlines()
        assert "" not in lines, err           # click's bare newline on Abort is gone
        said = [ln for ln in lines if "interrupted" in ln]
        assert said == [lines[-1]] == [("gpurun: interrupted; stopped waiting; the jobs keep running on local "
                                        "(see `gpurun queue status --host local`)")], err
        # with --json a script gets one JSON document instead, the note as its hint
        q.write_text("[name=napper2] sleep 60\n")
        p = _start(["queue", "submit", str(q), "--wait", "--json"], tmp_path)
        _reached("napper2", ("queued", "running"))   # submitted: the note is set right after, then it waits
        time.sleep(0.5)
        out, err = _sigint(p)
        assert p.returncode == 130 and "Traceback" not in err, err
        doc = json.loads(out)["error"]
        assert doc["code"] == "interrupted" and "jobs keep running on local" in doc["hint"]
    finally:
        if p.poll() is None:
            p.kill()
        gpurun("queue", "cancel", "napper", "napper2")


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "plain"])
def test_ctrl_c_leaves_a_watch_with_exit_0(home, tmp_path, monkeypatch, as_json):
    """Ctrl-C is how one leaves ``watch``: exit 0 with or without --json, no traceback, and a
    stream of whole JSON documents (one being written when Ctrl-C came is finished first)."""
    if not as_json:
        monkeypatch.setenv("TTY_COMPATIBLE", "1")  # the live view draws now (piped, rich draws at the end)
    p = _start(["watch", "--interval", "0.5"] + (["--json"] if as_json else []), tmp_path)
    try:
        first = b""                          # the first poll is shown: the loop is running
        while b'"hosts"' not in first and b"local" not in first:   # os.read: nothing is left in a
            chunk = os.read(p.stdout.fileno(), 1 << 16)            # buffer out of communicate's reach
            assert chunk, p.stderr.read()
            first += chunk
        time.sleep(1.2)                      # polls more: Ctrl-C lands mid-poll or mid-write
        out, err = _sigint(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err and "interrupted" not in err, err
    if as_json:
        assert err == "gpurun: left the watch; jobs keep running on their hosts\n"
        text, docs, at = first.decode() + out, [], 0
        decoder = json.JSONDecoder()
        while text[at:].strip():             # every document whole, nothing after the last
            doc, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
            docs.append(doc)
        assert docs and all(d["hosts"][0]["host"] == "local" for d in docs)
    else:
        assert "left the watch; jobs keep running on their hosts" in out and err == ""


def test_the_note_lasts_one_invocation(home, monkeypatch, capsys):
    """``main`` in one process twice (an embedding script, a test): the second Ctrl-C must not
    say "stopped waiting" for a command that left no note."""
    from orchestrator.cli import main as M
    from orchestrator.cli.render import interrupt_note, on_interrupt

    def waits(*a, **k):
        on_interrupt("stopped waiting; the jobs keep running on local")
        raise KeyboardInterrupt

    def plain(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(M.cli, "main", waits)
    with pytest.raises(SystemExit) as exc:
        M.main(["queue", "submit", "q.txt", "--wait"])
    assert exc.value.code == 130
    assert capsys.readouterr().err == "gpurun: interrupted; stopped waiting; the jobs keep running on local\n"
    monkeypatch.setattr(M.cli, "main", plain)
    with pytest.raises(SystemExit) as exc:
        M.main(["queue", "status"])
    assert exc.value.code == 130 and capsys.readouterr().err == "gpurun: interrupted\n"
    assert interrupt_note() is None
