"""Content checks on pulled files, beyond bytes and hash: can the format be loaded, and are
the tensors finite. Only light dependencies: stdlib, numpy and torch when importable.

Each check returns a dict; ``{"error": ...}`` means the file is not what its name claims.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
DEFAULT_SCAN_LIMIT = 2 * 1024 ** 3  # non-finite scans read the file: skip beyond this size
_ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def check_file(path: Path, scan_limit: int = DEFAULT_SCAN_LIMIT) -> dict[str, Any]:
    """The format check matching ``path``'s suffix; ``{}`` for formats we do not know."""
    name = path.name.lower()
    try:
        if name.endswith(".safetensors"):
            return check_safetensors(path, scan_limit)
        if name.endswith(TORCH_SUFFIXES):
            return check_torch(path, scan_limit)
        if name.endswith(".json") and path.stat().st_size <= 64 * 1024 * 1024:
            json.loads(path.read_text(encoding="utf-8"))
            return {"format": "json"}
        if name.endswith(".jsonl") and path.stat().st_size <= 256 * 1024 * 1024:
            return _check_jsonl(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {}


def _check_jsonl(path: Path) -> dict[str, Any]:
    bad = 0
    lines = 0
    with open(path, "r", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            lines += 1
            try:
                json.loads(line)
            except ValueError:
                bad += 1
    out: dict[str, Any] = {"format": "jsonl", "lines": lines}
    if bad:
        out["warning"] = f"{bad} unparseable line(s)"  # metrics are evidence; bytes match the host
    return out


def _safetensors_header(path: Path) -> tuple[dict, int]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError("safetensors file shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
            raise ValueError(f"safetensors header length {n} does not fit a {size}-byte file")
        header = json.loads(fh.read(n).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    return header, 8 + n


def check_safetensors(path: Path, scan_limit: int = DEFAULT_SCAN_LIMIT) -> dict[str, Any]:
    """Header parses, every tensor's dtype/shape matches its byte range, ranges tile the data
    section exactly; then a non-finite scan of float tensors when numpy is importable."""
    header, start = _safetensors_header(path)
    data_len = path.stat().st_size - start
    spans = []
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, meta in tensors.items():
        dtype, shape, offs = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if dtype not in _ST_SIZES or not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2:
            raise ValueError(f"safetensors tensor {name!r}: bad dtype/shape/offsets")
        count = 1
        for dim in shape:
            count *= int(dim)
        if offs[1] - offs[0] != count * _ST_SIZES[dtype] or offs[0] < 0 or offs[1] > data_len:
            raise ValueError(f"safetensors tensor {name!r}: byte range {offs} does not match {dtype}{shape}")
        spans.append((offs[0], offs[1]))
    spans.sort()
    pos = 0
    for a, b in spans:
        if a != pos:
            raise ValueError("safetensors data section has gaps or overlaps")
        pos = b
    if pos != data_len:
        raise ValueError(f"safetensors data section is {data_len} bytes, tensors cover {pos}")
    out: dict[str, Any] = {"format": "safetensors", "tensors": len(tensors)}
    out.update(_scan_safetensors(path, tensors, start, scan_limit))
    return out


def _scan_safetensors(path: Path, tensors: dict, start: int, scan_limit: int) -> dict[str, Any]:
    try:
        import numpy as np
    except ImportError:
        return {"nonfinite": "skipped (numpy not installed)"}
    if path.stat().st_size > scan_limit:
        return {"nonfinite": "skipped (file larger than scan limit)"}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    bad = 0
    for meta in tensors.values():
        a, b = meta["data_offsets"]
        raw = mm[start + a:start + b]
        if meta["dtype"] in ("F16", "F32", "F64"):
            arr = raw.view({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[meta["dtype"]])
            bad += int(arr.size - np.count_nonzero(np.isfinite(arr)))
        elif meta["dtype"] == "BF16":
            # bf16 is the top half of an f32: exponent all ones means inf or nan
            bits = raw.view("<u2")
            bad += int(np.count_nonzero((bits & 0x7F80) == 0x7F80))
    del mm
    return {"nonfinite": bad}


def check_torch(path: Path, scan_limit: int = DEFAULT_SCAN_LIMIT) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` when torch is importable (never the unsafe pickle
    path: a hostile file could otherwise run code); else a structural zip check."""
    try:
        import torch
    except ImportError:
        return _torch_structure(path)

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        return {"error": f"torch.load(weights_only=True) failed: {exc}"[:300]}
    tensors, bad = 0, 0
    scan = path.stat().st_size <= scan_limit
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            stack.extend(cur.values())
        elif isinstance(cur, (list, tuple)):
            stack.extend(cur)
        elif isinstance(cur, torch.Tensor):
            tensors += 1
            if scan and cur.is_floating_point():
                bad += int((~torch.isfinite(cur)).sum())
    return {"format": "torch", "loaded": True, "tensors": tensors, "nonfinite": bad}


def _torch_structure(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic.startswith(b"PK"):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        if not any(n.endswith("data.pkl") for n in names):
            return {"error": "zip archive without data.pkl: not a torch checkpoint"}
        return {"format": "torch-zip", "loaded": "skipped (torch not installed)", "entries": len(names)}
    if magic[:1] == b"\x80":
        return {"format": "torch-legacy-pickle", "loaded": "skipped (torch not installed)"}
    return {"format": "unknown", "loaded": "skipped (torch not installed)"}
