"""Issue 11, visible: the verdict is where users look. A run that diverges and still exits 0 is
shown judged STOP (final) in ``queue status`` (terminal, piped, ``--json``), in ``watch``, in
``queue events``, in the ``queue done`` summary, and ``queue submit --wait`` exits 12. Real CLI,
real local agent daemon, real subprocesses."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from orchestrator.agent import notifications as N
from orchestrator.agent.context import AgentContext
from orchestrator.agent.store import Store
from orchestrator.errors import CLI_CODES
from rigs import webhook
from rigs.agents import gpurun

ANSI = re.compile(r"\x1b\[[0-9;]*m")

# logs 30 healthy points, then NaN, and exits 0 at once: no periodic check can stop it first
DIVERGE_EXIT0 = r'''
import json, os
with open(os.path.join(os.environ["GPURUN_RUN_DIR"], "metrics.jsonl"), "w") as f:
    for s in range(40):
        f.write(json.dumps({"step": s, "loss": 2.0 / (1 + s / 10) if s < 30 else float("nan")}) + "\n")
print("done, exit 0")
'''


def test_exit_0_run_judged_stop_at_the_end_is_visible_everywhere(home, tmp_path):
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True)
    # alert: even if a check caught it while running, it would not be stopped; it ends exit 0
    (prof / "local.yaml").write_text("quality:\n  action: alert\n  scan_s: 0.5\n")
    script = tmp_path / "diverge.py"
    script.write_text(DIVERGE_EXIT0)
    q = tmp_path / "q.txt"
    q.write_text(f"[name=vis-ok] true\n[name=vis-nan-exit0] {sys.executable} {script}\n")
    t0 = time.time()
    res = gpurun("queue", "submit", str(q), "--wait")
    waited = time.time() - t0
    assert res.returncode == CLI_CODES["quality_stop"][1] == 12, (res.stdout, res.stderr)
    assert "judged STOP by the training-quality check: vis-nan-exit0" in res.stderr
    assert "gpurun check --job vis-nan-exit0" in res.stderr and "Traceback" not in res.stderr
    assert waited < 90, waited  # the daemon's start and the CLI's calls count too (a loaded CI box)

    # piped: one line per job, QUALITY before the reason, the reason says why
    piped = gpurun("queue", "status").stdout.splitlines()
    head = piped[0].split()
    assert head[-2:] == ["QUALITY", "REASON"] and head[:4] == ["#", "NAME", "STATE", "EXIT"]
    line = next(ln for ln in piped if " vis-nan-exit0 " in ln)
    cells = line.split()
    assert cells[2:4] == ["succeeded", "0"] and cells[head.index("QUALITY")] == "STOP"
    assert "quality STOP (final): nonfinite_loss at step 30" in line
    assert next(ln for ln in piped if " vis-ok " in ln).split()[head.index("QUALITY")] == "-"  # no metrics

    # terminal: 80 columns, the verdict beside the state, the reason on its own line
    tty = gpurun("queue", "status", env=dict(__import__("os").environ, TTY_COMPATIBLE="1", COLUMNS="80"))
    lines = ANSI.sub("", tty.stdout).splitlines()
    assert all(len(ln) <= 80 for ln in lines), lines
    assert lines[0].endswith("2 succeeded; 1 judged STOP")
    row = next(ln for ln in lines if " vis-nan-exit0 " in ln).split()
    assert row[2:5] == ["succeeded", "0", "STOP"]
    assert any(ln.strip().startswith("quality STOP (final): nonfinite_loss") for ln in lines)

    # --json: the documented quality object
    js = {j["name"]: j for j in json.loads(gpurun("queue", "status", "--json").stdout)["jobs"]}
    qj = js["vis-nan-exit0"]["quality"]
    assert js["vis-nan-exit0"]["state"] == "succeeded" and js["vis-nan-exit0"]["exit_code"] == 0
    assert (qj["verdict"], qj["rule"], qj["step"], qj["final"], qj["attempt"]) == ("STOP", "nonfinite_loss", 30, True, 1)
    assert qj["source"].endswith("metrics.jsonl") and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", qj["checked_at"])
    assert Path(qj["evidence"]).exists() and json.loads(Path(qj["evidence"]).read_text())["verdict"] == "STOP"
    # the final check comes within seconds of the end (ISO seconds, so one second of rounding)
    ended = datetime.strptime(js["vis-nan-exit0"]["ended_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert 0 <= (datetime.strptime(qj["checked_at"], "%Y-%m-%dT%H:%M:%SZ") - ended).total_seconds() <= 10, qj
    assert set(qj) == {"verdict", "reason", "rule", "step", "last_step", "checked_at", "final", "attempt",
                       "source", "url", "evidence"}
    assert js["vis-ok"]["quality"]["verdict"] is None and js["vis-ok"]["quality"]["final"] is True

    # watch: the verdict column and a line naming the job and what to run
    w = gpurun("watch", "--once")
    assert w.returncode == 0, w.stderr
    assert re.search(r"quality STOP vis-nan-exit0 \(final\): nonfinite_loss at step 30", " ".join(w.stdout.split()))
    assert "gpurun check --job vis-nan-exit0" in w.stdout
    wj = json.loads(gpurun("watch", "--once", "--json").stdout)
    assert next(j for j in wj["hosts"][0]["jobs"] if j["name"] == "vis-nan-exit0")["quality"]["verdict"] == "STOP"

    # events: the verdict change, an error (notifications send it), and the queue summary
    deadline = time.time() + 15
    while True:
        evs = json.loads(gpurun("queue", "events", "--json").stdout)["events"]
        done = [e for e in evs if e["kind"] == "queue_done"]
        if done or time.time() > deadline:
            break
        time.sleep(0.5)
    stop = [e for e in evs if e["kind"] == "quality" and e["job_name"] == "vis-nan-exit0" and e["severity"] == "error"]
    assert stop and stop[-1]["data"]["verdict"] == "STOP" and stop[-1]["data"]["final"] is True
    assert done and "1 judged STOP by the quality check (vis-nan-exit0" in done[-1]["message"], evs
    assert done[-1]["data"]["quality_stop"] == 1 and done[-1]["message"].startswith("queue done: 2 succeeded")


def test_queue_done_judges_the_last_endings_first_and_counts_stops(tmp_path):
    store = Store(str(tmp_path / "gpurun.db"))
    ctx = AgentContext(str(tmp_path), store, {})
    run_dir = tmp_path / "runs" / "j1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n"
                                                   for s in range(20)) + '{"step": 20, "loss": NaN}\n' * 3)
    store.insert_jobs([{"id": "j1", "name": "div", "command": "x", "run_dir": str(run_dir),
                        "log": str(run_dir / "log.txt")}])
    N._queue_done(ctx, time.time())  # the first flush only notes where the events are
    assert store.transition("j1", ["queued"], "running", attempt=1, started_at=time.time())
    assert store.transition("j1", ["running"], "succeeded", exit_code=0, ended_at=time.time())
    N._queue_done(ctx, time.time())
    done = [e for e in store.events() if e["kind"] == "queue_done"]
    assert len(done) == 1 and done[0]["severity"] == "warn"
    assert done[0]["message"] == ("queue done: 1 succeeded; 1 judged STOP by the quality check (div; "
                                  "see `gpurun check --job NAME`)")
    assert store.get_job("j1")["quality"]["final"] is True  # judged before the summary was written
    store.close()


def test_a_stop_reaches_the_webhook_with_the_jobs_name(tmp_path, monkeypatch):
    from orchestrator.agent import notify
    from orchestrator.agent import quality_cadence as QC

    hook = contextlib.ExitStack()
    srv = hook.enter_context(webhook.serve())
    got = srv.bodies
    monkeypatch.setenv("VERDICT_HOOK", srv.url)
    store = Store(str(tmp_path / "gpurun.db"))
    ctx = AgentContext(str(tmp_path), store, {"notify": [{"kind": "generic", "url_env": "VERDICT_HOOK"}]})
    run_dir = tmp_path / "runs" / "j9"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n"
                                                   for s in range(20)) + '{"step": 20, "loss": NaN}\n' * 3)
    store.insert_jobs([{"id": "j9", "name": "lr-too-high", "command": "x", "run_dir": str(run_dir),
                        "log": str(run_dir / "log.txt")}])
    assert store.transition("j9", ["queued"], "running", attempt=1, started_at=time.time())
    try:
        QC.tick(ctx)  # enough points (and a NaN): judged at once
        N.flush_notifications(ctx)
        n = notify.notifier_for(ctx.state_dir, ctx.config)
        assert n is not None and n.flush(10)
        stops = [b for b in got if b["kind"] == "quality" and b["severity"] == "error"]
        assert stops and "quality STOP for lr-too-high" in stops[0]["message"]
        assert stops[0]["data"]["rule"] == "nonfinite_loss" and stops[0]["data"]["evidence"]
    finally:
        notify._CACHE.clear()
        hook.close()
        store.close()
