"""Weights & Biases sources: offline ``run-<id>.wandb`` files (stdlib) and the online API.

The ``.wandb`` file is a LevelDB-style log (7-byte file header, 32 KiB blocks, chunks of
checksum/length/type) of ``wandb_internal.Record`` protobufs; we decode only history rows
(field 2: items {key or nested_key, value_json}, step) and the run record (id, entity,
project, ``resumed``). Current wandb (checked with 0.31.0, ``tests/quality/fixtures/wandb/``)
writes each key as ``nested_key`` (item field 2, joined with ``/``); older ones as ``key``. A partial
last block means the writer is still active: we stop there and resume from that offset.
The online API is used only when the optional ``wandb`` package is importable.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from orchestrator.quality.series import SYNONYMS, Run
from orchestrator.quality.tfevents import _ld, _skip, _varint, _vint

HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
BLOCK = 32768
CHUNK_HDR = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}


def _history(buf: bytes, info: Optional[dict] = None) -> Tuple[Optional[float], List[Tuple[str, float]], bool]:
    """Decode a Record: (step, [(key, value)], resumed-flag) for history records; a run record's
    id, entity and project go into ``info`` when given."""
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
                    nested: List[str] = []
                    iend = i + m
                    while i < iend:
                        ik, i = _varint(buf, i)
                        if ik >> 3 in (1, 2, 16) and ik & 7 == 2:
                            L, i = _varint(buf, i)
                            txt = buf[i:i + L].decode("utf-8", "replace")
                            if ik >> 3 == 1:
                                key = txt
                            elif ik >> 3 == 2:  # nested_key: how wandb >= 0.19 writes every key
                                nested.append(txt)
                            else:
                                vjson = txt
                            i += L
                        else:
                            i = _skip(buf, i, ik & 7)
                    if not key and nested:
                        key = "/".join(nested)
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
        elif f == 17 and wt == 2:  # RunRecord: run_id (1), entity (2), project (3), resumed (18)
            n, i = _varint(buf, i)
            rend = i + n
            while i < rend:
                rk, i = _varint(buf, i)
                if rk >> 3 == 18 and rk & 7 == 0:
                    r, i = _varint(buf, i)
                    resumed = bool(r)
                elif rk >> 3 in (1, 2, 3) and rk & 7 == 2 and info is not None:
                    L, i = _varint(buf, i)
                    info[("run_id", "entity", "project")[(rk >> 3) - 1]] = buf[i:i + L].decode("utf-8", "replace")
                    i += L
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
        self.info: dict = {}  # the run record's run_id / entity / project, once read

    @property
    def url(self) -> str:
        """Where a person finds this run: its W&B page when it syncs online, else its directory."""
        return file_url(self.path, self.info)

    def poll(self, run: Run, limit: int = -1) -> str:
        """Read what was appended since the last poll (at most ``limit`` bytes when given)."""
        with open(self.path, "rb") as f:
            if self.offset == 0:
                head = f.read(CHUNK_HDR)
                if len(head) < CHUNK_HDR:
                    return "ok"
                if head[:4] != b":W&B":
                    raise ValueError("%s: not a W&B run file (bad header)" % self.path)
                self.offset = CHUNK_HDR
            f.seek(self.offset)
            data = f.read(limit)
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
        step, vals, resumed = _history(rec, self.info)
        if resumed:
            run.meta["resumed"] = True
        if vals:
            if step is None:
                step = (run.last_step + 1) if run.last_step is not None else 0.0
            run.add_record(step, [(SYNONYMS.get(k.lower(), k), v) for k, v in vals])

    def state(self) -> dict:
        return {"offset": self.offset}


# Where an online read gets its W&B key: the agent points this at the box's secrets
# (`gpurun secret set WANDB_API_KEY`); None, or None returned, is wandb's own login.
KEY_SOURCE: Optional[Callable[[], Optional[str]]] = None


class WandbApiSource:
    """A run on the W&B server (``wandb:entity/project/run_id``), polled with scan_history from
    the step after the last one read. Needs the optional ``wandb`` package on this machine.

    The server is probed first with the stdlib (``WANDB_BASE_URL``, else api.wandb.ai: refused,
    timed out or HTTP 5xx is unreachable), and the read itself runs in a thread with a deadline:
    wandb's own client retries for days, and the agent's loop must never wait on it. Every
    failure is an ``OSError`` saying "W&B unreachable", which the tracker turns into a fallback.
    """

    kind = "wandb_api"
    probe_timeout_s = 10.0
    deadline_s = 60.0

    def __init__(self, ref: str):
        self.ref = ref.split(":", 1)[1] if ref.startswith("wandb:") else ref
        self.min_step = 0
        self._pending: Optional[threading.Thread] = None

    @property
    def url(self) -> Optional[str]:
        return ref_url(self.ref)

    def poll(self, run: Run) -> str:
        try:
            import wandb  # type: ignore
        except ImportError:
            raise OSError("W&B unreachable: the optional 'wandb' package is not installed on this machine "
                          "(pip install 'gpurun[wandb]' or wandb into the box's Python)")
        if self._pending is not None and self._pending.is_alive():
            raise OSError("W&B unreachable: the previous read of %s has still not answered" % self.ref)
        probe(timeout=self.probe_timeout_s)
        box: dict = {}

        def read() -> None:
            try:
                key = KEY_SOURCE() if KEY_SOURCE is not None else None
                api = wandb.Api(api_key=key, timeout=int(self.deadline_s)) if key else \
                    wandb.Api(timeout=int(self.deadline_s))
                api_run = api.run(self.ref)
                box["rows"] = list(api_run.scan_history(min_step=self.min_step, page_size=1000))
            except BaseException as exc:  # wandb raises its own error tree, not OSError
                box["error"] = exc

        th = threading.Thread(target=read, name="gpurun-wandb-read", daemon=True)
        th.start()
        th.join(self.deadline_s)
        if th.is_alive():
            self._pending = th
            raise OSError("W&B unreachable: no answer for %s within %gs" % (self.ref, self.deadline_s))
        if "error" in box:
            exc = box["error"]
            raise OSError("W&B unreachable: %s: %s" % (type(exc).__name__, (str(exc) or "")[:200]))
        for row in box.get("rows") or []:
            step = row.get("_step")
            vals = [(SYNONYMS.get(k.lower(), k), v) for k, v in ((k, _num(v)) for k, v in row.items()
                                                                  if not k.startswith("_")) if v is not None]
            if isinstance(step, (int, float)):
                if vals:
                    run.add_record(float(step), vals)
                self.min_step = max(self.min_step, int(step) + 1)
        return "ok"

    def state(self) -> dict:
        return {"min_step": self.min_step}


def _num(v) -> Optional[float]:
    """A history value as a float: numbers, and the strings the API uses for NaN and infinities."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("NaN", "nan", "Infinity", "-Infinity", "inf", "-inf"):
        return float(v.replace("Infinity", "inf"))
    return None


def api_base() -> str:
    return (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").rstrip("/")


def ref_url(ref: str) -> Optional[str]:
    """``https://wandb.ai/ENTITY/PROJECT/runs/RUN_ID`` for a full reference (a self-hosted
    server, ``WANDB_BASE_URL``, serves its pages from the same address)."""
    parts = ref.split(":", 1)[1] if ref.startswith("wandb:") else ref
    bits = parts.strip("/").split("/")
    if len(bits) != 3 or not all(bits):
        return None
    base = api_base()
    app = "https://wandb.ai" if "//api.wandb.ai" in base else base
    return "%s/%s/%s/runs/%s" % (app, bits[0], bits[1], bits[2])


def file_info(path: str, limit: int = 1 << 18) -> dict:
    """The run record (run_id, entity, project) from the head of a ``.wandb`` file; {} if none."""
    src = WandbFileSource(path)
    try:
        src.poll(Run(path), limit)
    except (OSError, ValueError, IndexError):
        pass
    return src.info


def _online_dir(path: str) -> bool:
    return os.path.basename(os.path.dirname(os.path.abspath(path))).startswith("run-")


def file_url(path: str, info: Optional[dict] = None) -> str:
    """The W&B page of a synced (``run-*``) run when its record names entity and project, else
    the run's directory (an offline run's only address)."""
    d = os.path.dirname(os.path.abspath(path))
    if _online_dir(path):
        info = info if info and info.get("run_id") else file_info(path)
        if info.get("entity") and info.get("project") and info.get("run_id"):
            return ref_url("%s/%s/%s" % (info["entity"], info["project"], info["run_id"])) or d
    return d


def online_ref(path: str) -> Optional[str]:
    """``wandb:[entity/]project/run_id`` for a ``.wandb`` file of a run that syncs online."""
    if not _online_dir(path):
        return None
    info = file_info(path)
    if not (info.get("run_id") and info.get("project")):
        return None
    return "wandb:" + "/".join(x for x in (info.get("entity"), info["project"], info["run_id"]) if x)


def probe(base: Optional[str] = None, timeout: float = 10.0) -> None:
    """Raise ``OSError`` when the W&B server cannot be reached: refused, unresolvable, timed out
    or answering HTTP 5xx. Any other answer (401 included) means it is there."""
    import urllib.error
    import urllib.request
    url = (base or api_base()) + "/graphql"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise OSError("W&B unreachable: %s answered HTTP %d" % (url, exc.code))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise OSError("W&B unreachable: %s: %s" % (url, getattr(exc, "reason", None) or exc))


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
