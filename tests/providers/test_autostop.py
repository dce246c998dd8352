"""Idle autostop on the box: the decision (jobs, GPU utilization, metric progress, a full quiet
window) and the rule that only the teardown-gate callable may stop the meter."""

from __future__ import annotations

import os

from orchestrator.agent.autostop import decide, meter_stop_plan, tick
from orchestrator.agent.store import Store

CFG = {"provider": "runpod", "autostop": {"enabled": True, "idle_minutes": 10, "util_threshold": 10}}


def store_with_job(tmp_path, state="succeeded", metrics=None, ended_at=1000.0):
    st = Store(str(tmp_path / "jobs.db"))
    st.insert_jobs([{"id": "j1", "name": "train", "command": "python t.py", "run_dir": str(tmp_path),
                     "log": str(tmp_path / "log"), "metrics": metrics}])
    if state != "queued":
        st.transition("j1", ["queued"], "running", started_at=900.0)
        if state != "running":
            st.transition("j1", ["running"], state, ended_at=ended_at)
    return st


class Gate:
    def __init__(self, passed=True):
        self.passed, self.plans = passed, []

    def __call__(self, plan):
        self.plans.append(plan)
        return {"passed": self.passed, "detail": "3 artifacts verified" if self.passed else "1 missing"}


def test_busy_reasons():
    job = [{"state": "running"}]
    assert decide(job, [0.0], now=5000, idle_minutes=10)["reasons"][0].startswith("1 job")
    d = decide([], [55.0, 1.0], now=5000, idle_minutes=10)
    assert not d["idle"] and "GPU" in d["reasons"][0]
    assert not decide([], [None], now=5000, idle_minutes=10)["idle"]     # unreadable GPU = busy
    assert decide([], [], now=5000, idle_minutes=10)["idle"]


def test_recent_metric_write_counts_as_progress(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text("{}\n")
    os.utime(m, (4900, 4900))
    d = decide([{"state": "succeeded", "metrics": str(m)}], [0.0], now=5000, idle_minutes=10)
    assert not d["idle"] and "metric progress 100s ago" in d["reasons"]


def test_stops_only_after_a_full_quiet_window_and_through_the_gate(tmp_path):
    st = store_with_job(tmp_path)
    gate = Gate()
    first = tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5000)
    assert first["action"] == "idle" and gate.plans == []
    mid = tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5000 + 300)
    assert mid["action"] == "idle" and mid["idle_for_s"] == 300
    done = tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5000 + 600)
    assert done["action"] == "stopped" and len(gate.plans) == 1
    assert gate.plans[0]["command"].startswith("runpodctl stop pod") and not gate.plans[0]["irreversible"]
    assert any(e["kind"] == "autostop" and "meter stopped" in e["message"] for e in st.events())


def test_activity_resets_the_window(tmp_path):
    st = store_with_job(tmp_path)
    gate = Gate()
    tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5000)
    assert tick(st, CFG, gpu_utils=lambda: [90.0], gate=gate, now=5300)["action"] == "busy"
    again = tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5700)
    assert again["action"] == "idle" and again["idle_for_s"] == 0 and gate.plans == []


def test_gate_refusal_stops_nothing(tmp_path):
    st = store_with_job(tmp_path)
    gate = Gate(passed=False)
    tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5000)
    res = tick(st, CFG, gpu_utils=lambda: [0.0], gate=gate, now=5600)
    assert res["action"] == "gate_refused" and res["detail"] == "1 missing"
    assert any(e["severity"] == "warn" and "refused" in e["message"] for e in st.events())


def test_no_safe_verb_means_no_stop(tmp_path):
    st = store_with_job(tmp_path)
    gate = Gate()
    lam = dict(CFG, provider="lambda")       # an in-OS shutdown keeps billing on Lambda
    tick(st, lam, gpu_utils=lambda: [0.0], gate=gate, now=5000)
    assert tick(st, lam, gpu_utils=lambda: [0.0], gate=gate, now=5600)["action"] == "no_safe_verb"
    assert gate.plans == []
    user = {"autostop": {"enabled": True, "command": "vastai destroy instance $CONTAINER_ID",
                         "irreversible": True}}
    assert meter_stop_plan(user) is None
    user["autostop"]["allow_irreversible"] = True
    assert meter_stop_plan(user)["irreversible"] is True
    assert meter_stop_plan({"provider": "vastai"})["command"].startswith("curl")


def test_disabled_by_default(tmp_path):
    st = store_with_job(tmp_path, state="queued")
    assert tick(st, {"autostop": {"enabled": False}}, gpu_utils=lambda: [0.0], gate=Gate(),
                now=1)["action"] == "disabled"
