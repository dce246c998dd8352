"""Large files over SSH as one byte stream: received, hashed and written in a single pass.

Why not rsync for them: rsync already spends two processes at home and one on the box on
the bytes, and gpurun then read the growing partial back a second time to hash it; on a
2-core machine that pull took 1.3-1.5x the time of plain rsync (docs/BENCHMARKS.md, issue 15).
Here the box runs ``cat`` (``tail -c +N`` to resume from byte N) under the login shell, ssh
carries the bytes, and gpurun appends each block to the partial while a second thread hashes
the same block. Nothing is read back; the engine still compares the digest with the manifest
before the rename, exactly as for the other methods.

On a box whose login shell is quiet, and without a bandwidth limit, ssh writes the partial
itself and gpurun hashes it from the page cache (``sync.direct``: one copy at home instead of
three); the piped stream here is for chatty boxes and paced pulls. With ``streams`` > 1 and
``RANGED_MIN`` bytes or more missing, the file comes as that many streams of a byte range
each (``sync.parallel``; ``sync.ranges`` says how the resume works; off by default).

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
from orchestrator.sync.procgroup import TransferGroup
from orchestrator.sync.transfer import (
    CHUNK,
    WRITEBACK,
    Fetched,
    LocalWriteError,
    Progress,
    _range_flusher,
    _start_offset,
    prefix_hasher,
)
from orchestrator.sync.ranges import load, plan, settle

MARK = b"GPURUN-STREAM-5c1e\n"
MAX_NOISE = 1 << 20       # login noise before the marker; more than this is not a shell's greeting
PIPE_SIZE = 1 << 20       # a bigger pipe from ssh: fewer, larger reads (64 KiB by default)
PROGRESS_EVERY = 4 << 20  # report progress every 4 MiB, not on every read
_F_SETPIPE_SZ = 1031      # fcntl.F_SETPIPE_SZ (Linux), absent from older fcntl modules
STREAMS = 1               # ssh connections for one large file: 2 cost 15 % on the 2-core loopback (sync.ranges)
DIRECT = True             # ssh writes the partial itself on a quiet box (sync.direct)
RANGED_MIN = 256 << 20    # below this many missing bytes, one stream: a second login is not worth it


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
               on_progress: Progress, timeout_s: float, bwlimit_kbps: int = 0,
               streams: int = STREAMS) -> Optional[Fetched]:
    """Bring ``partial`` up to ``remote``'s first ``size`` bytes, hashing as they arrive: one
    stream appended to the partial (written by ssh itself on a quiet box, ``sync.direct``), or,
    for ``RANGED_MIN`` bytes or more still missing, ``streams`` streams of a byte range each
    (a resumed ranged partial goes on that way).
    None: the box cannot stream (no ``cat``/``tail``/``dd``, not a POSIX shell), use rsync.
    Raises TransportError when the link or the box's read fails (the bytes already written
    stay: the next pass resumes), LocalWriteError when home cannot write."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    ranges = load(partial, size)
    if ranges is None:
        start = _start_offset(partial, size)
        if streams > 1 and size - start >= RANGED_MIN:
            ranges = plan(start, size, streams)
    if ranges is not None and len(ranges) > 1:
        from orchestrator.sync.parallel import ranged  # it imports this module

        return ranged(ssh_argv, target, remote, partial, size, ranges, on_progress, timeout_s, bwlimit_kbps)
    if ranges is not None:  # a record of one range: a plain prefix
        settle(partial, size)
    start = _start_offset(partial, size)
    h = prefix_hasher(partial, start)
    if start >= size:
        return Fetched(h.hexdigest(), start, 0, start, "ssh-stream")  # all here already (or empty): verify it
    wasted = 0
    if DIRECT and not bwlimit_kbps:
        from orchestrator.sync.direct import Noisy, direct_stream, verdict_of  # they import this module

        verdict = verdict_of(ssh_argv, target)  # a box not probed yet: the probe runs alongside
        if verdict() is not False:
            got = direct_stream(ssh_argv, target, remote, partial, size, start, h, on_progress, timeout_s,
                                verdict)
            if not isinstance(got, Noisy):
                return got
            wasted = got.wasted  # it crossed the link for nothing
            h = prefix_hasher(partial, start)
    wfd = _open(partial)
    hasher = _HashThread(h, wfd, start, _range_flusher())
    rx = _Receiver(partial, wfd, start, size, 0, bwlimit_kbps * 1024.0, hasher, _every(on_progress))
    try:
        link = _Link(ssh_argv, target, remote_command(remote, start))
        link.run(rx, timeout_s)
    finally:
        hasher.close()  # every block handed over is hashed before the digest is read
        os.close(wfd)
    if link.cannot(rx):
        return None  # no cat/tail there (127), or a shell that did not run our command: rsync
    link.check(rx, size, remote)
    on_progress(rx.pos)
    return Fetched(h.hexdigest(), rx.pos, rx.got + len(MARK) + wasted, start, "ssh-stream")


def _open(partial: Path) -> int:
    try:  # no O_APPEND: ranges are written at their offsets (pwrite appends under O_APPEND)
        return os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LocalWriteError(exc.errno, exc.strerror, str(partial)) from None


def _every(on_progress: Progress) -> Callable[[int], None]:
    """``on_progress`` every PROGRESS_EVERY bytes, not on every block."""
    last = [0]

    def note(pos: int) -> None:
        if pos - last[0] >= PROGRESS_EVERY:
            on_progress(pos)
            last[0] = pos
    return note


class _Link:
    """One ssh running the box's command, its stderr kept for the error message."""

    def __init__(self, ssh_argv: list[str], target: str, command: str):
        self.argv = [*ssh_argv, target, command]
        self.code: Optional[int] = None
        self.err = ""
        self.group: Optional[TransferGroup] = None

    def run(self, rx: "_Receiver", timeout_s: float) -> None:
        with tempfile.TemporaryFile() as errf:
            self.group = TransferGroup(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=errf, bufsize=0)
            proc = self.group.proc
            try:
                rx.run(proc.stdout.fileno(), timeout_s)
                if rx.pos < rx.end or not rx.started:
                    try:
                        proc.wait(timeout=30)  # end of stream: ssh is exiting, let it say how
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                proc.stdout.close()
                self.group.close()  # a stream cut at its end (the file grew) ends here
            errf.seek(0)
            self.err = errf.read()[-2000:].decode(errors="replace").strip()
        self.code = proc.returncode

    def cannot(self, rx: "_Receiver") -> bool:
        """The box cannot stream: no such command (127), or a shell that did not run ours."""
        return rx.got == 0 and (self.code == 127 or (self.code != 255 and not rx.started))

    def check(self, rx: "_Receiver", end: int, remote: str) -> None:
        if not rx.started:
            raise TransportError(f"ssh stream of {remote} failed (exit {self.code}): {self.err[-300:]}",
                                 "run the pull again: it resumes from the bytes already here")
        if rx.pos < end and self.code != 0:
            raise TransportError(f"ssh stream of {remote} stopped at byte {rx.pos} (exit {self.code}): "
                                 f"{self.err[-300:]}", "run the pull again: it resumes from the bytes already here")


class _Receiver:
    """Reads one ssh's stdout: skips login noise up to the marker and the ``drop`` bytes
    before the range, then writes every block at its offset in the partial, up to ``end``,
    paced to ``rate`` bytes/s when set (as rsync's --bwlimit). With a ``hasher`` each block
    goes on to the hashing thread; without, the block's writeback starts here."""

    def __init__(self, path: Path, wfd: int, pos: int, end: int, drop: int, rate: float,
                 hasher: Optional["_HashThread"], note: Callable[[int], None],
                 flush: Optional[Callable[[int, int, int], object]] = None):
        self.path = str(path)
        self.wfd = wfd
        self.pos = self.start = self.flushed = pos
        self.end = end
        self.drop = drop
        self.rate = rate
        self.hasher = hasher
        self.note = note
        self.flush = flush
        self.got = 0  # payload bytes received (the dropped ones too: they crossed the link)
        self.started = False
        self.noise = b""
        self.own = bytearray(CHUNK) if hasher is None else None

    def _buffer(self) -> bytearray:
        return self.hasher.buffer() if self.hasher is not None else self.own

    def run(self, rfd: int, stall_s: float) -> None:
        """Until ``end``, the end of the stream, or nothing arrived for ``stall_s`` (a stall,
        not the whole file's time: a 500 GB checkpoint may take hours). Reads fill a whole
        CHUNK before it is written: one write and one hand-off per MiB."""
        try:
            import fcntl

            fcntl.fcntl(rfd, _F_SETPIPE_SZ, PIPE_SIZE)
        except (ImportError, OSError):
            pass  # the default pipe works, with more reads
        os.set_blocking(rfd, False)
        poller = select.poll()
        poller.register(rfd, select.POLLIN | select.POLLHUP)
        self._t0 = time.monotonic()
        deadline = self._t0 + stall_s
        buf, fill = self._buffer(), 0
        while self.pos + fill < self.end:
            try:  # non-blocking: a poll only when the pipe is empty, not before every read
                n = os.readv(rfd, [memoryview(buf)[fill:]])
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"ssh stream stalled at byte {self.pos + fill}: nothing "
                                         f"came for {stall_s:.0f} s",
                                         "run the pull again: it resumes from the bytes already here")
                if not poller.poll(min(1000, int(left * 1000) + 1)) and fill:
                    self._emit(buf, fill)  # a slow link: what did come is written now
                    buf, fill = self._buffer(), 0
                continue
            if n == 0:
                break  # end of stream: the caller reads ssh's exit status
            deadline = time.monotonic() + stall_s
            if not self.started or self.drop:
                n = self._strip(buf, fill, n)
                if not n:
                    continue
            fill = min(fill + n, self.end - self.pos)  # the file grew on the box: cut at the end
            if fill == len(buf) or self.pos + fill >= self.end:
                self._emit(buf, fill)
                buf, fill = self._buffer(), 0
        if fill:
            self._emit(buf, fill)
        elif self.hasher is not None:
            self.hasher.free.put(buf)  # unused: back to the free list

    def _strip(self, buf: bytearray, fill: int, n: int) -> int:
        """Keep only payload in ``buf[fill:fill + n]`` (noise and marker out, then the first
        ``drop`` bytes); returns how many bytes of payload are left there."""
        data = bytes(buf[fill:fill + n])  # at most the first MiB or two: the copy is cheap
        if not self.started:
            rest = self._after_mark(data)
            if rest is None:
                return 0
            data = rest
        if self.drop:
            cut = min(self.drop, len(data))
            data, self.drop = data[cut:], self.drop - cut
            self.got += cut
        buf[fill:fill + len(data)] = data
        return len(data)

    def _emit(self, buf: bytearray, fill: int) -> None:
        """Write ``buf[:fill]`` at its offset, hand it to the hash (or start its writeback),
        report, keep the pace."""
        block = memoryview(buf)[:fill]
        done = 0
        while done < fill:
            try:
                done += os.pwrite(self.wfd, block[done:], self.pos + done)
            except OSError as exc:
                raise LocalWriteError(exc.errno, exc.strerror, self.path) from None
        if self.hasher is not None:
            self.hasher.submit(buf, fill)
        elif self.flush is not None and self.pos + fill - self.flushed >= WRITEBACK:
            self.flush(self.wfd, self.flushed, self.pos + fill - self.flushed)
            self.flushed = self.pos + fill
        self.pos += fill
        self.got += fill
        self.note(self.pos)
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
