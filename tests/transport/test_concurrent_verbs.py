"""Several verbs at once on one ``AgentClient`` over real SSH, to a box without the agent yet.

Each verb finds the agent missing and wants to push it. Before the fix the pushes shared
paramiko's one ``SFTPClient`` from two threads: a thread waiting for its SFTP reply read and
dropped the other's, and both waited forever (and two connections were opened, the second
one through the first as if it were a jump host). The threads here are joined with a
timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.client import AgentClient
from orchestrator.transport.ssh import SSHTransport

pytestmark = pytest.mark.ssh

DEADLINE_S = 45  # the verbs take ~2 s together on a loaded 2-core machine


def test_eight_verbs_at_once_push_the_agent_once(ssh_host, home):
    client = AgentClient(ssh_host, SSHTransport(ssh_host))
    verbs = (lambda: client.status(table=True), lambda: client.events(limit=5),
             client.status, client.agent_info) * 2
    start = threading.Barrier(len(verbs))
    results: dict[int, object] = {}

    def call(i: int) -> None:
        start.wait(DEADLINE_S)
        try:
            results[i] = verbs[i]()
        except Exception as exc:  # reported below with the others, never lost
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(verbs))]
    try:
        for t in threads:
            t.start()
        end = time.monotonic() + DEADLINE_S
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        hung = [i for i, t in enumerate(threads) if t.is_alive()]
        assert not hung, f"verbs {hung} still waiting after {DEADLINE_S}s: deadlocked"
        assert len(client.transport._clients) == 1  # one connection, no accidental jump
    finally:
        client.close()  # also wakes a thread stuck on the SFTP channel
    errors = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert not errors, errors
    for i in (0, 2, 4, 6):
        assert results[i]["jobs"] == []
    assert "events" in results[1] and results[3]["agent"] and results[7]["agent"]
    bin_dir = Path(ssh_host["state_dir"]).expanduser() / "bin"
    assert [p.name for p in bin_dir.glob("*.pyz")] != []
    assert not [p.name for p in bin_dir.iterdir() if ".gpurun-" in p.name]  # no torn upload


@pytest.mark.parametrize("command, code", [("exit 97", 97), ("true", 0), ("head -c 10 >/dev/null; exit 3", 3)])
def test_a_command_given_input_reads_all_of_it_before_the_box_can_close(command, code):
    """The guard behind the fix: a command that exits without reading its input (the agent-missing
    branch) still has all of it read, so sshd cannot close the channel before our EOF arrives;
    its exit code is kept. A real ``sh`` and a real pipe, bigger than the pipe's buffer: without
    the drain the writer gets EPIPE."""
    import subprocess

    from orchestrator.transport.ssh import _guarded

    proc = subprocess.Popen(["sh", "-c", _guarded(command, True)], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(b"x" * (1 << 20))  # raises BrokenPipeError if nothing reads it
    proc.stdin.close()
    assert proc.wait(10) == code
    # given no input, the command reads /dev/null: it never waits for an EOF we do not send
    quiet = subprocess.Popen(["sh", "-c", _guarded("cat; exit 5", False)], stdin=subprocess.PIPE)
    try:
        assert quiet.wait(10) == 5  # its stdin pipe still open: we never closed it
    finally:
        quiet.kill()
        quiet.stdin.close()  # type: ignore[union-attr]
