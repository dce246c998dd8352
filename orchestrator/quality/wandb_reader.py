"""Weights & Biases sources: offline ``run-<id>.wandb`` files (stdlib) and the online API.

The ``.wandb`` file is a LevelDB-style log (7-byte file header, 32 KiB blocks, chunks of
checksum/length/type) of ``wandb_internal.Record`` protobufs; we decode only history rows
(field 2: items {key, value_json}, step) and the run record's ``resumed`` flag. A partial
last block means the writer is still active: we stop there and resume from that offset.
The online API is used only when the optional ``wandb`` package is importable.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Dict, Iterable, List, Optional, Tuple

from orchestrator.quality.series import SYNONYMS, Run
from orchestrator.quality.tfevents import _ld, _skip, _varint, _vint

HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
BLOCK = 32768
CHUNK_HDR = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}


def _history(buf: bytes) -> Tuple[Optional[float], List[Tuple[str, float]], bool]:
    """Decode a Record: (step, [(key, value)], resumed-flag) for history records."""
    i, end = 0, len(buf)
    step = None
    vals: List[Tuple[str, float]] = []
    resumed = False
    while i < end:
        k, i = _varint(buf, i)
        f, wt = k >> 3, k & 7
        if f == 2 and wt == 2:  # HistoryRecord
            n, i = _varint(buf, i)
            hend = i + n
            while i < hend:
                hk, i = _varint(buf, i)
                hf, hwt = hk >> 3, hk & 7
                if hf == 1 and hwt == 2:  # HistoryItem
                    m, i = _varint(buf, i)
                    key = vjson = None
                    iend = i + m
                    while i < iend:
                        ik, i = _varint(buf, i)
                        if ik >> 3 in (1, 16) and ik & 7 == 2:
                            L, i = _varint(buf, i)
                            txt = buf[i:i + L].decode("utf-8", "replace")
                            if ik >> 3 == 1:
                                key = txt
                            else:
                                vjson = txt
                            i += L
                        else:
                            i = _skip(buf, i, ik & 7)
                    if key is not None and vjson is not None:
                        try:
                            v = json.loads(vjson)
                        except ValueError:
                            v = None
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            if key == "_step" and step is None:
                                step = float(v)
                            elif not key.startswith("_"):
                                vals.append((key, float(v)))
                elif hf == 2 and hwt == 2:  # HistoryStep {num}
                    m, i = _varint(buf, i)
                    send = i + m
                    while i < send:
                        sk, i = _varint(buf, i)
                        if sk == 0x08:
                            num, i = _varint(buf, i)
                            step = float(num)
                        else:
                            i = _skip(buf, i, sk & 7)
                else:
                    i = _skip(buf, i, hwt)
        elif f == 17 and wt == 2:  # RunRecord: look for resumed (18)
            n, i = _varint(buf, i)
            rend = i + n
            while i < rend:
                rk, i = _varint(buf, i)
                if rk >> 3 == 18 and rk & 7 == 0:
                    r, i = _varint(buf, i)
                    resumed = bool(r)
                else:
                    i = _skip(buf, i, rk & 7)
        else:
            i = _skip(buf, i, wt)
    return step, vals, resumed


class WandbFileSource:
    """An offline ``run-<id>.wandb`` file read chunk by chunk from a saved offset."""

    kind = "wandb"

    def __init__(self, path: str, verify: bool = True):
        self.path = path
        self.offset = 0
        self.verify = verify
        self.corrupt = 0

    def poll(self, run: Run) -> str:
        with open(self.path, "rb") as f:
            if self.offset == 0:
                head = f.read(CHUNK_HDR)
                if len(head) < CHUNK_HDR:
                    return "ok"
                if head[:4] != b":W&B":
                    raise ValueError("%s: not a W&B run file (bad header)" % self.path)
                self.offset = CHUNK_HDR
            f.seek(self.offset)
            data = f.read()
        pos = self.offset
        i = 0
        parts: List[bytes] = []
        start_of_record = pos
        n = len(data)
        while True:
            left = BLOCK - (pos + i) % BLOCK
            if left < CHUNK_HDR:
                if i + left > n:
                    break
                i += left
                continue
            if i + CHUNK_HDR > n:
                break
            crc, length, typ = struct.unpack_from("<IHB", data, i)
            if i + CHUNK_HDR + length > n:
                break
            payload = data[i + CHUNK_HDR:i + CHUNK_HDR + length]
            i += CHUNK_HDR + length
            if typ not in _TYPE_CRC or (self.verify and zlib.crc32(payload, _TYPE_CRC[typ]) & 0xFFFFFFFF != crc):
                self.corrupt += 1
                parts = []
                start_of_record = pos + i
                continue
            if typ == FULL:
                parts = [payload]
            elif typ == FIRST:
                parts = [payload]
                continue
            elif typ == MIDDLE:
                parts.append(payload)
                continue
            else:
                parts.append(payload)
            self._record(b"".join(parts), run)
            parts = []
            start_of_record = pos + i
        self.offset = start_of_record
        return "ok"

    def _record(self, rec: bytes, run: Run) -> None:
        step, vals, resumed = _history(rec)
        if resumed:
            run.meta["resumed"] = True
        if vals:
            if step is None:
                step = (run.last_step + 1) if run.last_step is not None else 0.0
            run.add_record(step, [(SYNONYMS.get(k.lower(), k), v) for k, v in vals])

    def state(self) -> dict:
        return {"offset": self.offset}


class WandbApiSource:
    """A run on the W&B server (``wandb:entity/project/run_id``), polled with scan_history."""

    kind = "wandb_api"

    def __init__(self, ref: str):
        self.ref = ref.split(":", 1)[1] if ref.startswith("wandb:") else ref
        self.min_step = 0

    def poll(self, run: Run) -> str:
        try:
            import wandb  # type: ignore
        except ImportError:
            raise OSError("the optional 'wandb' package is not installed on this machine")
        api_run = wandb.Api(timeout=30).run(self.ref)
        for row in api_run.scan_history(min_step=self.min_step, page_size=1000):
            step = row.get("_step")
            vals = [(SYNONYMS.get(k.lower(), k), float(v)) for k, v in row.items()
                    if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)]
            if step is not None and vals:
                run.add_record(float(step), vals)
                self.min_step = int(step) + 1
        return "ok"

    def state(self) -> dict:
        return {"min_step": self.min_step}


class WandbWriter:
    """Writes history rows in the offline ``.wandb`` format (tests, bench, fixtures)."""

    def __init__(self, path: str, append: bool = False):
        self.f = open(path, "ab" if append else "wb")
        if not append:
            self.f.write(HEADER)
        self.pos = self.f.tell()

    def _chunk(self, typ: int, data: bytes) -> None:
        crc = zlib.crc32(data, _TYPE_CRC[typ]) & 0xFFFFFFFF
        self.f.write(struct.pack("<IHB", crc, len(data), typ) + data)
        self.pos += CHUNK_HDR + len(data)

    def write_record(self, rec: bytes) -> None:
        first = True
        while True:
            left = BLOCK - self.pos % BLOCK
            if left < CHUNK_HDR:
                self.f.write(b"\x00" * left)
                self.pos += left
                continue
            room = left - CHUNK_HDR
            part, rec = rec[:room], rec[room:]
            if first and not rec:
                typ = FULL
            elif first:
                typ = FIRST
            elif not rec:
                typ = LAST
            else:
                typ = MIDDLE
            self._chunk(typ, part)
            first = False
            if not rec:
                return

    def history(self, step: int, values: Dict[str, float]) -> None:
        items = b""
        for k, v in list(values.items()) + [("_step", step)]:
            items += _ld(1, _ld(1, k.encode()) + _ld(16, json.dumps(v).encode()))
        self.write_record(_ld(2, items + _ld(2, b"\x08" + _vint(step))))

    def run_record(self, resumed: bool = False, starting_step: int = 0) -> None:
        body = b"\x70" + _vint(starting_step) if starting_step else b""
        if resumed:
            body += _vint(18 << 3) + b"\x01"
        self.write_record(_ld(17, body))

    def close(self) -> None:
        self.f.close()


def write_wandb(path: str, rows: Iterable[Tuple[int, Dict[str, float]]], resumed: bool = False) -> None:
    w = WandbWriter(path)
    w.run_record(resumed=resumed)
    for step, vals in rows:
        w.history(step, vals)
    w.close()
