"""Byte ranges of one large file pulled over parallel ssh streams, and their resume record.

Why several streams: on a small machine a single stream is a pipeline of single-threaded
stages (the box's sshd encrypting, the home ssh decrypting, gpurun's reader), so one stream
leaves CPUs idle while the next stage waits; two connections keep both ends' cores busy
(docs/BENCHMARKS.md, issue 15 item 2). Each stream carries one range, written at its offset.

The partial is then no longer a prefix of the file: the sidecar ``<partial>.gpurun-ranges``
records, per range, ``begin pos end`` (bytes ``[begin, pos)`` are written). It is rewritten
(temp file + rename) only after the bytes it claims were written, so a ``kill -9`` leaves it
behind the data, never ahead. A sidecar that lies anyway (a power cut dropped data it
claims) costs a re-pull, never a wrong file: the engine renames nothing whose SHA-256 of
every byte differs from the box's manifest. A sidecar that does not parse, or does not fit
its partial, is dropped together with the partial (its prefix is unknown).

Every other way of resuming (rsync, SFTP, a single stream) appends to a prefix: before any of
them runs, :func:`settle` truncates a ranged partial to its contiguous prefix.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

SUFFIX = ".gpurun-ranges"
HEADER = "gpurun-ranges 1"
ALIGN = 1 << 20  # ranges start on MiB boundaries: the box's ``dd bs=1M skip=K`` then lands exactly

Range = list  # [begin, pos, end]


def sidecar(partial: Path) -> Path:
    return partial.with_name(partial.name + SUFFIX)


def plan(start: int, size: int, n: int) -> list[Range]:
    """``n`` ranges covering ``[0, size)`` with ``[0, start)`` already here: the first one
    holds the prefix and goes on from ``start``, the others begin on MiB boundaries."""
    rest = size - start
    cuts = [(start + rest * k // n) // ALIGN * ALIGN for k in range(1, n)]
    cuts = [c for c in cuts if start < c < size]
    bounds = [0, *sorted(set(cuts)), size]
    out = [[bounds[k], bounds[k], bounds[k + 1]] for k in range(len(bounds) - 1)]
    out[0][1] = start
    return out


def save(partial: Path, size: int, ranges: list[Range]) -> None:
    """Rewrite the sidecar atomically (the caller wrote the bytes it claims first)."""
    path = sidecar(partial)
    tmp = path.with_name(path.name + ".tmp")
    body = f"{HEADER} {size}\n" + "".join(f"{b} {p} {e}\n" for b, p, e in ranges)
    with open(tmp, "w") as fh:
        fh.write(body)
    os.replace(tmp, path)


def load(partial: Path, size: int) -> Optional[list[Range]]:
    """The ranges recorded for ``partial``, or None when there is no (usable) record. A
    record that does not fit (another size, a partial shorter than it claims, not covering
    the file) is dropped with its partial: the partial's prefix cannot be trusted then."""
    path = sidecar(partial)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        text = ""
    ranges = _parse(text, size)
    try:
        have = partial.stat().st_size
    except FileNotFoundError:
        have = -1
    if ranges is None or have < 0 or have > size or have < max(p for _b, p, _e in ranges):
        drop(partial, with_partial=have >= 0)
        return None
    return ranges


def peek(partial: Path, size: int) -> Optional[list[Range]]:
    """The record as it stands, changing nothing (for a reader outside the pull's lock)."""
    try:
        return _parse(sidecar(partial).read_text(), size)
    except (OSError, UnicodeDecodeError):
        return None


def _parse(text: str, size: int) -> Optional[list[Range]]:
    lines = text.splitlines()
    if not lines or lines[0] != f"{HEADER} {size}":
        return None
    try:
        ranges = [[int(x) for x in ln.split()] for ln in lines[1:]]
    except ValueError:
        return None
    if not ranges or any(len(r) != 3 or not r[0] <= r[1] <= r[2] for r in ranges):
        return None
    if ranges[0][0] != 0 or ranges[-1][2] != size:
        return None
    if any(a[2] != b[0] for a, b in zip(ranges, ranges[1:])):
        return None
    return ranges


def drop(partial: Path, with_partial: bool = False) -> None:
    sidecar(partial).unlink(missing_ok=True)
    if with_partial:
        partial.unlink(missing_ok=True)


def settle(partial: Path, size: int) -> None:
    """Before an append-only resume (rsync, SFTP, one stream): a ranged partial becomes its
    contiguous prefix (the bytes of later ranges are dropped), and its sidecar goes."""
    ranges = load(partial, size)
    if ranges is None:
        return
    prefix = 0
    for b, p, e in ranges:
        if b != prefix:
            break
        prefix = p
        if p < e:
            break
    os.truncate(partial, prefix)
    drop(partial)


def range_command(remote: str, mark: str, begin: int, end: int, last: bool) -> tuple[str, int]:
    """(the box's command for bytes ``[begin, end)``, bytes to drop at the front): ``dd``
    reads from the MiB boundary at or before ``begin`` (POSIX, 1 MiB reads and writes: the
    box's CPU of ``cat``); the last range reads to the end (the caller cuts at the size)."""
    first = begin // ALIGN
    count = "" if last else f" count={-(-(end - first * ALIGN) // ALIGN)}"
    cmd = (f"printf '%s\\n' {mark}; exec dd {shlex.quote('if=' + remote)} bs={ALIGN} "
           f"skip={first}{count}")
    return cmd, begin - first * ALIGN
