"""Fixtures: one started loopback fake per provider, a client pointed at it, no real sleeps."""

from __future__ import annotations

import pytest

from orchestrator.providers import PROVIDERS, env_url_var, make_provider
from rigs.fake_providers import KEY, start_fake

ALL = ("runpod", "lambda", "vast", "autodl")


class Sleeps(list):
    """Records requested sleeps instead of sleeping, so backoff is asserted, not waited for."""

    def __call__(self, s: float) -> None:
        self.append(s)


@pytest.fixture(params=ALL)
def cloud(request, monkeypatch):
    """(fake server, provider client, recorded sleeps) for each provider in turn."""
    name = request.param
    fake = start_fake(name, ssh=("127.0.0.1", 2222), boot_polls=1, gone_polls=2)
    monkeypatch.setenv(PROVIDERS[name][2], KEY)
    monkeypatch.setenv(env_url_var(name), fake.url)
    sleeps = Sleeps()
    prov = make_provider(name, sleep=sleeps)
    if name == "lambda":
        prov.extras["ssh_port"] = 2222
    yield fake, prov, sleeps
    fake.close()


def fake_for(name: str, monkeypatch, **kw):
    fake = start_fake(name, **kw)
    monkeypatch.setenv(PROVIDERS[name][2], KEY)
    monkeypatch.setenv(env_url_var(name), fake.url)
    return fake
