"""``gpurun watch`` is live: a running job's step is read at each poll (not the watchdog's
cached tick), ``--once --json`` is strict JSON when a loss is NaN, the host has a CPU / RAM
line, and finished jobs beyond ``--finished`` are counted. Real CLI, real local agent."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from rigs.agents import gpurun


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def _watch_json(*extra: str) -> dict:
    res = gpurun("watch", "--once", "--json", *extra)
    assert res.returncode == 0, res.stderr
    return _strict(res.stdout)


def _running_job(deadline_s: float = 30) -> tuple[dict, dict]:
    deadline = time.time() + deadline_s
    while True:
        doc = _watch_json()
        h = doc["hosts"][0]
        run = [j for j in h["jobs"] if j["state"] == "running"]
        if run:
            return h, run[0]
        assert time.time() < deadline, doc
        time.sleep(0.3)


def _profile(home: Path, text: str) -> None:
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True, exist_ok=True)
    (prof / "local.yaml").write_text(text)


def test_step_is_read_now_not_from_the_last_tick(home, tmp_path):
    # a 3 s tick so the test can wait until the watchdog has cached an older step
    _profile(home, "watchdog:\n  interval_s: 3\n")
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 2.0 - s / 1000}) + "\n" for s in range(100, 126)))
    q = tmp_path / "q.txt"
    q.write_text(f"[name=live metrics={metrics}] sleep 60\n")
    assert gpurun("queue", "submit", str(q)).returncode == 0
    try:
        h, job = _running_job()
        assert job["step"] == 125
        started = time.time() - (job["runtime_s"] or 0)
        deadline = time.time() + 20
        while (h.get("findings_at") is None or _iso_ts(h["findings_at"]) < started) and time.time() < deadline:
            time.sleep(0.5)
            h = _watch_json()["hosts"][0]
        assert h["findings_at"] is not None, "the watchdog never ticked"
        with metrics.open("a") as f:
            for s in range(126, 389):
                f.write(json.dumps({"step": s, "loss": 1.5}) + "\n")
        job = next(j for j in _watch_json()["hosts"][0]["jobs"] if j["name"] == "live")
        assert job["step"] == 388 and job["loss"] == 1.5
        text = gpurun("watch", "--once").stdout
        assert "388" in text
    finally:
        gpurun("queue", "cancel", "--all", "--yes")


def _iso_ts(iso: str) -> float:
    import calendar
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def test_nan_loss_is_null_in_strict_json(home, tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.9}\n{"step": 2, "loss": NaN}\n')
    q = tmp_path / "q.txt"
    q.write_text(f"[name=diverged metrics={metrics}] sleep 60\n")
    assert gpurun("queue", "submit", str(q)).returncode == 0
    try:
        _, job = _running_job()
        res = gpurun("watch", "--once", "--json")
        assert "NaN" not in res.stdout
        job = next(j for j in _strict(res.stdout)["hosts"][0]["jobs"] if j["name"] == "diverged")
        assert job["step"] == 2 and job["loss"] is None
    finally:
        gpurun("queue", "cancel", "--all", "--yes")


def test_host_line_and_finished_count(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("".join(f"[name=done{i}] true\n" for i in range(7)))
    assert gpurun("queue", "submit", str(q), "--wait").returncode == 0
    res = gpurun("watch", "--once")
    assert res.returncode == 0, res.stderr
    assert "cpu " in res.stdout and "load " in res.stdout and "mem " in res.stdout
    # five finished by default, the other two counted
    assert sum(f"done{i}" in res.stdout for i in range(7)) == 5
    assert "and 2 more finished" in res.stdout
    doc = _watch_json("--finished", "10")
    assert sorted(j["name"] for j in doc["hosts"][0]["jobs"]) == [f"done{i}" for i in range(7)]
    res = gpurun("watch", "--once", "--finished", "0")
    assert "no jobs" in res.stdout and "and 7 more finished" in res.stdout


def test_piped_watch_prints_each_poll_as_it_comes(home, tmp_path):
    # `gpurun watch | tee log`: a live view off a terminal was drawn only at exit, so the pipe got
    # nothing for as long as the watch ran; each poll is now printed whole as it comes
    q = tmp_path / "q.txt"
    q.write_text("[name=piped] true\n")
    assert gpurun("queue", "submit", str(q), "--wait").returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "watch", "--interval", "0.5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        seen, deadline = "", time.time() + 30
        while seen.count("piped") < 2 and time.time() < deadline:
            if select.select([p.stdout], [], [], max(0.0, deadline - time.time()))[0]:
                seen += p.stdout.readline()
        assert seen.count("piped") >= 2 and p.poll() is None, seen  # two polls, still watching
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err, err
