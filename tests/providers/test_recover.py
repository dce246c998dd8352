"""Interruption detection (provider state, SSH reachability, boot id) and the recovery
policies wait / restart / replace against the loopback fakes and the sshd rig."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.core import recover as rec
from orchestrator.core import rent
from orchestrator.providers import make_provider

from providers.conftest import fake_for


@pytest.fixture
def fast(monkeypatch, isolated_home):
    monkeypatch.setenv("GPURUN_PROVIDER_POLL_S", "0.02")
    return isolated_home


@pytest.fixture
def rented(fast, monkeypatch, sshd):
    """``rented(name, **up_kwargs)`` -> (fake, provider, up result): a box rented from that
    provider's fake, whose instances are the sshd rig; the fakes close at teardown."""
    fakes = []

    def rent_one(name, **kw):
        fakes.append(fake_for(name, monkeypatch, ssh=("127.0.0.1", sshd.port)))
        prov = make_provider(name)
        res = rent.up("vastai" if name == "vast" else name, "RTX_4090", ssh_key=str(sshd.client_key),
                      setup=False, provider=prov, name=f"{name}-box", **kw)
        return fakes[-1], prov, res

    yield rent_one
    for fake in fakes:
        fake.close()


def entry_of(res):
    from orchestrator import hosts
    return hosts.get_host(res["host"])


def test_detects_preemption_and_not_our_own_stop(rented):
    fake, prov, res = rented("vast", spot=True, max_price=0.5)
    e = entry_of(res)
    ok = rec.detect_interruption(e, provider=prov, boot_reader=lambda _: "boot-1")
    assert ok["interrupted"] is False and ok["ssh_reachable"] and ok["provider_state"] == "running"
    assert ok["policy"] == "wait"                               # vastai profile default
    fake.preempt(res["instance_id"])
    bad = rec.detect_interruption(e, provider=prov, probe=lambda h, p: False)
    assert bad["interrupted"] and bad["reason"] == "preempted" and not bad["ssh_reachable"]
    rent.note_rental("vast", res["instance_id"], stopped_by_us=True)
    assert rec.detect_interruption(e, provider=prov, probe=lambda h, p: False)["interrupted"] is False


def test_boot_id_change_is_an_interruption(rented):
    fake, prov, res = rented("runpod")
    e = entry_of(res)
    assert not rec.detect_interruption(e, provider=prov, boot_reader=lambda _: "aaa")["interrupted"]
    d = rec.detect_interruption(e, provider=prov, boot_reader=lambda _: "bbb")
    assert d["interrupted"] and d["boot_id_changed"] and "rebooted" in d["reason"]


def test_restart_policy_starts_the_same_box(rented):
    fake, prov, res = rented("runpod", spot=True)
    fake.preempt(res["instance_id"])
    out = rec.recover(entry_of(res), policy="restart", provider=prov, boot_reader=lambda _: None,
                      wait_timeout=5, ensure_agent=False)
    assert out["action"] == "restarted" and fake.state_of(res["instance_id"]) == "running"
    assert fake.routes[("POST", "/pods/{id}/start")] == 1


def test_wait_policy_waits_for_the_provider(rented):
    fake, prov, res = rented("vast", spot=True, max_price=0.5)
    iid = res["instance_id"]
    fake.preempt(iid)
    threading.Timer(0.3, lambda: fake.set_status(iid, "pending")).start()   # outbidder leaves
    t0 = time.monotonic()
    out = rec.recover(entry_of(res), provider=prov, boot_reader=lambda _: None, wait_timeout=5,
                      ensure_agent=False)
    assert out["action"] == "waited" and time.monotonic() - t0 >= 0.3
    assert fake.routes.get(("PUT", "/instances/{id}/"), 0) == 0            # no start sent


def test_replace_rents_a_new_box_and_moves_the_queue(rented):
    fake, prov, res = rented("vast", spot=True, max_price=0.5)
    old = res["instance_id"]
    fake.preempt(old)
    sent = []

    def submit(entry, jobs):
        sent.append((entry["name"], jobs))
        return {"added": [j["id"] for j in jobs], "present": []}

    jobs = [{"id": "a1", "name": "train", "command": "python t.py", "state": "running"},
            {"id": "a2", "name": "eval", "command": "python e.py", "state": "queued"},
            {"id": "a0", "name": "prep", "command": "python p.py", "state": "succeeded"}]
    out = rec.recover(entry_of(res), policy="replace", provider=prov, probe=lambda h, p: h != "x",
                      boot_reader=lambda _: None, jobs=jobs, submit=submit, up_kwargs={"setup": False})
    assert out["action"] == "replaced" and out["new_host"] == "vast-box-r1"
    assert out["moved"] == ["a1", "a2"] and sent[0][0] == "vast-box-r1"
    assert "state" not in sent[0][1][0]          # re-submitted as fresh queued jobs
    assert fake.state_of(old) == "preempted"      # never destroyed: artifacts unverified
    assert fake.state_of(out["new_instance_id"]) == "running"


def test_poll_instances_is_one_call_for_many(fast, monkeypatch):
    fake = fake_for("runpod", monkeypatch)
    try:
        prov = make_provider("runpod")
        ids = [fake.new_instance("RTX 4090", 1, True, f"n{i}")["id"] for i in range(20)]
        before = fake.requests
        seen = rec.poll_instances(prov, ids + ["gone-000000"])
        assert fake.requests - before == 1
        assert len(seen) == 21 and seen["gone-000000"].state == "terminated"
    finally:
        fake.close()
