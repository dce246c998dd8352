"""rsync's SSH command: AES-GCM first when the CPU has AES, an explicit choice kept."""

from __future__ import annotations

import hashlib
import os

from orchestrator.sync import transfer
from orchestrator.sync.transfer import RsyncFetcher, _TailHasher


def test_cipher_order(monkeypatch):
    monkeypatch.setattr(transfer, "_has_aes", lambda: True)
    cmd = RsyncFetcher(["ssh", "-p", "2222"], "u@h")._ssh_command()
    assert cmd.startswith("ssh -o Ciphers=aes128-gcm@openssh.com,") and cmd.endswith("-p 2222")
    assert "chacha20-poly1305@openssh.com" in cmd  # same set: a box without AES-GCM still connects
    assert RsyncFetcher(["ssh", "-c", "aes256-ctr"], "u@h")._ssh_command() == "ssh -c aes256-ctr"
    assert "Ciphers" not in RsyncFetcher(["ssh"], "u@h", fast_cipher=False)._ssh_command()
    monkeypatch.setattr(transfer, "_has_aes", lambda: False)
    assert RsyncFetcher(["ssh"], "u@h")._ssh_command() == "ssh"


def test_tail_hasher_with_early_writeback(tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "WRITEBACK", 1 << 20)
    p = tmp_path / "grow.bin"
    p.write_bytes(b"")
    tail = _TailHasher(p)
    calls = []
    real = tail.flush
    tail.flush = lambda fd, off, n: calls.append((off, n)) or (real and real(fd, off, n))
    h = hashlib.sha256()
    with open(p, "ab") as fh:
        for i in range(5):
            block = os.urandom(700_000)
            fh.write(block)
            fh.flush()
            h.update(block)
            tail.pump()
    digest, size = tail.finish()
    assert digest == h.hexdigest() and size == 3_500_000
    assert calls and calls[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(calls, calls[1:]))
