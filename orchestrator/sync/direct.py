"""One large file over SSH written into the partial by ssh itself, hashed from the page cache.

Why: in the piped stream (``sync.stream``) every byte is copied three times at home (ssh
writes the pipe, gpurun reads it, gpurun writes the file); here ssh's stdout *is* the partial
(opened for append), and gpurun only reads the new bytes back from the page cache to hash
them (and starts their writeback). On the 2-core loopback that is ~1 CPU-s per GiB less at
home and the pull ~0.5 s faster per GiB (docs/BENCHMARKS.md, issue 15 item 2).

What it gives up: there is no marker in front of the payload, so a login shell that prints
on stdout would put its words into the file. So a probe (``ssh box printf MARK`` must return
exactly the marker; cached per box for the life of the process) runs on a thread of its own
while the first stream starts (its login would cost ~0.2 s of a 3 s pull otherwise); a box
it finds chatty has its stream stopped and cut back to where it started, and the caller
streams the file through the marked pipe (``sync.stream``), as it does from then on. No
``bwlimit_kbps`` either (ssh cannot be paced). The marker goes to stderr: it says the
command ran. A stream that brings more bytes than the file has (noise after all, or a file
that grew) is cut back the same way. Whatever slips through fails the engine's SHA-256 check
against the manifest: nothing gets its final name unverified.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Union

from orchestrator.errors import TransportError
from orchestrator.sync.stream import MARK, PROGRESS_EVERY
from orchestrator.sync.procgroup import TransferGroup
from orchestrator.sync.transfer import (CHUNK, WRITEBACK, Fetched, LocalWriteError, Progress, _range_flusher,
                                         no_space_in)

_QUIET: dict[str, bool] = {}
_PROBES: dict[str, threading.Thread] = {}
POLL_S = 0.002   # the partial is read again this often while it grows
Verdict = Callable[[float], Optional[bool]]


class Noisy:
    """The stream was cut back (a chatty box, more bytes than the file): use the pipe."""

    def __init__(self, wasted: int):
        self.wasted = wasted  # bytes that crossed the link for nothing


def _key(ssh_argv: list[str], target: str) -> str:
    return "\0".join([*ssh_argv, target])


def quiet(ssh_argv: list[str], target: str) -> bool:
    """Does the box's login shell print nothing on stdout for a command? One probe per box."""
    key = _key(ssh_argv, target)
    if key not in _QUIET:
        try:
            res = subprocess.run([*ssh_argv, target, f"printf '%s\\n' {MARK.decode().strip()}"],
                                 stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
            said = res.returncode == 0 and res.stdout == MARK
        except (OSError, subprocess.SubprocessError):
            said = False
        _QUIET.setdefault(key, said)  # a stream that found noise meanwhile (forget) has the last word
    _PROBES.pop(key, None)  # answered: a cleared cache probes again
    return _QUIET[key]


def verdict_of(ssh_argv: list[str], target: str) -> Verdict:
    """``answer(wait_s)``: the probe's word (True: quiet), None while it is still out; the
    probe starts on a thread of its own unless the box's answer is known."""
    key = _key(ssh_argv, target)
    if key not in _QUIET and key not in _PROBES:
        _PROBES[key] = threading.Thread(target=quiet, args=(ssh_argv, target), daemon=True,
                                        name="gpurun-quiet-probe")
        _PROBES[key].start()

    def answer(wait_s: float = 0.0) -> Optional[bool]:
        probe = _PROBES.get(key)
        if probe is not None and wait_s and key not in _QUIET:
            probe.join(wait_s)
        return _QUIET.get(key)
    return answer


def forget(ssh_argv: list[str], target: str) -> None:
    _QUIET[_key(ssh_argv, target)] = False


def direct_stream(ssh_argv: list[str], target: str, remote: str, partial: Path, size: int, start: int,
                  h, on_progress: Progress, timeout_s: float, verdict: Verdict) -> Union[Optional[Fetched], Noisy]:
    """Append ``remote`` from byte ``start`` to ``partial`` (ssh writes it), hashing what lands
    into ``h`` (which holds the first ``start`` bytes). Fetched; None: the box cannot stream
    (rsync); Noisy: the probe found the box chatty, or more bytes came than the file has: the
    partial is back at ``start``."""
    copy = "cat" if start == 0 else f"tail -c +{start + 1}"
    cmd = f"printf '%s\\n' {MARK.decode().strip()} >&2; exec {copy} -- {shlex.quote(remote)}"
    try:
        wfd = os.open(partial, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LocalWriteError(exc.errno, exc.strerror, str(partial)) from None
    rfd = os.open(partial, os.O_RDONLY)
    try:
        with tempfile.TemporaryFile() as errf:
            try:
                group = TransferGroup([*ssh_argv, target, cmd], stdin=subprocess.DEVNULL, stdout=wfd, stderr=errf)
            finally:
                os.close(wfd)
            try:
                at = _follow(group.proc, rfd, h, start, size, on_progress, timeout_s, str(remote), verdict)
            finally:
                group.close()
            errf.seek(0)
            err = errf.read()[-4000:]
        code = group.proc.returncode
        length = os.fstat(rfd).st_size
    finally:
        os.close(rfd)
    started = MARK in err
    text = err.replace(MARK, b"").decode(errors="replace").strip()
    if length > size or verdict() is False or (length > start and verdict(60.0) is not True):
        os.truncate(partial, start)  # words of a login shell, or a file that grew: the pipe cuts it right
        forget(ssh_argv, target)
        return Noisy(length - start)
    if length == start and (code == 127 or (not started and code != 255)):
        return None  # no cat/tail there, or a shell that did not run the command: rsync
    if not started:
        raise TransportError(f"ssh stream of {remote} failed (exit {code}): {text[-300:]}",
                             "run the pull again: it resumes from the bytes already here")
    if at < size and code != 0:
        no_space_in(text, partial)  # ssh (or the box's cat, through it) could not write here
        raise TransportError(f"ssh stream of {remote} stopped at byte {length} (exit {code}): {text[-300:]}",
                             "run the pull again: it resumes from the bytes already here")
    on_progress(at)
    return Fetched(h.hexdigest(), at, length - start + len(MARK), start, "ssh-stream")


def _follow(proc: subprocess.Popen, rfd: int, h, at: int, size: int, on_progress: Progress,
            stall_s: float, remote: str, verdict: Verdict) -> int:
    """Hash the partial's new bytes up to ``size`` while ssh appends them; start their
    writeback every WRITEBACK bytes (the fsync before the rename then finds little to do).
    Returns how far it hashed once ssh has exited (or the probe found the box chatty: then
    the caller's close stops ssh and cuts the partial back)."""
    flush = _range_flusher()
    buf = bytearray(CHUNK)
    flushed = reported = at
    last = time.monotonic()
    while True:
        if verdict() is False:
            return at
        n = os.preadv(rfd, [memoryview(buf)[:min(CHUNK, size - at)]], at) if at < size else 0
        if n > 0:
            h.update(memoryview(buf)[:n])
            at += n
            last = time.monotonic()
            if flush is not None and at - flushed >= WRITEBACK:
                flush(rfd, flushed, at - flushed)
                flushed = at
            if at - reported >= PROGRESS_EVERY:
                on_progress(at)
                reported = at
            continue
        if proc.poll() is not None:
            if at < size and os.fstat(rfd).st_size > at:
                continue  # written just before it exited
            return at
        if at >= size:
            try:  # everything wanted is here; more would be noise or growth: ssh's end says
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            return at
        if time.monotonic() - last > stall_s:
            raise TransportError(f"ssh stream of {remote} stalled at byte {at}: nothing came for {stall_s:.0f} s",
                                 "run the pull again: it resumes from the bytes already here")
        time.sleep(POLL_S)
