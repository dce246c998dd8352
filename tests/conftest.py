"""Shared fixtures: an isolated gpurun home per test and the real loopback sshd rig.

Other rigs live in ``tests/rigs/``; add their fixtures here by importing from there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigs.agents import kill_agents_under, point_home
from rigs.sshd import CLEAN_USER, NOISY_USER, SshdRig, sshd_available


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME, XDG_DATA_HOME and XDG_CONFIG_HOME inside ``tmp_path``; returns the new HOME."""
    return point_home(monkeypatch, tmp_path / "home")


@pytest.fixture
def home(isolated_home: Path):
    """An isolated home whose agent daemons (and their job process groups) are killed after the test."""
    yield isolated_home
    kill_agents_under(isolated_home)


@pytest.fixture(scope="session")
def sshd_rig():
    """One real OpenSSH sshd on 127.0.0.1 for the whole session (skips if sshd is missing).

    Tests that stop or restart it must leave it running (``rig.start()`` in a finally)."""
    why = sshd_available()
    if why:
        if os.environ.get("GPURUN_REQUIRE_SSHD"):
            pytest.fail(f"GPURUN_REQUIRE_SSHD is set but {why}")
        pytest.skip(why)
    rig = SshdRig()
    rig.start()
    yield rig
    rig.close()


@pytest.fixture
def sshd(sshd_rig: SshdRig) -> SshdRig:
    """The session rig, guaranteed listening again after the test (even if it stopped it)."""
    sshd_rig.start()
    yield sshd_rig
    sshd_rig.start()


def _host_entry(rig: SshdRig, user: str, home: Path, name: str) -> dict:
    """A host entry for ``user`` whose key is trusted in gpurun's known_hosts under ``home``,
    and registered in the inventory when ``orchestrator.hosts`` exists."""
    from orchestrator import paths

    entry = rig.host_entry(user, name=name)
    rig.trust(paths.data_home() / "known_hosts")
    try:
        from orchestrator import hosts
    except ImportError:
        return entry
    hosts.add_host(entry)
    return entry


@pytest.fixture
def ssh_host(sshd: SshdRig, isolated_home: Path) -> dict:
    """Inventory entry ``box`` for a clean ordinary user on the rig, host key trusted."""
    return _host_entry(sshd, CLEAN_USER, isolated_home, "box")


@pytest.fixture
def noisy_ssh_host(sshd: SshdRig, isolated_home: Path) -> dict:
    """Inventory entry ``noisy`` for a user whose .bashrc prints to stdout and stderr."""
    return _host_entry(sshd, NOISY_USER, isolated_home, "noisy")


@pytest.fixture
def root_ssh_host(sshd: SshdRig, isolated_home: Path) -> dict:
    """Inventory entry ``rootbox`` logging in as root."""
    return _host_entry(sshd, "root", isolated_home, "rootbox")


@pytest.fixture(params=["root", CLEAN_USER, NOISY_USER])
def any_ssh_host(request: pytest.FixtureRequest, sshd: SshdRig, isolated_home: Path) -> dict:
    """Each rig user in turn (root, clean user, noisy user)."""
    return _host_entry(sshd, request.param, isolated_home, f"h-{request.param}")
