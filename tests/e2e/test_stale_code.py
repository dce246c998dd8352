"""Submit warns, at no extra round trip, when the code pushed to the box differs from here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under

pytestmark = [pytest.mark.ssh]


def test_submit_warns_when_pushed_code_is_stale(ssh_host, tmp_path):
    from orchestrator.transport.ssh import SSHTransport

    with SSHTransport(ssh_host) as t:
        t.run(f"mkdir -p {ssh_host['workdir']} {ssh_host['state_dir']}")
    try:
        proj = tmp_path / "proj"
        proj.mkdir()
        (proj / "train.py").write_text("print('v1')\n")
        pushed = gpurun("push", "--host", "box", str(proj))
        assert pushed.returncode == 0, pushed.stderr
        q = tmp_path / "q.txt"
        q.write_text("[name=a] python3 train.py\n")
        first = gpurun("queue", "submit", str(q), "--host", "box", "--wait")
        assert first.returncode == 0, first.stderr
        assert "differs" not in first.stderr
        (proj / "train.py").write_text("print('v2')\n")
        q.write_text("[name=b] python3 train.py\n")
        second = gpurun("queue", "submit", str(q), "--host", "box")
        assert second.returncode == 0
        assert "warning:" in second.stderr and "differs from" in second.stderr and "gpurun push" in second.stderr
    finally:
        kill_agents_under(Path(ssh_host["state_dir"]).parent)
