"""The TensorBoard reader against TensorBoard itself: event files written by TensorBoard's own
writer (every way a scalar is stored: ``simple_value``, and tensor scalars in ``float_val``,
``double_val`` and ``tensor_content``), and the real event files of the labelled corpus, each read
by ``tfevents.TfEventsSource`` and by TensorBoard's ``EventFileLoader``; the two must agree on
every scalar, also when the file is read while it grows, cut at any byte.

``tfevents.py`` decodes the protobuf by hand (gpurun needs no TensorFlow or TensorBoard); these
tests are what says its hand decoding reads what the real tools write.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
# TensorBoard is in the test extra (pyproject.toml): missing, these tests fail, they do not skip
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.types_pb2 import DT_DOUBLE, DT_FLOAT
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from orchestrator.quality.series import SYNONYMS, Run
from orchestrator.quality.sources import Tracker
from orchestrator.quality.tfevents import TfEventsSource

CORPUS = Path(__file__).resolve().parent / "corpus"


def _tb_scalars(path: str) -> Dict[str, List[Tuple[int, float]]]:
    """Every scalar in an event file as TensorBoard's loader decodes it: tag -> [(step, value)]."""
    out: Dict[str, List[Tuple[int, float]]] = {}
    for ev in EventFileLoader(path).Load():
        for v in ev.summary.value:
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                x = v.simple_value
            elif kind == "tensor" and not v.tensor.tensor_shape.dim:
                t = v.tensor
                if t.float_val:
                    x = t.float_val[0]
                elif t.double_val:
                    x = t.double_val[0]
                elif t.dtype == DT_FLOAT and len(t.tensor_content) == 4:
                    x = struct.unpack("<f", t.tensor_content)[0]
                elif t.dtype == DT_DOUBLE and len(t.tensor_content) == 8:
                    x = struct.unpack("<d", t.tensor_content)[0]
                else:
                    continue
            else:
                continue
            out.setdefault(v.tag, []).append((ev.step, x))
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def _agree(run: Run, tb: Dict[str, List[Tuple[int, float]]]) -> None:
    """Our series hold TensorBoard's points for every tag, in order (a restart, a step going back,
    rewinds our series: then its points are the tail of TensorBoard's)."""
    assert tb, "TensorBoard found no scalars"
    for tag, pts in tb.items():
        name = SYNONYMS.get(tag.lower(), tag)
        s = run.series.get(name)
        assert s is not None, "%s (as %s) not read; read: %s" % (tag, name, sorted(run.series))
        # a tag whose steps fell behind the others' is placed on the run's clock (``tfevents._place``),
        # its own steps kept beside: those are TensorBoard's
        ours = list(zip(run.meta.get("tfevents_own_steps", {}).get(name, s.steps), s.values))
        if len([t for t in tb if SYNONYMS.get(t.lower(), t) == name]) > 1:
            continue  # two tags named alike (loss, train/loss) share one series: counted below
        tail = pts[-len(ours):]
        assert len(ours) <= len(pts) and all(st == float(ts) and _same(v, tv) for (st, v), (ts, tv) in zip(ours, tail)), \
            "%s: ours %s... vs TensorBoard %s..." % (tag, ours[-3:], tail[-3:])
        rewound = any(b[0] < a[0] for a, b in zip(pts, pts[1:]))
        assert rewound or len(ours) == len(pts), "%s: %d points read, TensorBoard has %d" % (tag, len(ours), len(pts))


def _scalar(kind: str, tag: str, x: float) -> Summary.Value:
    if kind == "simple":
        return Summary.Value(tag=tag, simple_value=x)
    if kind == "float_val":
        t = TensorProto(dtype=DT_FLOAT, float_val=[x])
    elif kind == "double_val":
        t = TensorProto(dtype=DT_DOUBLE, double_val=[x])
    else:  # what TensorFlow's C++ summary writer stores: the raw little-endian bytes
        t = TensorProto(dtype=DT_FLOAT, tensor_content=struct.pack("<f", x))
    v = Summary.Value(tag=tag, tensor=t)
    v.metadata.plugin_data.plugin_name = "scalars"
    return v


@pytest.mark.parametrize("kind", ["simple", "float_val", "double_val", "tensor_content"])
def test_files_tensorboard_writes_read_the_same(tmp_path, kind):
    w = EventFileWriter(str(tmp_path))
    for s in range(1, 301):
        loss = 4.0 / math.sqrt(s) if s < 250 else float("nan")
        w.add_event(event_pb2.Event(step=s, wall_time=1.7e9 + s, summary=Summary(value=[
            _scalar(kind, "train/loss", loss), _scalar(kind, "learning_rate", 1e-3 * (1 - s / 400)),
            _scalar(kind, "Accuracy/val", min(0.99, s / 250))])))
        if s % 100 == 0:  # a big record between scalars (an image), which the reader skips undecoded
            w.add_event(event_pb2.Event(step=s, summary=Summary(value=[Summary.Value(
                tag="samples", image=Summary.Image(encoded_image_string=b"\x89PNG" + b"\0" * 70000))])))
    w.close()
    path = str(next(tmp_path.glob("events.out.tfevents.*")))
    tb = _tb_scalars(path)
    assert len(tb["train/loss"]) == 300
    run = Tracker([path]).update()
    _agree(run, tb)
    assert math.isnan(run.get("loss").values[-1]) and run.get("loss").values[0] == pytest.approx(4.0)


def test_a_file_tensorboard_writes_read_while_it_grows_cut_anywhere(tmp_path):
    """The agent reads a file the trainer is still writing: every cut, mid-record included,
    yields a prefix of TensorBoard's points, and the whole file all of them."""
    w = EventFileWriter(str(tmp_path / "src"))
    for s in range(40):
        w.add_event(event_pb2.Event(step=s, summary=Summary(value=[_scalar("simple", "loss", 1.0 / (s + 1)),
                                                                    _scalar("tensor_content", "lr", 0.1)])))
    w.close()
    src = next((tmp_path / "src").glob("events.out.tfevents.*"))
    data = src.read_bytes()
    tb = _tb_scalars(str(src))
    dst = tmp_path / src.name
    dst.write_bytes(b"")
    run = Run()
    reader = TfEventsSource(str(dst))
    for cut in range(0, len(data), 7):  # grown 7 bytes at a time: most reads end mid-record
        with open(dst, "ab") as f:
            f.write(data[cut:cut + 7])
        reader.poll(run)
        got = list(run.get("loss").values) if run.get("loss") is not None else []
        assert got == [v for _, v in tb["loss"][:len(got)]]
    _agree(run, tb)


def _corpus_event_files() -> List[Path]:
    return sorted(p for p in CORPUS.glob("*/*") if "tfevents" in p.name)


@pytest.mark.parametrize("path", _corpus_event_files(), ids=lambda p: "%s/%s" % (p.parent.name, p.name[:40]))
def test_real_event_files_of_the_corpus_read_as_tensorboard_reads_them(path):
    """Event files other people's trainers wrote (PyTorch, TensorFlow, Lightning...), committed to
    their repositories (tests/quality/corpus, cited in each split's labels.json)."""
    _agree(Tracker([str(path)]).update(), _tb_scalars(str(path)))


def _write(d: Path, rows: List[Tuple[int, str, float]]) -> str:
    w = EventFileWriter(str(d))
    for step, tag, x in rows:
        w.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + len(tag), summary=Summary(value=[_scalar("simple", tag, x)])))
    w.close()
    return str(next(d.glob("events.out.tfevents.*")))


def test_tags_on_their_own_step_counters_are_no_restart(tmp_path):
    """Keras' callback: ``evaluation_loss_vs_iterations`` at iteration steps, ``epoch_loss`` at
    epoch steps 0, 1, 2..., in one file. Each epoch's lower step is no restart: both series keep
    every point, the epoch one placed on the iteration clock where it was written."""
    rows = []
    for e in range(5):
        rows += [((e + 1) * 100, "evaluation_loss_vs_iterations", 2.0 - 0.3 * e), (e, "epoch_loss", 1.9 - 0.3 * e)]
    path = _write(tmp_path, rows)
    run = Tracker([path]).update()
    assert run.restarts == []
    ev, ep = run.series["evaluation_loss_vs_iterations"], run.series["epoch_loss"]
    assert list(ev.steps) == [100, 200, 300, 400, 500] and len(ep) == 5
    assert list(ep.steps) == [100, 200, 300, 400, 500]  # where each epoch's value was written
    assert list(run.meta["tfevents_own_steps"]["epoch_loss"]) == [0, 1, 2, 3, 4]
    _agree(run, _tb_scalars(path))


def test_a_tag_whose_own_step_goes_back_is_a_restart(tmp_path):
    # a resumed run appending steps 30-60 after 1-50: one restart, the points of 30-50 replaced
    rows = [(s, t, 5.0) for s in range(1, 51) for t in ("loss", "lr")]
    rows += [(s, t, 4.0) for s in range(30, 61) for t in ("loss", "lr")]
    run = Tracker([_write(tmp_path, rows)]).update()
    assert run.restarts == [30]
    loss = run.get("loss")
    assert list(loss.steps) == list(range(1, 61)) and loss.values[28] == 5.0 and loss.values[29] == 4.0
    # the Keras layout trained twice into one folder: the second fit starts both counters again
    rows = []
    for fit in range(2):
        for e in range(5 - 2 * fit):
            rows += [((e + 1) * 100, "evaluation_loss_vs_iterations", 2.0 + fit), (e, "epoch_loss", 1.0 + fit)]
    run = Tracker([_write(tmp_path / "twice", rows)]).update()
    assert run.restarts and list(run.series["epoch_loss"].values) == [2.0] * 3
    assert list(run.series["evaluation_loss_vs_iterations"].steps) == [100, 200, 300]
