"""TensorBoard event files without TensorFlow: TFRecord framing + the Event/Summary protobuf.

The reader streams fixed-size chunks (bounded memory), skips records larger than a cap
(images, histograms) without decoding them, stops cleanly at a record cut mid-write and
resumes from its start next time. It understands ``simple_value`` scalars and new-style
``tensor`` scalars. ``write_scalars`` is a small writer in the same format (tests, bench).
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left
from typing import Iterable, List, Optional, Tuple

from orchestrator.quality.series import SYNONYMS, Run

_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f").unpack_from
_F64 = struct.Struct("<d").unpack_from
MAX_DECODE = 64 * 1024  # scalar events are ~50 bytes; anything this big is an image or histogram
CHUNK = 4 << 20


def _crc32c_table() -> List[int]:
    tab = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        tab.append(c)
    return tab


_TAB = _crc32c_table()


def crc32c(data: bytes) -> int:
    try:  # the optional C module is ~100x faster; pure Python is fine for 8-byte headers
        import crc32c as _c  # type: ignore
        return _c.crc32c(data)
    except ImportError:
        pass
    c = 0xFFFFFFFF
    tab = _TAB
    for b in data:
        c = tab[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf, i: int) -> Tuple[int, int]:
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    result = b & 0x7F
    shift = 7
    i += 1
    while True:
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return result, i
        shift += 7


def _skip(buf, i: int, wt: int) -> int:
    if wt == 0:
        return _varint(buf, i)[1]
    if wt == 1:
        return i + 8
    if wt == 2:
        n, i = _varint(buf, i)
        return i + n
    if wt == 5:
        return i + 4
    raise ValueError("bad wire type %d" % wt)


def _tensor_scalar(buf, i: int, end: int) -> Optional[float]:
    """First value of a TensorProto: float_val/double_val (packed or not) or tensor_content."""
    dtype = 1
    content = None
    while i < end:
        key, i = _varint(buf, i)
        f, wt = key >> 3, key & 7
        if f == 1 and wt == 0:
            dtype, i = _varint(buf, i)
        elif f == 5 and wt == 2:
            n, i = _varint(buf, i)
            return _F32(buf, i)[0] if n >= 4 else None
        elif f == 5 and wt == 5:
            return _F32(buf, i)[0]
        elif f == 6 and wt == 2:
            n, i = _varint(buf, i)
            return _F64(buf, i)[0] if n >= 8 else None
        elif f == 6 and wt == 1:
            return _F64(buf, i)[0]
        elif f == 4 and wt == 2:
            n, i = _varint(buf, i)
            content = (i, n)
            i += n
        else:
            i = _skip(buf, i, wt)
    if content is not None:
        j, n = content
        if dtype == 2 and n >= 8:
            return _F64(buf, j)[0]
        if dtype == 1 and n >= 4:
            return _F32(buf, j)[0]
    return None


def parse_event(buf, i: int, end: int) -> Tuple[Optional[int], List[Tuple[str, float]]]:
    """Decode one Event payload: (step, [(tag, value)]) for its scalar summary values."""
    # proto3 leaves a field at its default out of the wire: an event at step 0 has no step field
    # (PyTorch's add_scalar(..., global_step=0), a Keras epoch 0). Absent means 0, not unknown.
    step = 0
    out: List[Tuple[str, float]] = []
    while i < end:
        key = buf[i]
        i += 1
        if key == 0x10:  # step
            step, i = _varint(buf, i)
        elif key == 0x09:  # wall_time
            i += 8
        elif key == 0x2A:  # summary
            n, i = _varint(buf, i)
            send = i + n
            while i < send:
                vkey = buf[i]
                n, i = _varint(buf, i + 1)
                if vkey != 0x0A:
                    i += n
                    continue
                vend = i + n
                tag = None
                val = None
                while i < vend:
                    k, i = _varint(buf, i)
                    f, wt = k >> 3, k & 7
                    if f == 1 and wt == 2:
                        m, i = _varint(buf, i)
                        tag = bytes(buf[i:i + m]).decode("utf-8", "replace")
                        i += m
                    elif f == 2 and wt == 5:
                        val = _F32(buf, i)[0]
                        i += 4
                    elif f == 8 and wt == 2:
                        m, i = _varint(buf, i)
                        val = _tensor_scalar(buf, i, i + m)
                        i += m
                    else:
                        i = _skip(buf, i, wt)
                if tag is not None and val is not None:
                    out.append((tag, val))
                i = vend
        else:
            i = _skip(buf, i, key & 7)
    return step, out


class TfEventsSource:
    """One ``events.out.tfevents.*`` file, read from a saved record offset."""

    kind = "tfevents"

    def __init__(self, path: str, verify: str = "first"):
        self.path = path
        self.offset = 0
        self.verify = verify  # "none" | "first" (length CRC of the first record) | "length"
        self.skipped = 0
        self.names: dict = {}  # tag bytes -> the appends of its series, for tags not placed (``_place``)
        self.placed = 0

    def poll(self, run: Run) -> str:
        size = os.path.getsize(self.path)
        if size < self.offset:
            self.offset = 0
            return "reset"
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            pending = b""
            base = self.offset
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                buf = pending + chunk if pending else chunk
                used = self._records(buf, base, run, f)
                base += used
                pending = buf[used:]
                if len(pending) > CHUNK:  # a huge record: skip it on disk, never buffer it
                    nxt = base + 12 + _U64.unpack_from(pending, 0)[0] + 4
                    if nxt > size:
                        break  # still being written
                    base = nxt
                    f.seek(base)
                    pending = b""
                    self.skipped += 1
            self.offset = base
        return "ok"

    def _records(self, buf: bytes, base: int, run: Run, f) -> int:
        """Decode complete records of ``buf``; returns the bytes consumed. Points go in through
        ``_place`` unless they extend their tag's series in step order (the fast, common case)."""
        i = 0
        n_buf = len(buf)
        mv = memoryview(buf)
        names = self.names
        axes = _axes(run)
        if len(axes) != self.placed:  # another file of the directory placed a tag this one had cached
            names.clear()
            self.placed = len(axes)
        last = run.last_step if run.last_step is not None else -1.0
        nfast = 0
        syn = SYNONYMS
        check = self.verify == "length" or (self.verify == "first" and base == 0)
        while i + 12 <= n_buf:
            n = _U64.unpack_from(buf, i)[0]
            if check:
                if masked_crc(buf[i:i + 8]) != struct.unpack_from("<I", buf, i + 8)[0]:
                    raise ValueError("%s: corrupt TFRecord length at byte %d" % (self.path, base + i))
                check = self.verify == "length"
            end = i + 12 + n + 4
            if end > n_buf:
                break
            p = i + 12
            # fast path: the exact layout PyTorch/TF write for one simple_value scalar
            if n < 128 and buf[p] == 0x09 and buf[p + 9] == 0x10:
                q = p + 10
                step = shift = 0
                while True:
                    b = buf[q]
                    step |= (b & 0x7F) << shift
                    q += 1
                    if b < 0x80:
                        break
                    shift += 7
                if buf[q] == 0x2A and buf[q + 2] == 0x0A and buf[q + 4] == 0x0A:
                    r = q + 6 + buf[q + 5]
                    if buf[r] == 0x15 and r + 5 == p + n:
                        tb = buf[q + 6:r]
                        tgt = names.get(tb)
                        if tgt is not None and step >= last:  # in order: no stored step is above last
                            tgt[0](step)
                            tgt[1](_F32(buf, r + 1)[0])
                            nfast += 1
                            last = step
                        else:  # a new tag, a step behind the clock, a tag placed on it: the careful path
                            t = tb.decode("utf-8", "replace")
                            ser = run.column(syn.get(t.lower(), t))
                            if ser is not None:
                                run.last_step = last
                                last = _place(run, axes, ser, step, _F32(buf, r + 1)[0])
                                if ser.name in axes:
                                    names.pop(tb, None)
                                else:
                                    names[tb] = (ser.steps.append, ser.values.append)
                        i = end
                        continue
            if n <= MAX_DECODE:
                step, vals = parse_event(mv, i + 12, i + 12 + n)
                for t, v in vals:
                    ser = run.column(syn.get(t.lower(), t))
                    if ser is not None:
                        run.last_step = last
                        last = _place(run, axes, ser, step, v)
                run.records += 1 if vals else 0
            else:
                self.skipped += 1
            i = end
        run.records += nfast
        if last >= 0:
            if run.first_step is None:
                run.first_step = float(min((x.steps[0] for x in run.series.values() if len(x)), default=last))
            run.last_step = float(last)
        return i

    def state(self) -> dict:
        return {"offset": self.offset}


# Each tag keeps its own step counter, as TensorBoard plots it: Keras writes ``epoch_loss`` at
# steps 0, 1, 2... beside ``evaluation_loss_vs_iterations`` at 0, 500, 1000...; a script logs its
# train loss per batch and its test loss per epoch. Read as one timeline, each lower step looked like
# a restart and cut every series (a Keras run read as nearly nothing), and a test loss per epoch
# compared with the train loss of the first epochs. So a tag whose steps fall behind the others' is
# placed where it was written: at the highest step logged so far (the run's own clock), its own steps
# kept aside (``_axes``). A restart is a tag whose own step goes back: every series is cut there.


def _axes(run: Run) -> dict:
    """Tag (series name) -> its own steps, for the tags placed on the run's clock; kept on the run,
    which every file of a directory of event files shares."""
    return run.meta.setdefault("tfevents_own_steps", {})  # type: ignore[return-value]


def _place(run: Run, axes: dict, ser, step: float, v: float) -> float:
    """Add one point; returns the run's highest step since (the clock)."""
    last = run.last_step if run.last_step is not None else -1.0
    own = axes.get(ser.name)
    prev = own[-1] if own else (ser.steps[-1] if len(ser.steps) else None)
    if prev is not None and step < prev:  # this tag's own step went back: a restart
        cut = ser.steps[bisect_left(own, step)] if own and bisect_left(own, step) < len(ser.steps) else step
        run.rewind(cut)
        for name, steps in axes.items():  # the own steps of the points the cut removed go too
            del steps[len(run.series[name].steps):]
        last = max((x.steps[-1] for x in run.series.values() if len(x)), default=cut)
        last = min(last, cut)
    if step < last or own is not None:  # behind the clock: placed on it
        if own is None:
            own = axes[ser.name] = array("d", ser.steps)
        own.append(step)
        at = max(last, ser.steps[-1] if len(ser.steps) else last)
    else:
        at = step
    ser.steps.append(at)
    ser.values.append(v)
    return max(last, at)


def _vint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, data: bytes) -> bytes:
    return _vint(field << 3 | 2) + _vint(len(data)) + data


def encode_record(payload: bytes) -> bytes:
    head = _U64.pack(len(payload))
    return head + struct.pack("<I", masked_crc(head)) + payload + struct.pack("<I", masked_crc(payload))


def encode_event(step: int, wall_time: float, scalars: Iterable[Tuple[str, float]],
                 tensor_style: bool = False, file_version: Optional[str] = None) -> bytes:
    ev = b"\x09" + struct.pack("<d", wall_time)
    if file_version is not None:
        return ev + _ld(3, file_version.encode())
    ev += b"\x10" + _vint(step)
    values = b""
    for tag, v in scalars:
        if tensor_style:  # TF2 / new_style: TensorProto{dtype=DT_FLOAT, shape=[], float_val=[v]}
            tensor = b"\x08\x01" + _ld(2, b"") + b"\x2d" + struct.pack("<f", v)
            values += _ld(1, _ld(1, tag.encode()) + _ld(8, tensor))
        else:
            values += _ld(1, _ld(1, tag.encode()) + b"\x15" + struct.pack("<f", v))
    return ev + _ld(5, values)


def write_scalars(path: str, rows: Iterable[Tuple[int, List[Tuple[str, float]]]],
                  tensor_style: bool = False, append: bool = False, wall0: float = 1.7e9) -> None:
    """Write ``(step, [(tag, value)])`` rows as a real TensorBoard event file."""
    with open(path, "ab" if append else "wb") as f:
        if not append:
            f.write(encode_record(encode_event(0, wall0, [], file_version="brain.Event:2")))
        for step, scalars in rows:
            f.write(encode_record(encode_event(step, wall0 + step, scalars, tensor_style)))
