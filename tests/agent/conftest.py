"""Fixtures for agent tests: an isolated home whose daemons are killed after each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigs.agents import kill_agents_under


@pytest.fixture
def home(isolated_home: Path):
    yield isolated_home
    kill_agents_under(isolated_home)
