"""Fixtures of the health room; the rigs themselves live in ``healthrig.py``."""

from healthrig import agent, device, fake_nvml, procs, webhook  # noqa: F401 - pytest fixtures
