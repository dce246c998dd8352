"""Provider registry: names, default endpoints and credential env vars, and ``make_provider``.

The contract lives in ``base.py``; one module per provider implements it. Base URLs come from
the profile's ``api.base_url`` unless ``GPURUN_<PROVIDER>_API_URL`` overrides it (tests, proxies).
"""

from __future__ import annotations

import importlib
import os

from orchestrator.errors import ProfileError
from orchestrator.providers.base import CreateSpec, Instance, Offer, Provider, ProviderConfig

__all__ = ["CreateSpec", "Instance", "Offer", "Provider", "ProviderConfig", "PROVIDERS",
           "canonical_name", "make_provider"]

# name -> (module:class, default base URL, default credential env var)
PROVIDERS: dict[str, tuple[str, str, str]] = {
    "runpod": ("orchestrator.providers.runpod:RunPod", "https://rest.runpod.io/v1", "RUNPOD_API_KEY"),
    "lambda": ("orchestrator.providers.lambdalabs:Lambda", "https://cloud.lambda.ai/api/v1",
               "LAMBDA_API_KEY"),
    "vast": ("orchestrator.providers.vast:Vast", "https://console.vast.ai/api/v0", "VAST_API_KEY"),
    "autodl": ("orchestrator.providers.autodl:AutoDL", "https://api.autodl.com", "AUTODL_TOKEN"),
}
ALIASES = {"vastai": "vast", "vast.ai": "vast", "lambdalabs": "lambda", "lambda-cloud": "lambda",
           "lambda_cloud": "lambda"}


def canonical_name(name: str) -> str | None:
    """``vastai`` -> ``vast``; ``None`` for a name no provider answers to."""
    n = (name or "").strip().lower()
    n = ALIASES.get(n, n)
    return n if n in PROVIDERS else None


def env_url_var(name: str) -> str:
    return f"GPURUN_{name.upper()}_API_URL"


def make_provider(name: str, api: dict | None = None, **kwargs) -> Provider:
    """A client for provider ``name`` configured from a profile's ``api`` section.

    ``api`` keys: ``base_url``, ``credential_env``, ``timeout_s``, ``poll_interval_s`` and
    provider extras (``ssh_key_name`` for Lambda, ``image`` default). Raises ``ProfileError``
    for an unknown provider. The key itself is read only when a request is made.
    """
    canon = canonical_name(name)
    if canon is None:
        raise ProfileError(f"unknown provider {name!r}",
                           hint=f"use one of: {', '.join(sorted(PROVIDERS))}")
    target, default_url, default_env = PROVIDERS[canon]
    api = dict(api or {})
    base_url = os.environ.get(env_url_var(canon)) or api.get("base_url") or default_url
    try:
        timeout = float(api.get("timeout_s", 30.0))
        # GPURUN_PROVIDER_POLL_S: faster polling for tests and impatient users
        poll = float(os.environ.get("GPURUN_PROVIDER_POLL_S") or api.get("poll_interval_s", 5.0))
    except (TypeError, ValueError):
        raise ProfileError(f"api.timeout_s / api.poll_interval_s of provider {canon} must be numbers",
                           hint="e.g. timeout_s: 30") from None
    config = ProviderConfig(provider=canon, base_url=str(base_url),
                            credential_env=str(api.get("credential_env") or default_env),
                            timeout_s=timeout, poll_interval_s=poll)
    mod_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(mod_name), cls_name)
    prov = cls(config, **kwargs)
    prov.extras = {k: v for k, v in api.items()
                   if k not in ("base_url", "credential_env", "timeout_s", "poll_interval_s")}
    return prov
