"""One SSH connection that a pull's rsyncs share (OpenSSH ``ControlMaster``).

A pull runs one or two rsyncs per job (``RsyncFetcher.fetch_tree``, one per source folder),
and each used to open its own SSH connection: a key exchange and a login every time, about
0.4 s on a loopback box and several round trips on a far one, so a pass over 12 jobs spent
most of its time shaking hands. ``MuxRsyncFetcher``, told that a pass holds two jobs or more,
starts a master connection beside its first rsync; the ones after it open a session on the
master (a few ms) instead. A large file's ssh stream (``sync.stream``, maybe several in parallel
to fill a long link) keeps connections of its own.

Nothing depends on it: until the master's socket is there, when the master could not start
(an ``ssh`` without ``ControlMaster``, a fake one in a test) or once it died, a client gets no
mux options and connects on its own as before. With ``ControlMaster=no`` a client whose socket
stopped answering falls back to a connection of its own as well. The master runs in a
process group that dies with gpurun, ``kill -9`` included (its socket's folder goes with it),
and ``close`` ends it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import weakref
from typing import Any, Optional

from orchestrator.sync.procgroup import TransferGroup
from orchestrator.sync.transfer import RsyncFetcher


class SshMux:
    """One ``ControlMaster`` connection to ``target``, started by the first ``client_options``."""

    def __init__(self, ssh_argv: list[str], target: str):
        self._argv = list(ssh_argv)
        self._target = target
        self._dir: Optional[str] = None
        self._group: Optional[TransferGroup] = None
        self._failed = False
        self._finalizer: Optional[weakref.finalize] = None

    @staticmethod
    def usable(ssh_argv: Optional[list[str]]) -> bool:
        """Only for OpenSSH's own client: a wrapper or a stand-in may not know ``-M``."""
        return bool(ssh_argv) and os.path.basename(ssh_argv[0]) == "ssh" and os.name == "posix"

    def client_options(self) -> list[str]:
        """Options that route a client through the master; ``[]`` (a connection of its own)
        until the master is up. The first call starts the master and never waits for it."""
        if self._failed:
            return []
        if self._group is None:
            self._start()
            return []
        path = self._socket()
        if self._group.proc.poll() is not None:
            self._failed = True   # it never came up, or it died: connect alone from now on
            return []
        return ["-o", "ControlMaster=no", "-o", "ControlPath=" + path] if os.path.exists(path) else []

    def _socket(self) -> str:
        return os.path.join(self._dir or "", "m")

    def _start(self) -> None:
        try:
            # a short path (sun_path holds 108 bytes) in a directory only we can enter
            self._dir = tempfile.mkdtemp(prefix="gpurun-mux-")
            argv = [self._argv[0], "-M", "-N", "-o", "ControlPersist=no", "-o", "ControlPath=" + self._socket(),
                    *self._argv[1:], self._target]
            # its own process group, killed (and the folder removed) when gpurun is gone, kill -9 included
            self._group = TransferGroup(argv, self._dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        except OSError:
            self._failed = True
            self._cleanup(None, self._dir)
            return
        self._finalizer = weakref.finalize(self, SshMux._cleanup, self._group, self._dir)

    def close(self) -> None:
        """End the master (sessions still open on it end with it: call after the transfers)."""
        if self._finalizer is not None:
            self._finalizer()
        self._failed = True

    @staticmethod
    def _cleanup(group: Optional[TransferGroup], folder: Optional[str]) -> None:
        if group is not None:
            group.close()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


class MuxRsyncFetcher(RsyncFetcher):
    """``RsyncFetcher`` whose rsyncs share one SSH connection once ``expect`` is told of two
    jobs or more (a pass over one job, or one file re-pulled before ``down``, would pay for a
    master's login and gain little); ``close()`` it after the pass."""

    def __init__(self, ssh_argv: Optional[list[str]] = None, target: str = "", **kw: Any):
        super().__init__(ssh_argv, target, **kw)
        self._mux: Optional[SshMux] = None

    def expect(self, jobs: int) -> None:
        """How many jobs this pass is about to pull."""
        if self._mux is None and jobs >= 2 and SshMux.usable(self.ssh_argv):
            self._mux = SshMux(self.ssh_argv or [], self.target)

    def _ssh_command(self) -> str:   # rsync's ``-e``
        argv = self._ssh_list()
        if self._mux is not None:
            argv[1:1] = self._mux.client_options()
        return " ".join(shlex.quote(a) for a in argv)

    def close(self) -> None:
        if self._mux is not None:
            self._mux.close()
