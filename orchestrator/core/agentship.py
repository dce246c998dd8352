"""Builds the agent zipapp that is shipped to hosts.

The zipapp holds ``orchestrator/__init__.py`` and the stdlib-only rooms ``agent``, ``quality``
and ``health``. Its build id is a hash of those sources, so any change of the agent's code
gives a new file name on the host (a running daemon keeps its own file) and a restart.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import zipfile
from pathlib import Path

from orchestrator import paths

PKG = Path(__file__).resolve().parent.parent
ROOMS = ("agent", "quality", "health")
MAIN = "import sys\nfrom orchestrator.agent.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"


def _sources() -> list[tuple[str, Path]]:
    out = [("orchestrator/__init__.py", PKG / "__init__.py")]
    for room in ROOMS:
        base = PKG / room
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            out.append((f"orchestrator/{p.relative_to(PKG).as_posix()}", p))
    return out


def build() -> tuple[str, Path]:
    """Return ``(build_id, path)`` of the agent zipapp, building it once per content."""
    srcs = _sources()
    blobs = [(arc, p.read_bytes()) for arc, p in srcs]
    h = hashlib.sha256()
    for arc, data in blobs:
        h.update(arc.encode() + b"\0" + data + b"\0")
    build_id = h.hexdigest()[:16]
    cache = paths.data_home() / "cache"
    target = cache / f"agent-{build_id}.pyz"
    if target.exists():
        return build_id, target
    cache.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("__main__.py", MAIN)
        for arc, data in blobs:
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    tmp = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(b"#!/usr/bin/env python3\n" + buf.getvalue())
    os.replace(tmp, target)
    return build_id, target
