"""The built-in reviewer against a real loopback HTTP server speaking the chat-completions shape:
plain answers, timeouts, 429/500, rambling, what the request carries, that clear verdicts never
ask, and the two ways in: ``gpurun check --host local --job J`` (the agent asks) and the
agent's periodic check with ``quality.reviewer`` in the profile."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
import time
import types

import pytest

from orchestrator.quality import reviewer as RV
from orchestrator.quality.judge import judge
from orchestrator.quality.series import Run
from orchestrator.quality.sources import Tracker
from quality.synth import make_curve, write
from rigs.agents import gpurun, kill_agents_under
from rigs.chat import chat_server

KEY = "sk-test-0123456789abcdefSECRET"


@pytest.fixture
def chat():
    """A chat-completions server on loopback; ``script`` = [(status, content, delay_s, raw_body)]."""
    with chat_server() as srv:
        yield srv


def _flat(path, n=400, every=10, level=2.30):
    """A run that never learns: flat at its initial loss from step 0 (no NaN, no divergence)."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"step": (i + 1) * every, "loss": level * (1 + 0.003 * math.sin(i * 1.7)),
                                "eval_loss": level + 0.01} if i % 50 == 49 else
                               {"step": (i + 1) * every, "loss": level * (1 + 0.003 * math.sin(i * 1.7))}) + "\n")
    return str(path)


def _opts(srv, timeout=5, key_env="REVIEW_KEY"):
    return {"reviewer": RV.settings({"base_url": srv.url, "model": "judge-model", "key_env": key_env,
                                     "timeout_s": timeout}),
            "reviewer_key": {"REVIEW_KEY": KEY}.get}


def _judge(path, opts):
    return judge(Tracker([path]).update(), opts)


@pytest.fixture
def flat(tmp_path):
    p = _flat(tmp_path / "flat.jsonl")
    v = _judge(p, {})
    assert v["verdict"] == "STOP" and v["findings"][0]["code"] == "no_learning"  # flat, nothing broken
    return p


# --- the one definition of "ambiguous" -------------------------------------------------------

def _f(code, sev="warn"):
    return {"code": code, "severity": sev, "step": 100, "series": "loss", "evidence": {}, "hint": ""}


@pytest.mark.parametrize("findings,last,planned,want", [
    ([], 1000, None, None),                                                     # clean CONTINUE
    ([_f("slightly_worse", "info")], 1000, None, None),                         # info never asks
    ([_f("no_learning", "stop")], 4000, None, "no_learning"),                   # flat, not diverging
    ([_f("frozen")], 4000, None, "frozen"),
    ([_f("flat_start")], 1000, None, "flat_start"),                            # flat from the first log
    ([_f("frozen", "stop")], 4000, None, None),                                 # frozen to 7 digits: clear
    ([_f("chance_stuck", "stop")], 4000, None, None),                           # at ln(K): clear
    ([_f("level_shift")], 1000, None, "level_shift"),                           # up, not (yet) a STOP
    ([_f("level_shift", "stop")], 1000, None, None),
    ([_f("lr_rising")], 1000, None, None),                                      # a schedule warn: no doubt
    ([_f("spike")], 1000, None, "spike"),                                       # noisy, no clear trend
    ([_f("divergence")], 1000, None, "divergence"),
    ([_f("eval_regression")], 1000, None, "eval_regression"),
    ([_f("below_baseline")], 1000, 10000, "below_baseline"),                    # slightly worse, early
    ([_f("below_baseline")], 9000, 10000, None),                                # ... but late: the WAIT stands
    ([_f("below_baseline", "stop")], 1000, 10000, None),                        # significantly worse: clear
    ([_f("divergence", "stop")], 1000, None, None),                             # clear STOP
    ([_f("nonfinite_loss", "stop")], 1000, None, None),
    ([_f("nonfinite_loss"), _f("spike")], 1000, None, None),                    # NaN is never unsure
    ([_f("no_learning", "stop"), _f("spike_unrecovered", "stop")], 1000, None, None),
    ([_f("throughput_drop")], 1000, None, None),                                # not a quality doubt
    ([_f("throughput_drop"), _f("spike")], 1000, None, "spike"),
])
def test_ambiguity(findings, last, planned, want):
    v = {"verdict": "WAIT", "findings": findings, "points": 400, "last_step": last, "unreadable": []}
    got = RV.ambiguity(v, planned)
    assert (got["code"] if got else None) == want
    assert RV.ambiguity(dict(v, points=5), planned) is None                      # too little data
    assert RV.ambiguity(dict(v, unreadable=["gone"]), planned) is None


def test_a_doubt_is_judged_on_its_own_series_points():
    # 5 train-loss logs beside 40 evals whose loss rose: the eval series is enough to ask about;
    # a doubt on a 5-point series of a 5-point run is still too little data
    ev = dict(_f("eval_regression"), series="val_loss", points=40)
    v = {"verdict": "WAIT", "findings": [ev], "points": 5, "last_step": 50, "unreadable": []}
    assert RV.ambiguity(v)["code"] == "eval_regression"
    assert RV.ambiguity(dict(v, findings=[dict(ev, points=5)])) is None
    # ... and a long loss is enough for a doubt on a short series (4 evals that rose, 400 logs)
    assert RV.ambiguity(dict(v, points=400, findings=[dict(ev, points=4)]))["code"] == "eval_regression"


def test_the_judge_notes_each_doubts_points():
    run = Run("mem")
    for i in range(5):
        run.add_record(100.0 * (i + 1), [("loss", 1.0 - 0.01 * i)])
    for i in range(40):
        run.add_record(10.0 * (i + 1), [("val_loss", 0.5 + 0.02 * i)])
    v = judge(run)
    assert all(f["points"] == len(run.series[f["series"]]) for f in v["findings"] if f["severity"] != "info")
    assert any(f["series"] == "val_loss" and f["points"] == 40 for f in v["findings"])


def test_an_ended_short_run_asks_a_running_one_waits():
    # too few points for the trend rules: a running job waits for more, an ended one never gets them
    v = {"verdict": "WAIT", "findings": [], "points": 5, "last_step": 50, "unreadable": [], "final": True}
    got = RV.ambiguity(v)
    assert got["code"] == "short_ended" and got["evidence"] == {"points": 5, "needed": 13}
    assert RV.ambiguity(dict(v, final=False)) is None
    assert RV.ambiguity(dict(v, points=1)) is None                               # one point: nothing to judge
    assert RV.ambiguity(dict(v, verdict="STOP", findings=[_f("chance_stuck", "stop")])) is None
    assert RV.ambiguity(dict(v, findings=[_f("nonfinite_loss")])) is None         # NaN is never unsure


def test_the_reviewer_judges_an_ended_short_climb(chat, tmp_path):
    # 6 logs, 12 -> 18 with two falls on the way: the rules wait for 13 points (a climb on every
    # log is theirs, ``rules_short``); after the run ended, the reviewer is asked once, with every
    # point, and its answer is the verdict
    p = tmp_path / "short.log"
    p.write_text("".join("Iteration %d, loss = %s\n" % (100 * i, v)
                         for i, v in enumerate(("12.1", "13.5", "12.9", "14.4", "13.9", "18.3"))))
    run = Tracker([str(p)]).update()
    chat.answer = "STOP"
    assert judge(run, _opts(chat))["verdict"] == "WAIT" and chat.received == []   # still running
    v = judge(run, _opts(chat), final=True)
    assert v["verdict"] == "STOP" and v["reviewer"]["in_doubt"] == "short_ended"
    prompt = chat.received[0]["body"]["messages"][-1]["content"]
    assert "500: 18.3" in prompt and "0: 12.1" in prompt and "too few logged points" in prompt
    assert len(chat.received) == 1


@pytest.mark.parametrize("text,want", [
    ("STOP", "STOP"), ("continue", "CONTINUE"), (" Wait.\n", "WAIT"), ("**STOP**", "STOP"), ('"CONTINUE!"', "CONTINUE"),
    ("STOP CONTINUE", "WAIT"), ("I think you should STOP", "WAIT"), ("", "WAIT"), ("STOPPED", "WAIT"),
])
def test_parse_answer(text, want):
    answer, note = RV.parse_answer(text)
    assert answer == want and (bool(note) == (want == "WAIT" and text.strip(" .\n") != "Wait"))


def test_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="base_url"):
        RV.settings({"base_url": "ftp://x", "model": "m"})
    with pytest.raises(ValueError, match="model"):
        RV.settings({"base_url": "http://x"})
    with pytest.raises(ValueError, match="key_env"):
        RV.settings({"base_url": "http://x", "model": "m", "key_env": KEY})
    with pytest.raises(ValueError, match="unknown key"):
        RV.settings({"base_url": "http://x", "model": "m", "key": KEY})
    assert RV.settings({"base_url": "http://x/v1/", "model": "m"})["base_url"] == "http://x/v1"


# --- the HTTP reviewer -----------------------------------------------------------------------

@pytest.mark.parametrize("content,want", [("STOP", "STOP"), ("CONTINUE", "CONTINUE"), ("WAIT", "WAIT"),
                                          ("continue.\n", "CONTINUE")])
def test_plain_answer_is_the_verdict(chat, flat, content, want):
    chat.answer = content
    v = _judge(flat, _opts(chat))
    assert v["verdict"] == want and v["reviewer"]["answer"] == want and v["reviewer"]["answered"]
    assert len(chat.received) == 1 and v["reviewer"]["status"] == 200
    assert v["reviewer"]["judge_verdict"] == "STOP" and v["reviewer"]["in_doubt"] == "no_learning"
    assert "reviewer answered %s on no_learning" % want in v["reason"]
    assert v["findings"][-1]["code"] == "reviewer"


def test_request_carries_last_10_losses_the_doubt_and_the_key(chat, flat):
    run = Tracker([flat]).update()
    v = judge(run, dict(_opts(chat), run_id="flat-run"))
    req = chat.received[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer " + KEY
    body = req["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and 0 < body["max_tokens"] <= 32
    prompt = body["messages"][-1]["content"]
    s = run.main_loss()
    for step, val in zip(s.steps[-10:], s.values[-10:]):
        assert "%d: %s" % (step, "%.6g" % val) in prompt
    assert "%d: " % s.steps[-11] not in prompt                                    # exactly the last 10
    assert "Run: flat-run" in prompt and "Current step: 4000 / unknown total" in prompt
    assert "What I'm unsure about: the loss is flat but not diverging" in prompt and "no_learning" in prompt
    assert "eval_loss [" in prompt and "Baseline" not in prompt                  # none declared
    assert "exactly one word" in prompt
    assert v["reviewer"]["question"] == prompt
    assert KEY not in json.dumps(v, default=str)                                  # never recorded


def test_baseline_is_in_the_question_when_declared(chat, flat):
    opts = dict(_opts(chat), baseline={"eval_loss": {1000.0: 2.0, 8000.0: 1.5}})
    _judge(flat, opts)
    assert "Baseline reference: eval_loss 2 at step 1000 (reference run; 1.5 at its last step 8000)" in \
        chat.received[0]["body"]["messages"][-1]["content"]


@pytest.mark.parametrize("script,note", [
    ([(200, "STOP", 3, None)], "timed out after 0.5s"),
    ([(429, "", 0, b'{"error": "slow down"}')], "HTTP 429 (rate limited)"),
    ([(500, "", 0, b"oops")], "HTTP 500 (server error)"),
    ([(503, "", 0, b"")], "HTTP 503 (server error)"),
    ([(200, "The loss is flat, so I would probably stop, but maybe wait.", 0, None)], "unusable reviewer answer"),
    ([(200, "STOP CONTINUE", 0, None)], "unusable reviewer answer"),
    ([(200, "", 0, b"not json")], "malformed reviewer reply"),
    ([(200, "", 0, b'{"choices": []}')], "malformed reviewer reply"),
])
def test_errors_and_rambling_are_wait_never_stop(chat, flat, script, note):
    chat.script = list(script)
    t0 = time.monotonic()
    v = _judge(flat, _opts(chat, timeout=0.5))
    assert time.monotonic() - t0 < 2.5
    assert v["verdict"] == "WAIT" and v["reviewer"]["answer"] == "WAIT" and not v["reviewer"]["answered"]
    assert note in v["reviewer"]["note"] and note in v["reason"]                  # the reason is recorded
    assert len(chat.received) == 1


def test_unreachable_and_missing_key_are_wait(chat, flat):
    port = chat.server_address[1]
    chat.shutdown()
    chat.server_close()
    v = _judge(flat, {"reviewer": RV.settings({"base_url": "http://127.0.0.1:%d/v1" % port, "model": "m",
                                               "timeout_s": 2})})
    assert v["verdict"] == "WAIT" and "unreachable" in v["reviewer"]["note"]
    v = _judge(flat, dict(_opts(chat), reviewer_key=lambda name: None))
    assert v["verdict"] == "WAIT" and "REVIEW_KEY is not set" in v["reason"] and "gpurun secret set" in v["reason"]


def test_error_body_echoing_the_key_is_scrubbed(chat, flat):
    chat.script = [(200, "", 0, ('{"error": "bad key %s"}' % KEY).encode())]
    v = _judge(flat, _opts(chat))
    assert v["verdict"] == "WAIT" and KEY not in json.dumps(v, default=str) and "***" in v["reviewer"]["note"]


@pytest.mark.parametrize("cls,verdict", [("nan", "STOP"), ("healthy", "CONTINUE")])
def test_clear_runs_send_no_request(chat, tmp_path, cls, verdict):
    p = write(make_curve(cls, 0), "jsonl", str(tmp_path / cls))
    v = _judge(p, _opts(chat))
    assert v["verdict"] == verdict and "reviewer" not in v
    assert chat.received == []


def test_command_reviewer_asked_for_a_flat_stop_too(tmp_path, flat):
    seen = tmp_path / "seen.json"
    v = _judge(flat, {"reviewer_command": "cat > %s; echo CONTINUE plateau is fine" % seen})
    assert v["verdict"] == "CONTINUE" and v["reviewer"]["kind"] == "command"
    got = json.loads(seen.read_text())
    assert got["finding"]["code"] == "no_learning" and "What I'm unsure about" in got["prompt"]


# --- the agent's key, the check verb and the periodic check -----------------------------------

def test_key_lookup_prefers_the_secrets_file(monkeypatch, tmp_path):
    import orchestrator.agent as agent_pkg
    from orchestrator.agent.quality_hook import key_lookup
    fake = types.ModuleType("orchestrator.agent.secrets")
    fake.load = lambda state_dir: {"REVIEW_KEY": "from-secrets"} if state_dir == str(tmp_path) else {}
    monkeypatch.setitem(sys.modules, "orchestrator.agent.secrets", fake)
    monkeypatch.setattr(agent_pkg, "secrets", fake, raising=False)
    monkeypatch.setenv("REVIEW_KEY", "from-env")
    monkeypatch.setenv("OTHER_KEY", "other-env")
    look = key_lookup(str(tmp_path))
    assert look("REVIEW_KEY") == "from-secrets" and look("OTHER_KEY") == "other-env"
    assert key_lookup(None)("REVIEW_KEY") == "from-env"


@pytest.fixture
def local_home(isolated_home):
    yield isolated_home
    kill_agents_under(isolated_home)


def test_cli_check_on_host_local_job_reaches_the_reviewer(chat, local_home, tmp_path):
    metrics = _flat(tmp_path / "flat.jsonl")
    q = tmp_path / "q.txt"
    q.write_text("[name=flat metrics=%s] echo done\n" % metrics)
    env = dict(os.environ, REVIEW_KEY=KEY)
    env.pop("GPURUN_HOST", None)
    res = gpurun("queue", "submit", str(q), "--wait", env=env)
    assert res.returncode == 12, res.stderr  # its final check judges the flat run STOP: --wait says so
    chat.answer = "STOP"
    res = gpurun("check", "--host", "local", "--job", "flat", "--json", "--reviewer-url", chat.url,
                 "--reviewer-model", "judge-model", "--reviewer-key-env", "REVIEW_KEY", env=env)
    assert res.returncode == 11, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["verdict"] == "STOP" and out["reviewer"]["answer"] == "STOP"
    assert out["reviewer"]["model"] == "judge-model"
    assert len(chat.received) == 1 and chat.received[0]["headers"]["Authorization"] == "Bearer " + KEY
    assert "Run: flat (job" in chat.received[0]["body"]["messages"][-1]["content"]
    assert KEY not in res.stdout
    # kept on the box: an event of kind "reviewer" and an evidence file, neither with the key
    from orchestrator import paths
    con = sqlite3.connect(str(paths.local_state_dir("local") / "gpurun.db"))
    rows = con.execute("SELECT message, data FROM events WHERE kind='reviewer'").fetchall()
    con.close()
    assert len(rows) == 1 and "answered STOP on no_learning" in rows[0][0]
    data = json.loads(rows[0][1])
    assert "What I'm unsure about" in data["question"] and data["answer"] == "STOP" and KEY not in rows[0][1]
    ev = open(data["evidence"]).read()
    assert '"question"' in ev and KEY not in ev and out["reviewer"]["evidence"] == data["evidence"]
    # human output names the reviewer; a bad flag pair is exit 2
    res = gpurun("check", "--host", "local", "--job", "flat", "--reviewer-url", chat.url, env=env)
    assert res.returncode == 2 and "go together" in res.stderr


def test_periodic_check_with_profile_reviewer_reaches_it(chat, isolated_home, tmp_path, monkeypatch):
    from orchestrator import paths
    from orchestrator.agent import quality_hook as QH
    from orchestrator.agent.store import Store
    from orchestrator.core.client import host_config
    udir = paths.user_profiles_dir()
    udir.mkdir(parents=True, exist_ok=True)
    (udir / "local.yaml").write_text("quality:\n  action: alert\n  reviewer:\n    base_url: %s\n"
                                     "    model: judge-model\n    key_env: REVIEW_KEY\n    timeout_s: 5\n" % chat.url)
    cfg = host_config({"name": "local", "profile": "local"})
    assert cfg["quality"]["reviewer"]["model"] == "judge-model"
    monkeypatch.setenv("REVIEW_KEY", KEY)
    state = tmp_path / "state"
    state.mkdir()
    store = Store(str(state / "gpurun.db"))
    run_dir = tmp_path / "runs" / "j1"
    run_dir.mkdir(parents=True)
    _flat(run_dir / "metrics.jsonl")
    store.insert_jobs([{"id": "j1", "name": "flat", "command": "python train.py", "run_dir": str(run_dir),
                        "log": str(run_dir / "stdout.log")}])
    assert store.transition("j1", ["queued"], "running", attempt=1, started_at=1000.0)
    job = store.get_job("j1")
    chat.answer = "CONTINUE"
    res = QH.periodic_check(store, job, 2000.0, cfg, str(state))
    assert len(chat.received) == 1 and chat.received[0]["headers"]["Authorization"] == "Bearer " + KEY
    assert res["verdict"] == "CONTINUE" and res["reviewer"]["answer"] == "CONTINUE" and not res["stop"]
    assert res["interval_s"] == 600  # a reviewer's CONTINUE lets the cadence grow (1 min -> 10), as the seed says
    ev = [e for e in store.events(job_id="j1") if e["kind"] == "reviewer"]
    assert len(ev) == 1 and ev[0]["data"]["in_doubt"] == "no_learning" and KEY not in json.dumps(ev)
    assert os.path.exists(res["review_path"]) and KEY not in open(res["review_path"]).read()
    store.close()


def test_an_answer_stands_until_the_run_has_grown_or_an_hour_passed(chat, tmp_path):
    """A run in doubt is checked each minute; the reviewer is asked again only once the loss has
    grown by a quarter (10 points at least), the doubt changed, or an hour passed."""
    from orchestrator.agent import quality_hook as QH
    from orchestrator.agent.store import Store
    cfg = {"quality": {"action": "alert", "reviewer": {"base_url": chat.url, "model": "judge-model"}}}
    store = Store(str(tmp_path / "gpurun.db"))
    run_dir = tmp_path / "runs" / "j1"
    run_dir.mkdir(parents=True)
    metrics = _flat(run_dir / "metrics.jsonl", n=100, level=1.7)
    store.insert_jobs([{"id": "j1", "name": "flat", "command": "true", "run_dir": str(run_dir),
                        "log": str(run_dir / "stdout.log")}])
    assert store.transition("j1", ["queued"], "running", attempt=1, started_at=1000.0)
    chat.answer = "WAIT"

    def check(now):
        return QH.periodic_check(store, store.get_job("j1"), now, cfg, str(tmp_path))

    def grow(n):  # n more flat points after the last one
        rows = [json.loads(x) for x in open(metrics)]
        with open(metrics, "a") as f:
            for i in range(len(rows), len(rows) + n):
                f.write(json.dumps({"step": (i + 1) * 10, "loss": 1.7 * (1 + 0.003 * math.sin(i * 1.7))}) + "\n")

    try:
        first = check(2000.0)
        assert len(chat.received) == 1 and first["verdict"] == "WAIT" and first["reviewer"]["answered"]
        assert first["interval_s"] == 60  # a WAIT comes back in a minute ...
        grow(20)  # 120 points: fewer than 100 + 25
        again = check(2060.0)  # ... and finds the answer standing: no request, no second event
        assert len(chat.received) == 1 and again["reviewer"]["reused"] and again["verdict"] == "WAIT"
        assert "answered at 100 loss points; asked again from 125" in again["summary"]
        assert again["review_path"] is None
        assert len([e for e in store.events(job_id="j1") if e["kind"] == "reviewer"]) == 1
        grow(5)  # 125 points: a quarter more than at the answer, asked again
        chat.answer = "CONTINUE"
        third = check(2120.0)
        assert len(chat.received) == 2 and third["verdict"] == "CONTINUE" and not third["reviewer"].get("reused")
        assert len([e for e in store.events(job_id="j1") if e["kind"] == "reviewer"]) == 2
        check(2180.0)  # the CONTINUE stands ...
        assert len(chat.received) == 2
        fourth = check(2120.0 + RV.REASK_AFTER_S)  # ... for an hour, with no new point at all
        assert len(chat.received) == 3 and not fourth["reviewer"].get("reused")
    finally:
        QH.forget("j1")
        store.close()


def test_standing_needs_the_same_doubt():
    m = RV.memo({"answered": True, "answer": "CONTINUE", "in_doubt": "no_learning", "note": ""}, 40, 100.0)
    assert RV.standing(m, {"code": "no_learning"}, 49, 200.0) == 50  # 10 points at least
    assert RV.standing(m, {"code": "spike"}, 41, 200.0) is None      # another doubt asks
    assert RV.standing(m, {"code": "no_learning"}, 50, 200.0) is None
    assert RV.standing(m, {"code": "no_learning"}, 41, 50.0) is None   # a clock that went back asks
    assert RV.memo({"answered": False, "answer": "WAIT"}, 40, 100.0) is None  # an error is asked again
    assert RV.standing({"in_doubt": "no_learning", "points": "x"}, {"code": "no_learning"}, 1, 1.0) is None


def test_profile_schema_checks_the_reviewer(isolated_home):
    from orchestrator import paths
    from orchestrator.errors import ProfileError
    from orchestrator.profiles import load_profile
    udir = paths.user_profiles_dir()
    udir.mkdir(parents=True, exist_ok=True)
    (udir / "local.yaml").write_text("quality:\n  action: alert\n  reviewer:\n    base_url: http://x/v1\n"
                                     "    key_env: %s\n" % KEY)
    with pytest.raises(ProfileError) as exc:
        load_profile("local")
    assert "reviewer" in str(exc.value)
