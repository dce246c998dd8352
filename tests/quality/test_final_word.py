"""The final word: a run that ENDED on a non-finite train loss is a STOP, even on one point.

"Never STOP on one noisy point" protects a running job (the next logs may heal it); a job that
has ended has no next log, and its last weights are the NaN/Inf ones. ``judge(final=True)`` is
what the agent's check after a job ends, ``gpurun check --final`` and ``gpurun check --job`` on
an ended job use; prefixes of a running job and the resume gate's cut are never final.
Real parts: a real dev-corpus log, the real CLI (click runner), a real SQLite store.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from orchestrator.agent import control
from orchestrator.agent import quality_hook as QH
from orchestrator.agent.framing import unframe
from orchestrator.agent.store import Store
from orchestrator.cli.main import cli
from orchestrator.quality.judge import check, judge
from orchestrator.quality.sources import Tracker

DEV = Path(__file__).resolve().parent / "corpus" / "dev"
T0 = 1_700_000_000.0


def _cli(*args: str):
    return CliRunner().invoke(cli, ["check", *args], catch_exceptions=False)


def _loss(s: int) -> float:
    return 4.0 * (s + 50) ** -0.3 * (1 + 0.01 * math.sin(s))


def _healthy(path: Path, n: int, tail=()) -> None:
    with open(path, "w") as f:
        for s in range(n):
            f.write(json.dumps({"step": s, "loss": _loss(s)}) + "\n")
        for s, v in tail:
            f.write(json.dumps({"step": s, "loss": v}) + "\n")


def test_real_log_ending_on_one_nan(tmp_path):
    # a Keras verbose=2 epoch line `loss: nan - val_loss: 1.1921e-07`: the run died there
    log = str(DEV / "issue_deeptl_i14_keras_verbose2_nan.log")
    running = _cli(log, "--json")
    assert running.exit_code == 10, running.output  # a running job: one point, re-check soon
    out = json.loads(running.output)
    assert out["verdict"] == "WAIT" and out["final"] is False
    ended = _cli(log, "--json", "--final")
    assert ended.exit_code == 11, ended.output
    out = json.loads(ended.output)
    assert out["verdict"] == "STOP" and out["final"] is True
    assert out["reason"].startswith("nonfinite_loss") and "ended_nonfinite=True" in out["reason"]
    stop = [f for f in out["findings"] if f["severity"] == "stop"]
    assert stop[0]["series"] == "loss" and "ended on a NaN/Inf" in stop[0]["hint"]
    human = _cli(log, "--final")  # the plain output names it too, in 80 columns
    assert human.exit_code == 11 and human.output.startswith("STOP  nonfinite_loss")


def test_final_on_synthetic_runs_and_the_agent(tmp_path):
    m = tmp_path / "metrics.jsonl"
    _healthy(m, 300, [(300, float("nan"))])
    run = Tracker([str(m)]).update()
    assert judge(run, {})["verdict"] == "WAIT"
    v = judge(run, {}, final=True)
    assert v["verdict"] == "STOP" and v["findings"][0]["step"] == 300
    assert v["findings"][0]["evidence"]["last_finite"]["step"] == 299
    # the resume gate's view is a cut with a future: never final, whatever the caller says
    assert check(str(m), {"final": True}, upto_step=300)["verdict"] == "WAIT"
    # healthy endings are never STOPped by the final word: a NaN healed before the end, an inf
    # in the eval loss beside an eval accuracy that says the model works, a clean run
    for tail in ([(300, float("nan")), (301, _loss(301))], [], [(300, _loss(300))]):
        _healthy(m, 300, tail)
        v = check(str(m), final=True)
        assert v["verdict"] == "CONTINUE", (tail, v["reason"])
    with open(m, "a") as f:
        f.write(json.dumps({"step": 301, "eval_loss": float("inf"), "eval_accuracy": 0.91}) + "\n")
    assert check(str(m), final=True)["verdict"] != "STOP"

    # the agent: a running job's check WAITs; the check after it ended records a final STOP and
    # saves the evidence, and stops nothing (the job is over)
    store = Store(str(tmp_path / "agent.db"))
    try:
        rd = tmp_path / "runs" / "j1"
        rd.mkdir(parents=True)
        _healthy(rd / "metrics.jsonl", 300, [(300, float("nan"))])
        store.insert_jobs([{"id": "j1", "name": "train", "command": "python train.py", "run_dir": str(rd),
                            "log": str(rd / "stdout.log")}])
        assert store.transition("j1", ["queued"], "running", attempt=1, started_at=T0)
        res = QH.periodic_check(store, store.get_job("j1"), T0 + 60, {})
        assert res["verdict"] == "WAIT" and not res["stop"]
        assert store.transition("j1", ["running"], "succeeded", exit_code=0, ended_at=T0 + 61)
        res = QH.periodic_check(store, store.get_job("j1"), T0 + 62, {}, final=True, trigger="ended")
        assert res["verdict"] == "STOP" and not res["stop"] and res["evidence_path"]
        rec = store.get_job("j1")["quality"]
        rec = json.loads(rec) if isinstance(rec, str) else rec
        assert rec["verdict"] == "STOP" and rec["final"] and rec["rule"] == "nonfinite_loss"
        assert json.load(open(res["evidence_path"]))["final"] is True
    finally:
        store.close()


def test_check_verb_judges_an_ended_job_as_final(tmp_path):
    # `gpurun check --job NAME` asks the agent's `check` verb: a job that has ended is judged as
    # its final check judged it, a running one as a running job (the agent process, for real)
    state = tmp_path / "state"
    state.mkdir()
    store = Store(control.files(str(state))["db"])
    try:
        for jid, end in (("j1", False), ("j2", True)):
            rd = tmp_path / "runs" / jid
            rd.mkdir(parents=True)
            _healthy(rd / "metrics.jsonl", 300, [(300, float("nan"))])
            store.insert_jobs([{"id": jid, "name": "train-" + jid, "command": "python train.py",
                                "run_dir": str(rd), "log": str(rd / "stdout.log"), "env": {}}])
            assert store.transition(jid, ["queued"], "running", attempt=1, started_at=T0)
            if end:
                assert store.transition(jid, ["running"], "failed", exit_code=1, ended_at=T0 + 9)
    finally:
        store.close()
    got = {}
    for name in ("train-j1", "train-j2"):
        p = subprocess.run([sys.executable, "-m", "orchestrator.agent", "check", "--state-dir", str(state)],
                           input=json.dumps({"job": name}), capture_output=True, text=True, timeout=60)
        reply = unframe(p.stdout)
        assert reply["ok"], p.stderr
        got[name] = reply["result"]
    assert got["train-j1"]["verdict"] == "WAIT" and got["train-j1"]["final"] is False
    assert got["train-j2"]["verdict"] == "STOP" and got["train-j2"]["final"] is True
    assert got["train-j2"]["job"]["state"] == "failed"


def test_a_run_that_ended_at_a_diverged_level_stops(tmp_path):
    # YOLOv2's total loss 11-16, then its bbox term blows it to 760 and 822 on the last two logs.
    # Running, the divergence is a warn (the next logs may come back, and a rise that stays is
    # level_shift's or divergence_best's); ended, there is no later log: the job's last weights
    # sit at 50x its level
    vals = [11.044, 11.974, 12.925, 15.75, 16.09, 11.889, 14.579, 15.649, 37.384, 70.079, 15.072, 759.924, 822.332]
    log = tmp_path / "yolo.jsonl"
    log.write_text("".join(json.dumps({"step": 30 + 10 * i, "loss": v}) + "\n" for i, v in enumerate(vals)))
    running = json.loads(_cli(str(log), "--json").output)
    assert running["verdict"] == "WAIT"
    assert [(f["severity"], f["evidence"].get("running")) for f in running["findings"]
            if f["code"] == "divergence"] == [("warn", True)]
    ended = _cli(str(log), "--json", "--final")
    assert ended.exit_code == 11, ended.output
    assert json.loads(ended.output)["reason"].startswith("divergence")
    # a healthy run that ended is untouched by it
    healthy = tmp_path / "ok.jsonl"
    _healthy(healthy, 200)
    assert json.loads(_cli(str(healthy), "--json", "--final").output)["verdict"] == "CONTINUE"


def _lines(tmp_path: Path, lines, name="train.log"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return Tracker([str(p)]).update()


def test_an_ended_run_that_never_left_chance_is_a_stop_on_three_logs(tmp_path):
    # glog's solver prints: 3 logs at ln(1000) and nothing else; while it runs that is a WAIT (5
    # logged steps make a streak), once it has ended it is every log the run ever wrote
    lines = ["I0127 08:5%d:57.6 37204 solver.cpp:68] Iteration %d, loss = %s" % (i, 100 + 20 * i, v)
             for i, v in enumerate(("6.9063", "6.90727", "6.9073"))]
    run = _lines(tmp_path, lines)
    assert judge(run)["verdict"] == "WAIT"
    out = judge(run, final=True)
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "chance_stuck"
    # one log off ln K: it left chance once, the streak rule's 5 logs decide
    lines[0] = lines[0].replace("6.9063", "7.5000")
    assert judge(_lines(tmp_path, lines), final=True)["verdict"] != "STOP"


def test_an_ended_run_that_logged_only_zero_losses_is_a_collapse(tmp_path):
    lines = ["{'loss': 0.0, 'learning_rate': %s, 'epoch': %s}" % (7.8e-07 * (i + 1), 0.01 * (i + 1))
             for i in range(2)]
    run = _lines(tmp_path, lines)
    assert judge(run)["verdict"] != "STOP"
    out = judge(run, final=True)
    assert out["verdict"] == "STOP" and out["findings"][0]["code"] == "loss_collapse"
    assert out["findings"][0]["evidence"]["from_start"]


def test_an_rl_run_that_ended_at_zero_loss_with_its_reward_moving_is_not(tmp_path):
    # GRPO's loss is exactly 0 on its first logs by construction; its reward says it learns
    lines = ["{'loss': 0.0, 'learning_rate': 1e-06, 'reward': %s, 'kl': 0.0, 'epoch': %s}"
             % (0.2 + 0.1 * i, 0.01 * (i + 1)) for i in range(3)]
    assert judge(_lines(tmp_path, lines), final=True)["verdict"] != "STOP"


def test_the_collapse_hint_names_the_grad_norm_only_as_the_log_shows_it(tmp_path):
    # a log with no grad norm is not told it had a NaN one; a log with one is told what it read
    cases = {"none": ("{'loss': 0.5}", "{'loss': 0.0}"),
             "bad": ("{'loss': 0.5, 'grad_norm': 1.2}", "{'loss': 0.0, 'grad_norm': 0.0}")}
    hints = {}
    for name, lines in cases.items():
        p = tmp_path / ("%s.log" % name)
        p.write_text("\n".join(lines) + "\n")
        res = _cli("--final", "--json", str(p))
        assert res.exit_code == 11, res.output  # STOP
        out = json.loads(res.output)
        (f,) = [f for f in out["findings"] if f["code"] == "loss_collapse"]
        hints[name] = f["hint"]
    assert "grad norm" not in hints["none"].split(":")[0] and "Log the grad norm" in hints["none"]
    assert hints["bad"].startswith("loss exactly 0.0 with a NaN or zero grad norm")


def test_an_ended_run_is_not_told_to_wait_for_more(tmp_path):
    # a running job's short log waits for more data; an ended one gets none, and its flat start
    # will never be told apart by "the next checks"
    short = tmp_path / "short.log"
    short.write_text("{'loss': 2.3}\n{'loss': 2.2}\n{'loss': 2.25}\n")
    running, ended = json.loads(_cli("--json", str(short)).output), json.loads(_cli("--final", "--json", str(short)).output)
    assert running["verdict"] == ended["verdict"] == "WAIT"
    assert running["reason"].startswith("not enough data yet") and "has ended" in ended["reason"]
    flat = tmp_path / "flat.log"
    flat.write_text("".join("epoch %d/25 loss=%.5f\n" % (e, 1.9455 + 1e-5 * ((e * 7) % 11) + 1e-6 * e) for e in range(1, 26)))
    for args, said in ((("--json",), "the next checks will tell"), (("--final", "--json"), "the run ended")):
        out = json.loads(_cli(*args, str(flat)).output)
        (f,) = [f for f in out["findings"] if f["code"] == "flat_start"]
        assert out["verdict"] == "WAIT" and said in f["hint"]
