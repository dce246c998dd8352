"""``fleet.lost_after_s`` in config.yaml: how long a fleet member may stay silent before it is
lost, for ``queue balance`` (and ``watch --fleet`` / ``pull --fleet --loop``) without
``--lost-after``; the flag still wins, and a bad value is one line naming file, line and key.

The members are real inventory SSH hosts whose port has nothing listening (the rig's user,
another port), so each balance finds them silent at once, through the real CLI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rigs.agents import gpurun
from rigs.sshd import free_port

from orchestrator import hosts as hostinv

pytestmark = pytest.mark.ssh


def _config(text: str) -> Path:
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "gpurun" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _lost(*extra: str) -> list[str]:
    res = gpurun("queue", "balance", "--host", "box", "--host", "noisy", "--json", *extra, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    rep = json.loads(res.stdout)
    assert rep["unreachable"] == ["box", "noisy"]
    return rep["lost"]


def test_config_lost_after_s_decides_when_a_silent_member_is_lost(ssh_host, noisy_ssh_host):
    for h in (ssh_host, noisy_ssh_host):  # nothing listens there: silent at once
        hostinv.update_host(h["name"], ssh={**h["ssh"], "port": free_port()})
    assert _lost() == []                   # first silence, default 120 s
    _config("fleet:\n  lost_after_s: 0\n")
    assert _lost("--lost-after", "3600") == []  # the flag wins over the file
    assert _lost() == ["box", "noisy"]

    path = _config("pull:\n  interval_s: 60\nfleet:\n  lost_after_s: -5\n")
    res = gpurun("queue", "balance", "--host", "box", "--host", "noisy", timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{path}:4: key 'fleet.lost_after_s': -5 is below the minimum 0" in res.stderr.splitlines()[0]
    _config("fleet:\n  lost_after: 60\n")
    res = gpurun("queue", "balance", "--host", "box", "--host", "noisy", timeout=60)
    assert res.returncode == 2 and "key 'fleet.lost_after': unknown key" in res.stderr
    assert "did you mean 'lost_after_s'?" in res.stderr
