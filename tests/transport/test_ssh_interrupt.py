"""Ctrl-C inside paramiko, over the real sshd: the command ends at once with KeyboardInterrupt.

An interrupt can land between a paramiko lock's acquire and its ``try``, leaving the lock held
by the interrupted thread for good. Here the interrupt comes from exactly there, with the
channel's own lock held, at two places: while the exec request is sent (before any output is
read) and while the output is read. The command must end, the connection's close must not
wait, and neither must freeing the channel afterwards (``Channel.__del__`` closes it: after a
real Ctrl-C that ran at interpreter exit, after ``gpurun: interrupted``, and hung there).
"""

from __future__ import annotations

import threading

import pytest


@pytest.mark.parametrize("where", ["exec_command", "pump"])
def test_ctrl_c_with_a_channel_lock_held_does_not_hang(ssh_host: dict, monkeypatch, where: str) -> None:
    from orchestrator.transport import ssh as ssh_mod
    from orchestrator.transport.channel import _paramiko

    held: list = []

    def interrupt_holding_lock(chan, *_args, **_kw) -> None:
        held.append(chan)
        chan.lock.acquire()      # what an interrupt between acquire and try leaves behind
        raise KeyboardInterrupt

    if where == "pump":
        monkeypatch.setattr(ssh_mod, "pump", interrupt_holding_lock)
    else:
        monkeypatch.setattr(_paramiko().Channel, "exec_command", interrupt_holding_lock)
    kinds: list[type] = []

    def call() -> None:                      # the command, the connection's close, then
        try:                                 # the channel's __del__
            with ssh_mod.SSHTransport(ssh_host) as t:
                t.run("sleep 5")
        except BaseException as exc:         # noqa: B036 (the point is which one)
            kinds.append(type(exc))
        held[0].__del__()                    # what freeing it does, at exit after a real Ctrl-C
        kinds.append(type(None))
    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(10)
    hung = th.is_alive()
    if hung:
        held[0].lock.release()               # let the stuck close end: the run must not hang
    assert not hung, f"hung after Ctrl-C in {where} (a paramiko lock left held)"
    assert kinds == [KeyboardInterrupt, type(None)], kinds
    held.clear()
