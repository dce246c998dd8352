"""Reading gpurun's own input files (queue files, profiles, config.yaml, hosts.json) the one
way (and rewriting the JSON inventories, ``locked_rewrite``): a regular file, bounded in size, read with a bounded read, UTF-8. Every other case is
the caller's ``BadInput`` class naming the file (and the line of a bad byte), so all of them
refuse the same things with the same words. Stdlib and ``errors`` only: ``hosts`` reads
through this on every command and in shell completion, so it must stay cheap to import.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.errors import BadInput


def read_text(path: str | Path, limit: int, *, error: type[BadInput], what: str) -> str:
    """The text of ``path``, a regular UTF-8 file of at most ``limit`` bytes; every other case
    raises ``error`` naming the file (and the line of a bad byte). A FIFO, a device
    (``/dev/zero``) or a socket is refused before any read (one would block forever, one never
    ends), and the read stops at ``limit`` + 1 bytes even if the file grows. FileNotFoundError
    and IsADirectoryError are left to the caller, for whom an absent file may be normal."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block before the check below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, IsADirectoryError):
        raise
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror})", "check the file's permissions") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: is not a regular file (a pipe, device or socket)",
                        f"the {what} must be a plain file: write it to disk first")
        if st.st_size > limit:
            raise _too_big(path, limit, error, what)
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise _too_big(path, limit, error, what)
    except OSError as exc:
        if isinstance(exc, IsADirectoryError):
            raise
        raise error(f"{path}: cannot read the {what} ({exc.strerror})", "check the file") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x})",
                    f"save the {what} as UTF-8") from None


def read_json(path: str, limit: int, *, error: type[BadInput], what: str, fix: str) -> tuple[Any, str] | None:
    """``(data, text)`` of a JSON inventory file (hosts.json, fleets.json) read as ``read_text``
    reads; None when it does not exist. A directory, bad JSON (its line named) or JSON nested
    too deeply is ``error`` with ``fix`` as the hint."""
    try:
        text = read_text(path, limit, error=error, what=what)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not the {what.split(' (')[0]}", "move it away") from None
    try:
        return json.loads(text), text
    except ValueError as exc:
        where = f":{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise error(f"{path}{where}: not valid JSON ({getattr(exc, 'msg', exc)})", fix) from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply", fix) from None


@contextmanager
def locked_rewrite(path: str, read: Callable[[], dict], check: Callable[[dict, str], Any],
                   top: str) -> Iterator[dict]:
    """Change a JSON inventory (hosts.json, fleets.json) under an flock: ``read()`` it (a broken
    file is refused, never replaced by an empty one), yield it for the caller to change, then
    ``check`` it (nothing is written that the next read would refuse) and replace the file in
    one rename."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        data = read()
        data.setdefault(top, {})
        yield data
        check(data, path)
        tmp = path + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)


def _too_big(path: str | Path, limit: int, error: type[BadInput], what: str) -> BadInput:
    size = f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit // 1024} KiB"
    return error(f"{path}: is larger than {size}", f"is this the right file? a {what} is never that big")
