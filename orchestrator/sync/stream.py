"""Large files over SSH as one byte stream: received, hashed and written in a single pass.

Why not rsync for them: rsync already spends two processes at home and one on the box on
the bytes, and gpurun then read the growing partial back a second time to hash it; on a
2-core machine that pull took 1.3-1.5x the time of plain rsync (docs/BENCHMARKS.md, issue 15).
Here the box runs ``cat`` (``tail -c +N`` to resume from byte N) under the login shell, ssh
carries the bytes, and gpurun appends each block to the partial while a second thread hashes
the same block. Nothing is read back; the engine still compares the digest with the manifest
before the rename, exactly as for the other methods.

A shell that prints on login (a chatty ``.bashrc``) cannot corrupt the stream: the payload
starts after a marker line the command prints first. A box without ``cat``/``tail`` or a
POSIX shell (no marker, exit 127) returns None, and the caller uses rsync instead.
"""

from __future__ import annotations

import os
import queue
import select
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from orchestrator.errors import TransportError
from orchestrator.sync.transfer import (
    CHUNK,
    WRITEBACK,
    Fetched,
    LocalWriteError,
    Progress,
    TransferGroup,
    _range_flusher,
    _start_offset,
    prefix_hasher,
)

MARK = b"GPURUN-STREAM-5c1e\n"
MAX_NOISE = 1 << 20       # login noise before the marker; more than this is not a shell's greeting
PIPE_SIZE = 1 << 20       # a bigger pipe from ssh: fewer, larger reads (64 KiB by default)
PROGRESS_EVERY = 4 << 20  # report progress every 4 MiB, not on every read
_F_SETPIPE_SZ = 1031      # fcntl.F_SETPIPE_SZ (Linux), absent from older fcntl modules


def remote_command(remote: str, start: int) -> str:
    """The command the box's shell runs: the marker, then the file from byte ``start`` (``;``,
    not ``&&``: older fish has no ``&&``, and without the marker the caller uses rsync).
    ``--`` and quoting keep a name starting with ``-`` or holding ``$``, quotes, spaces or a
    newline literal; an undecodable name (surrogates) goes out as its original bytes."""
    # cat copies in 128 KiB blocks; GNU tail in 8 KiB reads and 4 KiB writes (3x the box's
    # CPU for the same bytes): tail only where it must seek, on a resume
    copy = "cat" if start == 0 else f"tail -c +{start + 1}"
    return f"printf '%s\\n' {MARK.decode().strip()}; exec {copy} -- {shlex.quote(remote)}"


def ssh_stream(ssh_argv: list[str], target: str, remote: str, partial: Path, size: int,
               on_progress: Progress, timeout_s: float, bwlimit_kbps: int = 0) -> Optional[Fetched]:
    """Append ``remote``'s bytes from the partial's length up to ``size`` to ``partial``,
    hashing as they arrive. None: the box cannot stream (no ``cat``/``tail``, not a POSIX
    shell), use rsync. Raises TransportError when the link or the box's read fails (the bytes already
    appended stay: the next pass resumes), LocalWriteError when home cannot write."""
    start = _start_offset(partial, size)
    h = prefix_hasher(partial, start)
    if start >= size:
        return Fetched(h.hexdigest(), start, 0, start, "ssh-stream")  # all here already (or empty): verify it
    argv = [*ssh_argv, target, remote_command(remote, start)]
    with tempfile.TemporaryFile() as errf:
        group = TransferGroup(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errf, bufsize=0)
        proc = group.proc
        rx = _Receiver(partial, start, size, h, on_progress, bwlimit_kbps)
        try:
            rx.run(proc.stdout.fileno(), timeout_s)
            if rx.pos < size or not rx.started:
                try:
                    proc.wait(timeout=30)  # end of stream: ssh is exiting, let it say how
                except subprocess.TimeoutExpired:
                    pass
        finally:
            proc.stdout.close()
            group.close()  # a stream cut at ``size`` (the file grew) ends here
        errf.seek(0)
        err = errf.read()[-2000:].decode(errors="replace").strip()
    code = proc.returncode
    if rx.pos == start and (code == 127 or (code != 255 and not rx.started)):
        return None  # no cat/tail there (127), or a shell that did not run our command: rsync
    if not rx.started:
        raise TransportError(f"ssh stream of {remote} failed (exit {code}): {err[-300:]}",
                             "run the pull again: it resumes from the bytes already here")
    if rx.pos < size and code != 0:
        raise TransportError(f"ssh stream of {remote} stopped at byte {rx.pos} (exit {code}): {err[-300:]}",
                             "run the pull again: it resumes from the bytes already here")
    on_progress(rx.pos)
    return Fetched(h.hexdigest(), rx.pos, rx.pos - start + len(MARK), start, "ssh-stream")


class _Receiver:
    """Reads ssh's stdout: skips login noise up to the marker, then appends every block to the
    partial and to the hash, paced to ``bwlimit_kbps`` KiB/s when set (as rsync's --bwlimit)."""

    def __init__(self, partial: Path, start: int, size: int, h, on_progress: Progress, bwlimit_kbps: int):
        self.partial = partial
        self.pos = start
        self.start = start
        self.size = size
        self.h = h
        self.on_progress = on_progress
        self.rate = bwlimit_kbps * 1024.0
        self.started = False
        self.noise = b""

    def run(self, rfd: int, stall_s: float) -> None:
        """Until ``size`` bytes are in, the stream ends, or nothing arrived for ``stall_s``
        (a stall, not the whole file's time: a 500 GB checkpoint may take hours). Reads fill a
        whole CHUNK before it is written and handed to the hashing thread: one write and one
        hand-off per MiB, whatever sizes the pipe delivers."""
        try:
            import fcntl

            fcntl.fcntl(rfd, _F_SETPIPE_SZ, PIPE_SIZE)
        except (ImportError, OSError):
            pass  # the default pipe works, with more reads
        os.set_blocking(rfd, False)
        poller = select.poll()
        poller.register(rfd, select.POLLIN | select.POLLHUP)
        self._t0 = time.monotonic()
        self._reported = self.start
        deadline = self._t0 + stall_s
        try:
            self._wfd = os.open(self.partial, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LocalWriteError(exc.errno, exc.strerror, str(self.partial)) from None
        hasher = _HashThread(self.h, self._wfd, self.start, _range_flusher())
        buf, fill = hasher.buffer(), 0
        try:
            while self.pos + fill < self.size:
                try:  # non-blocking: a poll only when the pipe is empty, not before every read
                    n = os.readv(rfd, [memoryview(buf)[fill:]])
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TransportError(f"ssh stream stalled at byte {self.pos + fill}: nothing "
                                             f"came for {stall_s:.0f} s",
                                             "run the pull again: it resumes from the bytes already here")
                    if not poller.poll(min(1000, int(left * 1000) + 1)) and fill:
                        self._emit(hasher, buf, fill)  # a slow link: what did come is written now
                        buf, fill = hasher.buffer(), 0
                    continue
                if n == 0:
                    break  # end of stream: the caller reads ssh's exit status
                deadline = time.monotonic() + stall_s
                if not self.started:
                    rest = self._after_mark(bytes(buf[fill:fill + n]))
                    if rest is None:
                        continue
                    buf[fill:fill + len(rest)] = rest  # the payload's first bytes: within this read
                    n = len(rest)
                fill = min(fill + n, self.size - self.pos)  # the file grew on the box: the manifest's length
                if fill == len(buf) or self.pos + fill >= self.size:
                    self._emit(hasher, buf, fill)
                    buf, fill = hasher.buffer(), 0
            if fill:
                self._emit(hasher, buf, fill)
        finally:
            hasher.close()  # every block handed over is hashed before the digest is read
            os.close(self._wfd)

    def _emit(self, hasher: "_HashThread", buf: bytearray, fill: int) -> None:
        """Append ``buf[:fill]`` to the partial, hand it to the hash, keep the pace."""
        self._write(self._wfd, memoryview(buf)[:fill])
        hasher.submit(buf, fill)
        self.pos += fill
        if self.pos - self._reported >= PROGRESS_EVERY:
            self.on_progress(self.pos)
            self._reported = self.pos
        if self.rate:
            ahead = (self.pos - self.start) / self.rate - (time.monotonic() - self._t0)
            if ahead > 0:
                time.sleep(ahead)

    def _after_mark(self, data: bytes) -> Optional[bytes]:
        """The payload part of ``data`` once the marker has been seen, else None (noise kept)."""
        self.noise += data
        at = self.noise.find(MARK)
        if at < 0:
            if len(self.noise) > MAX_NOISE:
                raise TransportError("the box's shell printed more than 1 MiB before the file",
                                     "make the login shell quiet for non-interactive sessions")
            return None
        self.started = True
        rest, self.noise = self.noise[at + len(MARK):], b""
        return rest

    def _write(self, wfd: int, block) -> None:
        done = 0
        while done < len(block):
            try:
                done += os.write(wfd, block[done:])
            except OSError as exc:
                raise LocalWriteError(exc.errno, exc.strerror, str(self.partial)) from None


class _HashThread:
    """SHA-256 on a second thread (hashlib lets go of the GIL for blocks this size): block k is
    hashed while block k+1 is read and written. Buffers cycle through a free list, so a block
    is never refilled before it is hashed, and blocks are hashed in the order they came.

    The same thread starts the writeback of every WRITEBACK bytes already written
    (``sync_file_range``), so the fsync before the rename finds little left to do; it may
    block while the disk queue is full, and here that stalls the hash, not the reads from ssh."""

    def __init__(self, h, wfd: int, pos: int, flush: Optional[Callable[[int, int, int], object]],
                 buffers: int = 8):
        self.h = h
        self.wfd = wfd
        self.pos = self.flushed = pos
        self.flush = flush
        self.free: "queue.Queue[bytearray]" = queue.Queue()
        for _ in range(buffers):
            self.free.put(bytearray(CHUNK))
        self.work: "queue.Queue[Optional[tuple[bytearray, int]]]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="gpurun-stream-hash", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            buf, n = item
            self.h.update(memoryview(buf)[:n])
            self.free.put(buf)
            self.pos += n
            if self.flush is not None and self.pos - self.flushed >= WRITEBACK:
                self.flush(self.wfd, self.flushed, self.pos - self.flushed)
                self.flushed = self.pos

    def buffer(self) -> bytearray:
        while True:
            try:
                return self.free.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive():  # it never returns its buffers now: say so, never hang
                    raise RuntimeError("the stream's hashing thread stopped") from None

    def submit(self, buf: bytearray, n: int) -> None:
        self.work.put((buf, n))

    def close(self) -> None:
        self.work.put(None)
        self.thread.join()
