"""The provider contract, run against each loopback fake: credentials, offers, create/refresh,
capacity, 429 backoff, stop/start, preemption, terminate + wait_gone, and key hygiene."""

from __future__ import annotations

import logging

import pytest

from orchestrator.errors import CapacityError, CredentialError, ProviderError, Unsupported
from orchestrator.providers import CreateSpec, PROVIDERS
from rigs.fake_providers import KEY


def rent(prov, gpu="RTX 4090", spot=False, max_price=None):
    offer = prov.list_offers(gpu, 1, spot=spot)[0]
    return prov.create(CreateSpec(gpu=gpu, count=1, spot=spot, offer_id=offer.id, name="t1",
                                  max_price=max_price if max_price is not None else
                                  (offer.price_per_hour if spot else None)))


def test_check_credentials_ok_and_missing_and_rejected(cloud, monkeypatch):
    fake, prov, _ = cloud
    prov.check_credentials()
    env = PROVIDERS[prov.name][2]
    monkeypatch.setenv(env, "wrong-key-123")
    with pytest.raises(CredentialError) as bad:
        prov.check_credentials()
    assert env in str(bad.value) and "wrong-key-123" not in str(bad.value) + str(bad.value.hint)
    assert bad.value.exit_code == 2
    monkeypatch.delenv(env)
    with pytest.raises(CredentialError) as missing:
        prov.check_credentials()
    assert str(missing.value).endswith(f"env var {env} is not set")
    assert fake.requests == 2   # the missing key never reached the wire


def test_offers_sorted_and_price_capped(cloud):
    fake, prov, _ = cloud
    if prov.name == "autodl":
        prov.extras["prices"] = {"RTX 4090": 2.5, "H100 80GB": 18.0}
    offers = prov.list_offers("RTX_4090", 1)
    assert offers and all("4090" in o.gpu for o in offers)
    assert [o.price_per_hour for o in offers] == sorted(o.price_per_hour for o in offers)
    assert all(o.provider == prov.name and o.count == 1 for o in offers)
    assert prov.list_offers("RTX_4090", 1, max_price=offers[0].price_per_hour - 0.01) == []


def test_create_then_refresh_until_ssh(cloud):
    fake, prov, _ = cloud
    inst = rent(prov)
    assert inst.state == "pending" and inst.id
    for _ in range(5):
        inst = prov.refresh(inst.id)
        if inst.ssh_reachable:
            break
    assert inst.state == "running"
    assert (inst.ssh_host, inst.ssh_port) == ("127.0.0.1", 2222)
    assert inst.ssh_user == ("ubuntu" if prov.name == "lambda" else "root")
    assert inst.id in {i.id for i in prov.list_instances()}


def test_capacity_error(cloud):
    fake, prov, _ = cloud
    offer = prov.list_offers("RTX 4090", 1)[0]
    fake.capacity["RTX 4090"] = 0
    with pytest.raises(CapacityError) as err:
        prov.create(CreateSpec(gpu="RTX 4090", offer_id=offer.id, name="t"))
    assert err.value.retryable and err.value.hint
    assert not fake.instances


def test_429_backs_off_with_retry_after(cloud):
    fake, prov, sleeps = cloud
    fake.rate_limit(2, retry_after="3")
    prov.check_credentials()
    assert sleeps == [3.0, 3.0]
    assert fake.requests == 3
    fake.rate_limit(50, retry_after="0")
    with pytest.raises(ProviderError) as err:
        prov.check_credentials()
    assert err.value.retryable and "rate limited" in str(err.value)


def test_terminate_waits_until_really_gone_and_is_idempotent(cloud):
    fake, prov, _ = cloud
    inst = rent(prov)
    prov.wait_state(inst.id, lambda i: i.ssh_reachable, timeout=5, interval=0)
    prov.terminate(inst.id)
    polls = prov.wait_gone(inst.id, timeout=5, interval=0)
    assert polls >= 2          # the provider kept listing it for a while after the ack
    assert fake.state_of(inst.id) is None
    assert prov.refresh(inst.id).state == "terminated"
    prov.terminate(inst.id)    # gone => success


def test_stop_start_or_unsupported(cloud):
    fake, prov, _ = cloud
    inst = rent(prov)
    prov.wait_state(inst.id, lambda i: i.ssh_reachable, timeout=5, interval=0)
    if prov.name == "lambda":
        with pytest.raises(Unsupported) as err:
            prov.stop(inst.id)
        assert "no stop state" in str(err.value) and err.value.exit_code == 2
        return
    prov.stop(inst.id)
    assert prov.refresh(inst.id).state == "stopped"
    assert prov.stopped_bills
    prov.start(inst.id)
    back = prov.wait_state(inst.id, lambda i: i.ssh_reachable, timeout=5, interval=0)
    assert back.state == "running"


def test_preemption_is_reported(cloud):
    fake, prov, _ = cloud
    spot = prov.name in ("runpod", "vast")
    inst = rent(prov, spot=spot)
    prov.wait_state(inst.id, lambda i: i.ssh_reachable, timeout=5, interval=0)
    fake.preempt(inst.id)
    seen = prov.refresh(inst.id)
    # AutoDL has no spot: a forced power-off (arrears) reads as stopped, not preempted
    assert seen.state == ("stopped" if prov.name == "autodl" else "preempted")
    assert not seen.ssh_reachable


def test_key_never_in_errors_or_logs(cloud, caplog, monkeypatch):
    fake, prov, _ = cloud
    caplog.set_level(logging.DEBUG, logger="gpurun")
    inst = rent(prov)
    prov.refresh(inst.id)
    fake.capacity["RTX 4090"] = 0
    texts = []
    for call in (lambda: prov.create(CreateSpec(gpu="RTX 4090", offer_id=prov.list_offers("RTX 4090")[0].id
                                                if prov.list_offers("RTX 4090") else "x@y", name="t")),
                 lambda: prov.refresh("does-not-exist-000") and prov.stop("nope-000000")):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - we inspect every failure's text
            texts.append(f"{exc} {getattr(exc, 'hint', '')}")
    assert caplog.records, "the client should log its requests at debug level"
    assert KEY not in caplog.text and all(KEY not in t for t in texts)
