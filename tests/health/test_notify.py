"""Webhook notifications against a real HTTP server on loopback (and one that is down)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import time
import urllib.parse

import pytest
from healthrig import add_running_job, age, healthy_gpu, job_env

from orchestrator.agent import notify, watchdog_hook

EVENT = {"kind": "stalled", "severity": "error", "job_id": "j7", "message": "no log growth for 31 min",
         "data": {"idle_s": 1860}}


def notifier(targets, env, **kw):
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 2)
    return notify.Notifier(targets, env, host="box1", **kw)


@pytest.mark.parametrize("kind,check", [
    ("generic", lambda b: b["kind"] == "stalled" and b["job_id"] == "j7" and b["host"] == "box1"
     and b["data"] == {"idle_s": 1860} and b["source"] == "gpurun"),
    ("slack", lambda b: set(b) == {"text"} and "[gpurun ERROR] box1 job j7: stalled" in b["text"]),
    ("feishu", lambda b: b["msg_type"] == "text" and "no log growth" in b["content"]["text"]),
    ("dingtalk", lambda b: b["msgtype"] == "text" and "stalled" in b["text"]["content"]),
    ("wecom", lambda b: b["msgtype"] == "text" and "box1" in b["text"]["content"]),
])
def test_each_format_reaches_the_server(webhook, kind, check):
    n = notifier([{"kind": kind, "url_env": "HOOK_URL"}], {"HOOK_URL": webhook.url})
    assert n.send(EVENT) == 1
    assert n.flush(10)
    (got,) = webhook.received
    assert check(got["body"]), got["body"]
    assert got["headers"]["Content-Type"] == "application/json"
    assert n.drain_results()[0]["ok"] is True and n.stats["sent"] == 1


def test_dingtalk_and_feishu_signatures(webhook):
    env = {"D": webhook.url + "?access_token=abc", "F": webhook.url, "SECRET": "SEC123"}
    n = notifier([{"kind": "dingtalk", "url_env": "D", "secret_env": "SECRET"},
                  {"kind": "feishu", "url_env": "F", "secret_env": "SECRET"}], env)
    n.send(EVENT)
    assert n.flush(10)
    ding = next(r for r in webhook.received if "access_token" in r["path"])
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(ding["path"]).query)
    ts = q["timestamp"][0]
    want = base64.b64encode(hmac.new(b"SEC123", ("%s\nSEC123" % ts).encode(), hashlib.sha256).digest()).decode()
    assert q["access_token"] == ["abc"] and q["sign"] == [want]
    feishu = next(r for r in webhook.received if "access_token" not in r["path"])["body"]
    want = base64.b64encode(hmac.new(("%s\nSEC123" % feishu["timestamp"]).encode(), b"", hashlib.sha256).digest()).decode()
    assert feishu["sign"] == want


def test_min_severity_filters_but_queue_done_always_goes(webhook):
    n = notifier([{"kind": "slack", "url_env": "U", "min_severity": "error"}], {"U": webhook.url})
    assert n.send(dict(EVENT, severity="warn")) == 0
    assert n.send({"kind": "queue_done", "severity": "info", "message": "queue done: 3 succeeded"}) == 1
    assert n.flush(10) and len(webhook.received) == 1 and "queue done" in webhook.received[0]["body"]["text"]


def test_retries_then_succeeds_and_service_level_refusal_fails(webhook):
    webhook.statuses[:] = [500, 503]
    n = notifier([{"kind": "slack", "url_env": "U"}], {"U": webhook.url})
    n.send(EVENT)
    assert n.flush(10)
    (res,) = n.drain_results()
    assert res["ok"] and res["attempts"] == 3 and len(webhook.received) == 3
    webhook.reply = {"errcode": 310000, "errmsg": "keywords not in content"}
    n2 = notifier([{"kind": "dingtalk", "url_env": "U"}], {"U": webhook.url}, retries=2)
    n2.send(EVENT)
    assert n2.flush(10)
    (res,) = n2.drain_results()
    assert not res["ok"] and "refused" in res["error"]


def test_server_down_never_blocks_and_url_is_never_reported():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    url = "http://127.0.0.1:%d/secret-token-xyz" % port
    n = notifier([{"kind": "generic", "url_env": "U"}], {"U": url}, retries=3, backoff_s=0.05)
    t0 = time.monotonic()
    assert n.send(EVENT) == 1
    assert time.monotonic() - t0 < 0.05  # the caller does not wait for the network
    assert n.flush(10)
    (res,) = n.drain_results()
    assert not res["ok"] and res["attempts"] == 3 and "connection failed" in res["error"]
    assert "secret-token-xyz" not in repr(res)


def test_unset_env_var_and_bad_config():
    n = notifier([{"kind": "slack", "url_env": "NOT_SET_ANYWHERE"}], {})
    n.send(EVENT)
    assert n.flush(5)
    assert n.drain_results()[0]["error"] == "env var NOT_SET_ANYWHERE is not set"
    with pytest.raises(ValueError, match=r"notify\[0\].kind: 'teams' is not one of"):
        notify.validate([{"kind": "teams", "url_env": "X"}])
    with pytest.raises(ValueError, match=r"notify\[0\].url_env: give the NAME"):
        notify.validate([{"kind": "slack", "url_env": "https://hooks.slack.com/x"}])
    with pytest.raises(ValueError, match=r"notify\[1\].min_severity"):
        notify.validate([{"kind": "slack", "url_env": "X"}, {"kind": "slack", "url_env": "X", "min_severity": "loud"}])


def test_full_queue_drops_instead_of_blocking():
    n = notifier([{"kind": "slack", "url_env": "U"}], {}, max_queue=2)
    n._start = lambda: None  # no consumer: the queue fills up
    assert [n.send(EVENT) for _ in range(4)] == [1, 1, 0, 0]
    assert n.stats["dropped"] == 2


def test_watchdog_tick_notifies_and_keeps_going_when_server_is_down(agent, fake_nvml, device, procs, tmp_path,
                                                                    webhook, monkeypatch):
    monkeypatch.setenv("GPURUN_TEST_HOOK", webhook.url)
    monkeypatch.setenv("GPURUN_DEAD_HOOK", "http://127.0.0.1:9/down")
    agent.config.update(notify=[{"kind": "slack", "url_env": "GPURUN_TEST_HOOK", "min_severity": "warn"},
                                {"kind": "generic", "url_env": "GPURUN_DEAD_HOOK"}],
                        watchdog={"device_glob": [str(device / "nvidia*")]})
    notify._CACHE.clear()
    p = procs.spawn(hold=[device / "nvidia0"], env=job_env("hung"))
    add_running_job(agent.store, tmp_path, "hung", p.pid)
    age(tmp_path / "runs" / "hung" / "log.txt", 2400)
    fake_nvml.set([healthy_gpu(0, util_pct=0)])
    n = notify.notifier_for(agent.state_dir, agent.config)
    n.backoff_s = 0.01
    t0 = time.monotonic()
    watchdog_hook.tick(agent)
    assert time.monotonic() - t0 < 2.0
    assert n.flush(15)
    texts = [r["body"]["text"] for r in webhook.received]
    assert any("stalled" in t and "job hung" in t for t in texts)
    # the job ends; its process is gone; the queue drains -> queue_done goes out too
    agent.store.transition("hung", ["running"], "failed", ended_at=time.time(), reason="exit code 1")
    agent.store.add_event("hung", "failed", "error", "job hung failed: exit code 1")
    watchdog_hook.tick(agent)  # also records the dead endpoint's failure from the last tick
    assert n.flush(15)
    watchdog_hook.tick(agent)
    texts = [r["body"]["text"] for r in webhook.received]
    assert any("job hung: failed" in t for t in texts) and any("queue_done" in t for t in texts)
    failed = [e for e in agent.store.events() if e["kind"] == "notify_failed"]
    assert failed and "GPURUN_DEAD_HOOK" in failed[0]["message"] and "/down" not in failed[0]["message"]
    notify._CACHE.clear()
