"""A large file over several ssh streams at once, one byte range each, written at its offset.

The record of the ranges (the sidecar), the plan and the box's command are ``sync.ranges``;
one stream's reader, the marker and the hashing thread are ``sync.stream``. Here: one thread
per range reading its ssh, the first unfinished range hashed as it arrives, the ranges after
it hashed from the page cache as soon as the range before is in (SHA-256 is sequential), and
the sidecar kept behind the bytes. The engine still compares the digest of every byte with
the manifest before anything gets its final name.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional

from orchestrator.sync.ranges import drop as drop_record
from orchestrator.sync.ranges import range_command, save
from orchestrator.sync.stream import MARK, _HashThread, _Link, _open, _Receiver
from orchestrator.sync.transfer import CHUNK, Fetched, LocalWriteError, Progress, _range_flusher, prefix_hasher

RECORD_EVERY = 32 << 20  # a range's progress reaches its sidecar every 32 MiB (and at its end)


class _Record:
    """The ranges' progress shared by their receivers: written to the sidecar every
    RECORD_EVERY bytes of a range (after the bytes), and waited on by the hash of later ranges."""

    def __init__(self, partial: Path, size: int, ranges: list[list[int]]):
        self.partial, self.size, self.ranges = partial, size, ranges
        self.ended = [p >= e for _b, p, e in ranges]
        self.saved = [p for _b, p, _e in ranges]
        self.cond = threading.Condition()
        save(partial, size, ranges)  # before any byte lands past the prefix

    def advance(self, k: int, pos: int) -> None:
        with self.cond:
            self.ranges[k][1] = pos
            if pos - self.saved[k] >= RECORD_EVERY:
                save(self.partial, self.size, self.ranges)
                self.saved[k] = pos
            self.cond.notify_all()

    def end(self, k: int) -> None:
        with self.cond:
            self.ended[k] = True
            save(self.partial, self.size, self.ranges)
            self.cond.notify_all()

    def wait(self, k: int, beyond: int, timeout: float) -> tuple[int, bool]:
        """(bytes written up to, ended) of range ``k`` once past ``beyond`` or ended."""
        with self.cond:
            if self.ranges[k][1] <= beyond and not self.ended[k]:
                self.cond.wait(timeout)
            return self.ranges[k][1], self.ended[k]

    def done(self) -> int:
        return sum(p - b for b, p, _e in self.ranges)


def ranged(ssh_argv: list[str], target: str, remote: str, partial: Path, size: int,
           ranges: list[list[int]], on_progress: Progress, timeout_s: float,
            bwlimit_kbps: int) -> Optional[Fetched]:
    """One ssh per unfinished range, each written at its offset by a thread of its own. The
    first unfinished range (the lead) is hashed as it arrives; the ranges after it are hashed
    from the page cache once the lead is in (SHA-256 is sequential), while they still arrive."""
    wfd = _open(partial)  # first: a record never names a partial that is not there
    rec = _Record(partial, size, ranges)
    lead = next((k for k, r in enumerate(ranges) if r[1] < r[2]), len(ranges))
    resumed = ranges[lead][1] if lead < len(ranges) else size
    h = prefix_hasher(partial, resumed)  # every range before the lead is complete
    todo = [k for k, r in enumerate(ranges) if r[1] < r[2]]
    flush = _range_flusher()
    rate = bwlimit_kbps * 1024.0 / max(1, len(todo))
    hasher = _HashThread(h, wfd, resumed, flush) if todo else None
    links: dict[int, _Link] = {}
    rxs: dict[int, _Receiver] = {}
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    for k in todo:
        _b, p, e = ranges[k]
        cmd, drop = range_command(remote, MARK.decode().strip(), p, e, k == len(ranges) - 1)
        note = (lambda pos, k=k: rec.advance(k, pos))
        rxs[k] = _Receiver(partial, wfd, p, e, drop, rate, hasher if k == lead else None, note, flush)
        links[k] = _Link(ssh_argv, target, cmd)
        threads.append(threading.Thread(target=_run_range, args=(links[k], rxs[k], rec, k, timeout_s, errors),
                                        name=f"gpurun-range-{k}", daemon=True))
    for t in threads:
        t.start()
    rfd = os.open(partial, os.O_RDONLY)
    try:
        while threads and threads[0].is_alive():  # the lead: hashed as it comes
            threads[0].join(0.25)
            on_progress(rec.done())
        if hasher is not None:
            hasher.close()
            hasher = None
        hashed = _hash_after(rec, h, rfd, lead, on_progress)
        for t in threads:
            while t.is_alive():
                t.join(0.25)
                on_progress(rec.done())
    finally:
        if hasher is not None:
            hasher.close()
        for link in links.values():
            if link.group is not None:
                link.group.kill()  # an error elsewhere: the other ranges stop too (their bytes stay)
        for t in threads:
            t.join()
        os.close(rfd)
        os.close(wfd)
    for exc in errors:
        if isinstance(exc, LocalWriteError):
            raise exc
    if any(links[k].code == 127 for k in todo) or (todo and all(links[k].cannot(rxs[k]) for k in todo)):
        return None  # no dd there, or a shell that did not run the command: rsync (it settles the record)
    for exc in errors:
        raise exc
    for k in todo:
        links[k].check(rxs[k], ranges[k][2], remote)
    wire = sum(rx.got + len(MARK) for rx in rxs.values())
    if hashed == size:
        drop_record(partial)  # a plain complete file now: the engine verifies, renames or deletes it
    on_progress(rec.done())
    return Fetched(h.hexdigest(), hashed, wire, resumed, "ssh-stream")


def _run_range(link: _Link, rx: _Receiver, rec: _Record, k: int, timeout_s: float,
               errors: list) -> None:
    try:
        link.run(rx, timeout_s)
    except BaseException as exc:  # handed to the caller's thread, which raises it
        errors.append(exc)
    finally:
        rec.end(k)


def _hash_after(rec: _Record, h, rfd: int, lead: int, on_progress: Progress) -> int:
    """Hash the ranges after the lead from the partial as their bytes land; returns how far
    the file is hashed (the size, unless a range ended short)."""
    ranges = rec.ranges
    if lead >= len(ranges):
        return rec.size
    at = ranges[lead][1]
    if at < ranges[lead][2]:
        return at  # the lead ended short: nothing after it counts
    buf = bytearray(CHUNK)
    for k in range(lead + 1, len(ranges)):
        while at < ranges[k][2]:
            pos, ended = rec.wait(k, at, 0.25)
            on_progress(rec.done())
            if pos <= at:
                if ended:
                    return at
                continue
            while at < pos:
                n = os.preadv(rfd, [memoryview(buf)[:min(CHUNK, pos - at)]], at)
                if n <= 0:
                    return at
                h.update(memoryview(buf)[:n])
                at += n
    return at
