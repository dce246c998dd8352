"""A transfer's processes in a group of their own that dies with gpurun, ``kill -9`` included:
an rsync and the receiver it forks, a large file's ssh stream, the SSH master of a pull pass
(``sshmux``). Stdlib only."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Optional


class TransferGroup:
    """One rsync and everything it starts (its forked receiver, ssh) in a process group of
    their own, killed as one when gpurun dies in any way, ``kill -9`` included.

    PR_SET_PDEATHSIG (used before) is not enough: it reaches the rsync gpurun started, not the
    receiver rsync forks, which can keep writing into the staging partial that the next pull
    resumes, and it exists on Linux only. So a tiny watcher (``sh``) holds the read end of a
    pipe whose only writer is gpurun: end of file without the all-clear line means gpurun is
    gone, and the watcher kills the whole group (``kill -KILL -PGID``: dash's kill takes no
    ``--``). ``close()`` sends the all-clear, kills what is left of the group and reaps both.
    ``folder``: removed by the watcher too, whichever way gpurun ends."""

    def __init__(self, argv: list[str], folder: str = "", **popen: Any):
        # no preexec_fn (PR_SET_PDEATHSIG): it forces a fork of the whole interpreter, ~20 ms
        # a spawn against ~1 ms, and the watcher below covers the top process as well
        self.proc = subprocess.Popen(argv, start_new_session=True, **popen)
        self.pgid = self.proc.pid
        rd, self._wr = os.pipe()  # non-inheritable: no other child of gpurun holds the write end
        try:
            self.watcher: Optional[subprocess.Popen] = subprocess.Popen(
                ["/bin/sh", "-c", 'read -r _ || kill -KILL -"$1" 2>/dev/null; [ -z "$2" ] || rm -rf "$2"',
                 "gpurun-pull-watch", str(self.pgid), folder], stdin=rd, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            self.watcher = None  # no /bin/sh: the per-job lock still keeps two pulls apart
        finally:
            os.close(rd)

    def kill(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
            self.proc.wait()
        else:
            self.kill()  # rsync exited; a straggler of its group (ssh) must not outlive it
        try:
            os.write(self._wr, b"ok\n")
        except OSError:
            pass
        os.close(self._wr)
        if self.watcher is not None:
            self.watcher.wait()
