"""Resumable single-file transfers into a staging path, hashed while the bytes arrive.

Three methods, one contract ``fetch(remote, partial, size, on_progress) -> Fetched``: rsync
(``--append-verify``, over SSH or local), SFTP with offset resume (paramiko), and a plain
local copy. A partial file is only ever appended to; the caller verifies and renames it."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

from orchestrator.errors import TransportError
from orchestrator.sync.procgroup import TransferGroup
from orchestrator.transport.openssh import host_argv

CHUNK = 1 << 20
WRITEBACK = 16 << 20  # start writeback of what the tail hasher has read, every 16 MiB
Progress = Callable[[int], None]  # called with the partial file's current size


@dataclass
class Fetched:
    sha256: str     # of the whole partial file as it stands on disk
    size: int
    wire_bytes: int  # bytes received over the link (rsync's figure, or payload for SFTP)
    resumed_from: int
    method: str = ""  # how it came, when not the fetcher's usual way (``ssh-stream``)


def prefix_hasher(path: Path, upto: int) -> "hashlib._Hash":
    h = hashlib.sha256()
    if upto <= 0:
        return h
    with open(path, "rb") as fh:
        left = upto
        while left > 0:
            block = fh.read(min(CHUNK, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h


def _start_offset(partial: Path, size: int) -> int:
    """Where an append-only resume starts: the partial's length (a partial written in
    ranges is cut to its contiguous prefix first, ``sync.ranges.settle``)."""
    from orchestrator.sync.ranges import settle

    partial.parent.mkdir(parents=True, exist_ok=True)
    settle(partial, size)
    have = partial.stat().st_size if partial.exists() else 0
    if have > size:  # the remote file shrank or was replaced: this partial is useless
        partial.unlink()
        have = 0
    return have


def _copy_hashing(src, partial: Path, size: int, h, progress: list, on_progress: Progress) -> None:
    """Append ``src`` to ``partial`` up to ``size`` bytes, hashing as it goes; ``progress[0]``
    holds the bytes now in ``partial`` (kept current so an error can say where it stopped)."""
    with open(partial, "ab") as dst:
        while progress[0] < size:
            block = src.read(min(CHUNK, size - progress[0]))
            if not block:
                break
            try:
                dst.write(block)
                dst.flush()  # a full disk surfaces here, on this block, not later in close()
            except OSError as exc:
                raise LocalWriteError(exc.errno, exc.strerror, str(partial)) from None
            h.update(block)
            progress[0] += len(block)
            on_progress(progress[0])
        try:
            os.fsync(dst.fileno())
        except OSError as exc:
            raise LocalWriteError(exc.errno, exc.strerror, str(partial)) from None


class LocalWriteError(OSError):
    """Writing the partial file at home failed (a full disk, a quota): never the link's
    fault, so it is not turned into a TransportError and ends the pull with one line."""


def no_space_in(stderr: str, where: Path) -> None:
    """Raise LocalWriteError(ENOSPC) when rsync's stderr says the destination is full."""
    if "No space left on device" in stderr or "Disk quota exceeded" in stderr:
        raise LocalWriteError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))


class Fetcher:
    """A pass's hooks around ``fetch``: ``expect(jobs)`` before it pulls that many jobs, ``close()``
    after it (``sshmux.MuxRsyncFetcher`` shares one SSH login over them); no-ops here."""

    def expect(self, jobs: int) -> None:
        pass

    def close(self) -> None:
        pass


class LocalFetcher(Fetcher):
    """The host is this machine: copy with offset resume."""

    method = "local"

    def fetch(self, remote: str, partial: Path, size: int, on_progress: Progress) -> Fetched:
        start = _start_offset(partial, size)
        h = prefix_hasher(partial, start)
        progress = [start]
        with open(remote, "rb") as src:
            src.seek(start)
            _copy_hashing(src, partial, size, h, progress, on_progress)
        return Fetched(h.hexdigest(), progress[0], progress[0] - start, start)


class SftpFetcher(Fetcher):
    """SFTP with offset resume, for boxes without rsync. ``sftp_session()`` is the transport's
    (``SSHTransport.sftp_session``): a context manager that lends its one ``SFTPClient`` and
    holds its SFTP lock, so a push on the same connection waits for this file rather than
    reading its replies (paramiko reads them without a lock)."""

    method = "sftp"

    def __init__(self, sftp_session: Callable[[], ContextManager[Any]]):
        self._session = sftp_session

    def fetch(self, remote: str, partial: Path, size: int, on_progress: Progress) -> Fetched:
        start = _start_offset(partial, size)
        h = prefix_hasher(partial, start)
        progress = [start]
        try:
            # bytes as the OS spells them: paramiko would UTF-8-encode a str and fail on a
            # name that is not valid UTF-8 (it arrives from the box as surrogates)
            with self._session() as sftp, sftp.open(os.fsencode(remote), "rb") as src:
                src.seek(start)
                src.prefetch(size)  # pipelined reads from the current offset
                _copy_hashing(src, partial, size, h, progress, on_progress)
        except LocalWriteError:
            raise
        except (OSError, EOFError, *_paramiko_errors()) as exc:  # the session drops itself
            raise TransportError(f"SFTP transfer of {remote} stopped at byte {progress[0]}: {exc}",
                                 "run the pull again: it resumes from the bytes already here") from exc
        return Fetched(h.hexdigest(), progress[0], progress[0] - start, start)


def _paramiko_errors() -> tuple[type[BaseException], ...]:
    """paramiko's own link and protocol errors (loaded already: SFTP came over it)."""
    from orchestrator.transport.channel import _paramiko

    paramiko = _paramiko()
    return paramiko.SSHException, paramiko.SFTPError


class RsyncFetcher(Fetcher):
    """Many small files: one rsync ``--files-from`` per source dir (:meth:`fetch_tree`).
    One large file over SSH: a single stream hashed as it is written (``sync.stream``), rsync
    only where the box cannot stream. One file on this machine: rsync ``--append-verify``
    with a reader that hashes the file as it grows. Every rsync or ssh runs in its own
    process group that dies with gpurun (:class:`TransferGroup`)."""

    method = "rsync"

    def __init__(self, ssh_argv: Optional[list[str]] = None, target: str = "", timeout_s: float = 3600.0,
                 fast_cipher: bool = True, bwlimit_kbps: int = 0, stream: bool = True, streams: int = 1):
        self.ssh_argv = ssh_argv  # None: the "remote" path is on this machine
        self.target = target      # user@host (or alias) for SSH
        self.timeout_s = timeout_s
        self.fast_cipher = fast_cipher
        self.bwlimit_kbps = bwlimit_kbps  # pull.bwlimit_kbps: share a thin link (0: no limit)
        self.stream = stream and ssh_argv is not None  # False once a box could not stream
        self.streams = streams  # parallel ssh streams for one large file (sync.ranges)

    def _ssh_list(self) -> list[str]:
        argv = list(self.ssh_argv or [])
        # OpenSSH's default order starts with chacha20-poly1305; with AES instructions AES-GCM
        # moves bulk data at ~1.8x the rate for the same CPU. Same set of ciphers, so a box
        # without AES-GCM still negotiates; an explicit choice in the argv wins.
        if self.fast_cipher and _has_aes() and not any(a == "-c" or "Ciphers" in a for a in argv):
            argv[1:1] = ["-o", "Ciphers=" + _CIPHERS]
        return argv

    def _ssh_command(self) -> str:
        return " ".join(shlex.quote(a) for a in self._ssh_list())

    def _argv(self, *extra: str) -> list[str]:
        # -s (--protect-args): names travel inside rsync's protocol, never through the box's
        # shell, so quotes, ';', '*', spaces, newlines and non-ASCII names arrive as they are
        argv = ["rsync", "--append-verify", "--stats", "--no-motd", "-s", *extra]
        if self.bwlimit_kbps:
            argv.append(f"--bwlimit={int(self.bwlimit_kbps)}")
        if self.ssh_argv is not None:
            argv += ["-e", self._ssh_command()]
        return argv

    def _source(self, remote: str) -> str:  # ``user@host:path``, or the path on this machine
        return f"{self.target}:{_noglob(remote)}" if self.ssh_argv is not None else remote

    def fetch(self, remote: str, partial: Path, size: int, on_progress: Progress) -> Fetched:
        if self.stream:
            from orchestrator.sync.stream import ssh_stream  # it imports this module

            got = ssh_stream(self._ssh_list(), self.target, remote, partial, size, on_progress,
                             self.timeout_s, self.bwlimit_kbps, self.streams)
            if got is not None:
                return got
            self.stream = False  # this box cannot stream (no tail, odd shell): rsync from now on
        start = _start_offset(partial, size)
        if not partial.exists():
            partial.touch()
        # partial is under the job dir, so never a bare '-x' (an option) or 'a:b' (a host)
        argv = self._argv() + [self._source(remote), str(partial)]
        tail = _TailHasher(partial)
        group = TransferGroup(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        proc = group.proc
        out_box: dict = {}
        reader = threading.Thread(target=lambda: out_box.update(zip(("out", "err"), proc.communicate())),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                tail.pump()
                on_progress(tail.pos)
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    group.kill()
                    raise TransportError(f"rsync of {remote} timed out after {self.timeout_s:.0f} s")
                time.sleep(0.02)
        finally:
            group.close()
            reader.join(timeout=10)
        out = (out_box.get("out") or b"").decode(errors="replace")
        err = (out_box.get("err") or b"").decode(errors="replace").strip()
        if proc.returncode != 0:
            no_space_in(err, partial)
            raise TransportError(f"rsync of {remote} failed (exit {proc.returncode}): {err[-300:]}",
                                 "run the pull again: it resumes from the bytes already here")
        digest, have = tail.finish()
        on_progress(have)
        m = re.search(r"Total bytes received:\s*([\d,.]+)", out)
        wire = int(re.sub(r"[,.]", "", m.group(1))) if m else have - start
        return Fetched(digest, have, wire, start)

    def fetch_tree(self, remote_base: str, rels: list[str], dest_base: Path) -> tuple[int, int, str]:
        """One rsync for many files: ``remote_base/<rel>`` -> ``dest_base/<rel>`` for every
        ``rel`` (``--files-from``, ``--append-verify``: a partial left by a killed pull is
        resumed). Nothing is verified or renamed here: the caller hashes each file.

        Returns (rsync exit status, bytes received, last error line); never raises for a
        transfer failure, so the caller can keep what did arrive and verify it. A full
        destination raises LocalWriteError (ENOSPC)."""
        dest_base.mkdir(parents=True, exist_ok=True)
        argv = self._argv("--from0", "--files-from=-") + [
            self._source(remote_base.rstrip("/") + "/"), str(dest_base) + "/"]
        # NUL-separated, as the OS spells them (fsencode: undecodable names round-trip)
        listing = b"".join(os.fsencode(r) + b"\0" for r in rels)
        group = TransferGroup(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
        proc = group.proc
        try:
            out, err = proc.communicate(listing, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            group.kill()
            proc.communicate()
            return 30, 0, f"rsync timed out after {self.timeout_s:.0f} s"
        finally:
            group.close()
        m = re.search(r"Total bytes received:\s*([\d,.]+)", out.decode(errors="replace"))
        wire = int(re.sub(r"[,.]", "", m.group(1))) if m else 0
        text = err.decode(errors="replace")
        if proc.returncode != 0:
            no_space_in(text, dest_base)
        lines = [x for x in text.strip().splitlines() if x.strip()]
        return proc.returncode, wire, (lines[-1][:300] if lines else "")


def _noglob(remote: str) -> str:
    """A remote source for rsync's server, which expands ``*?[`` in its args even with -s
    (``[br].pt`` would fetch ``b.pt`` and ``r.pt``). Escaped only when a wildcard is present:
    rsync takes a wildcard-free arg literally, backslashes included."""
    if not any(c in remote for c in "*?["):
        return remote
    return re.sub(r"([\\*?\[\]])", r"\\\1", remote)


_CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
            "aes128-ctr,aes192-ctr,aes256-ctr")


@lru_cache(maxsize=1)
def _has_aes() -> bool:
    """Does this CPU have AES instructions (x86 AES-NI, ARMv8 crypto)? Unknown: yes on arm64
    and x86_64 machines of the last decade, so only a /proc/cpuinfo without the flag says no."""
    try:
        with open("/proc/cpuinfo") as fh:
            return bool(re.search(r"^(flags|Features)\s*:.*\baes\b", fh.read(1 << 16), re.M))
    except OSError:
        return True


def _range_flusher() -> Optional[Callable[[int, int, int], object]]:
    """Linux ``sync_file_range(fd, off, n, SYNC_FILE_RANGE_WRITE)``: start writing a range
    back now, so the fsync before the rename finds little left to do. None elsewhere."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return lambda fd, off, n: fn(fd, off, n, 2)
    except (OSError, AttributeError):
        return None


class _TailHasher:
    """Hashes a file that another process is appending to. A replaced or resized file is
    re-hashed in ``finish``; bytes rewritten in place are caught by the caller, which
    re-reads the file once when the streamed hash disagrees with the manifest."""

    def __init__(self, path: Path):
        self.path = path
        self.h = hashlib.sha256()
        self.pos = 0
        self.fh = open(path, "rb")
        self.ino = os.fstat(self.fh.fileno()).st_ino
        self.flush = _range_flusher()
        self.flushed = 0

    def pump(self, limit: int = 64) -> None:
        for _ in range(limit):
            block = self.fh.read(CHUNK)
            if not block:
                break
            self.h.update(block)
            self.pos += len(block)
        if self.flush is not None and self.pos - self.flushed >= WRITEBACK:
            self.flush(self.fh.fileno(), self.flushed, self.pos - self.flushed)
            self.flushed = self.pos

    def finish(self) -> tuple[str, int]:
        self.pump(limit=1 << 30)
        self.fh.close()
        st = os.stat(self.path)
        if st.st_ino != self.ino or st.st_size != self.pos:
            h = prefix_hasher(self.path, st.st_size)  # file replaced or rewritten: start over
            return h.hexdigest(), st.st_size
        return self.h.hexdigest(), self.pos


# OpenSSH client argv (without the target) and ``user@host`` for an inventory entry: the same
# argv and host-key policy as a push
ssh_argv_for = host_argv
