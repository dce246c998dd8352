"""Idle autostop on the box: the decision (jobs, GPU utilization, metric progress, a full quiet
window) and the rule that only the teardown-gate callable may stop the meter."""

from __future__ import annotations

import os

import pytest

from orchestrator.agent.autostop import decide, meter_stop_plan, tick
from orchestrator.agent.store import Store
from orchestrator.profiles import load_profile


def agent_config(profile: str, **autostop) -> dict:
    """What the controller sends the agent: the profile's ``autostop`` section (which carries
    the profile's meter-stop command) and the provider name."""
    auto = dict(load_profile(profile).get("autostop"), enabled=True, idle_minutes=10, util_threshold=10)
    auto.update(autostop)
    return {"provider": profile, "autostop": auto}


CFG = agent_config("runpod")


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


def test_a_profile_without_a_stop_command_only_reports(tmp_path):
    st = store_with_job(tmp_path)
    gate = Gate()
    lam = agent_config("lambda")       # an in-OS shutdown keeps billing on Lambda: no command
    tick(st, lam, gpu_utils=lambda: [0.0], gate=gate, now=5000)
    res = tick(st, lam, gpu_utils=lambda: [0.0], gate=gate, now=5600)
    assert res["action"] == "no_stop_command" and gate.plans == []
    assert "lambda profile has no in-instance stop command" in res["detail"]
    tick(st, lam, gpu_utils=lambda: [0.0], gate=gate, now=5700)
    said = [e for e in st.events() if e["kind"] == "autostop"]
    assert len(said) == 1 and "not stopping" in said[0]["message"]  # said once, not every tick


def test_irreversible_commands_need_consent():
    user = {"autostop": {"enabled": True, "command": "vastai destroy instance $CONTAINER_ID",
                         "irreversible": True}}
    assert meter_stop_plan(user)["action"] == "no_safe_verb" and meter_stop_plan(user)["command"] is None
    user["autostop"]["allow_irreversible"] = True
    assert meter_stop_plan(user)["irreversible"] is True


@pytest.mark.parametrize("profile,start", [("autodl", "/usr/bin/shutdown"), ("runpod", "runpodctl stop pod"),
                                           ("vastai", "curl -fsS -X PUT")])
def test_the_stop_command_is_the_profiles(profile, start):
    plan = meter_stop_plan(agent_config(profile))
    assert plan["command"] == load_profile(profile).get("meter_stop.how.command")
    assert plan["command"].startswith(start) and plan["irreversible"] is False


def test_the_user_command_wins_and_the_agent_knows_no_provider():
    assert meter_stop_plan(agent_config("runpod", command="my-stop"))["command"] == "my-stop"
    # the provider name alone gives no command: the agent holds no table of them
    assert meter_stop_plan({"provider": "runpod", "autostop": {"enabled": True}})["command"] is None


def test_the_controller_forwards_the_command():
    try:
        from orchestrator.core.client import host_config
    except ImportError:
        from orchestrator.core.session import host_config
    cfg = host_config({"name": "box", "profile": "autodl"})
    assert cfg["autostop"]["command"] == "/usr/bin/shutdown"
    assert "command" not in host_config({"name": "b2", "profile": "lambda"})["autostop"]


def test_disabled_by_default(tmp_path):
    st = store_with_job(tmp_path, state="queued")
    assert tick(st, {"autostop": {"enabled": False}}, gpu_utils=lambda: [0.0], gate=Gate(),
                now=1)["action"] == "disabled"
