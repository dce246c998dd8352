"""A pull over SFTP and a push sharing one ``AgentClient`` (one SSH connection) at once.

paramiko's ``SFTPClient`` reads replies without a lock: a pull reading its prefetched
blocks could read and drop the reply a push was waiting for (the push then waited forever),
or both read halves of one packet. The pull now takes the transport's SFTP session under
its lock (``SSHTransport.sftp_session``), as the push does. Both threads are joined with a
deadline, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.client import AgentClient
from orchestrator.core.pull import choose_fetcher
from orchestrator.transport.ssh import SSHTransport
from pullrig import chown_to

pytestmark = [pytest.mark.ssh]

DEADLINE_S = 60  # both sides take ~2 s on a loaded 2-core machine


def test_a_pull_and_a_push_on_one_client_both_finish(ssh_host, tmp_path):
    work = Path(ssh_host["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    chown_to(work, ssh_host["ssh"]["user"])
    blobs = []
    for i in range(3):  # large enough for many prefetched replies in flight
        blob = work / f"ck{i}.bin"
        blob.write_bytes(os.urandom(3_000_000))
        blobs.append(blob)
    small = tmp_path / "agent.pyz"
    small.write_bytes(os.urandom(20_000))
    client = AgentClient(ssh_host, SSHTransport(ssh_host))
    fetcher = choose_fetcher(client, "sftp")
    assert fetcher.method == "sftp"
    pulled: dict[str, object] = {}
    pushes: list[object] = []
    start = threading.Barrier(2)

    def pull() -> None:
        start.wait(DEADLINE_S)
        try:
            for blob in blobs:
                part = tmp_path / "home" / blob.name
                got = fetcher.fetch(str(blob), part, blob.stat().st_size, lambda n: None)
                pulled[blob.name] = got.sha256
        except Exception as exc:  # reported below, never lost
            pulled["error"] = exc

    def push() -> None:
        start.wait(DEADLINE_S)
        try:
            while len(pulled) < len(blobs) and "error" not in pulled:
                client.transport.put(str(small), str(work / "bin" / "agent.pyz"))
                pushes.append(True)
        except Exception as exc:
            pushes.append(exc)

    threads = [threading.Thread(target=f, daemon=True) for f in (pull, push)]
    try:
        for t in threads:
            t.start()
        end = time.monotonic() + DEADLINE_S
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        hung = [f.__name__ for f, t in zip((pull, push), threads) if t.is_alive()]
        assert not hung, f"{hung} still waiting after {DEADLINE_S}s: a reply was lost"
    finally:
        client.close()  # also wakes a thread stuck on the SFTP channel
    assert "error" not in pulled, pulled
    assert [p for p in pushes if p is not True] == [] and pushes, pushes
    for blob in blobs:
        assert pulled[blob.name] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert (work / "bin" / "agent.pyz").read_bytes() == small.read_bytes()
