"""Loopback "boxes" for fleet tests: each box is one unix user logging in through its own real
sshd (``rigs/sshd.SshdRig``) on its own port, with its own home, state dir, agent and workdir,
so a box can go dark alone (stop its sshd, kill its user's processes).

``boxes(users)`` makes the users (root only) and starts one sshd per user; ``box_root`` makes a
fresh directory the user owns; ``box_entry`` is the host inventory entry for it; ``shared_dir``
is a directory every box user can append to (jobs write there what they did, so "ran once" is
read from the jobs themselves, whichever box ran them); ``kill_user`` ends every process of a
box's user (its agent daemon, its jobs: the box died).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rigs.sshd import SshdRig, _ensure_user, sshd_available


@contextmanager
def boxes(users: tuple[str, ...] | list[str]) -> Iterator[list[SshdRig]]:
    """One started sshd per user (the users created if missing); skips without sshd or root."""
    why = sshd_available()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("boxes as unix users need root to create them")
    for u in users:
        _ensure_user(u, noisy=False)
    rigs = [SshdRig() for _ in users]
    try:
        for r in rigs:
            r.start()
        yield rigs
    finally:
        for r in rigs:
            r.close()


def box_root(rig: SshdRig, user: str, label: str) -> Path:
    """A fresh directory in ``user``'s home, owned by the user, with ``work/`` inside; the rig
    removes it when it closes."""
    pw = pwd.getpwnam(user)
    root = Path(pw.pw_dir) / f"gpurun-{label}-{rig.run_id}-{time.monotonic_ns()}"
    (root / "work").mkdir(parents=True)
    for p in (root, root / "work"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    rig._made.append(root)
    return root


def box_entry(rig: SshdRig, user: str, name: str, label: str = "fleet", **more: object) -> dict:
    """A host inventory entry for ``user`` on ``rig`` (fresh state dir and workdir)."""
    root = box_root(rig, user, f"{label}-{name}")
    return {"name": name, "profile": "generic-ssh", "kind": "ssh",
            "ssh": {"user": user, "hostname": "127.0.0.1", "port": rig.port, "key": str(rig.client_key)},
            "state_dir": str(root / "state"), "workdir": str(root / "work"), **more}


@contextmanager
def shared_dir(prefix: str) -> Iterator[Path]:
    """A world-writable (sticky) directory every box user can append to. A file one box user
    creates there is that user's (mode 644): another box cannot append to it, so a job that
    runs on two boxes would leave one line. Make the files first with ``shared_files``."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def shared_files(d: Path, names: list[str]) -> list[Path]:
    """Empty files in ``d`` that every box user can append to: made here, by the directory's
    owner (``fs.protected_regular`` lets others open such a file in a sticky directory), 666."""
    out = []
    for n in names:
        p = d / n
        p.touch()
        os.chmod(p, 0o666)
        out.append(p)
    return out


def user_pids(user: str) -> list[int]:
    """Every process whose real uid is ``user``'s."""
    uid = pwd.getpwnam(user).pw_uid
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(ln.split(":", 1) for ln in fh if ":" in ln)
        except OSError:
            continue
        # a zombie is already dead (its parent has not reaped it yet): nothing to kill
        if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            out.append(int(entry))
    return out


def kill_user(user: str, timeout: float = 10.0) -> int:
    """SIGKILL every process of ``user`` (a box's dedicated test user: its agent daemon, its
    jobs, its login shells) until none is left; returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in user_pids(user) if p != os.getpid()]
        if not pids:
            return len(killed)
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of {user} survive SIGKILL: {pids}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def wait_until(pred: Callable[[], object], what: str, timeout: float = 60.0, every: float = 0.2,
               detail: Callable[[], object] | None = None) -> None:
    """Poll ``pred`` until it is true; AssertionError naming ``what`` (and ``detail()``) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {detail()}" if detail else ""))
        time.sleep(every)
