"""Metrics in a tqdm bar's postfix (``bar.set_postfix(loss=...)``): for many scripts the only
place the loss is printed. Read once per change (a redraw is no new log), at the bar's count
but never as a rewind (a bar starts over every epoch), the same by the per-line loop and the
ordered scan; a NaN there is a NaN of the run."""

from __future__ import annotations

import math

from orchestrator.quality import fastpath, linescan
from orchestrator.quality.judge import check
from orchestrator.quality.sources import Tracker

BAR = "\u2588"


def _bars(path, epochs: int = 6, per: int = 300, nan_at=None) -> None:
    with open(path, "w", newline="") as f:
        f.write("Using seed: 7314\nFiles already downloaded and verified\n")
        for e in range(epochs):
            for b in range(1, per + 1):
                i = e * per + b
                loss = "nan" if nan_at is not None and i >= nan_at else "%.3f" % (3.0 * (i + 20) ** -0.25)
                pct = 100 * b // per
                # each set_postfix comes with two redraws of the same bar: refreshes, not logs
                for _ in range(2):
                    f.write("Epoch %d: %3d%%|%-10s| %d/%d [00:10<00:12, 44.1it/s, v_num=0, loss=%s]\r"
                            % (e, pct, BAR * (pct // 10), b, per, loss))
            f.write("\n")


def _snap(path):
    run = Tracker([str(path)]).update()
    return ({k: (list(s.steps), [repr(v) for v in s.values]) for k, s in run.series.items()}, run.restarts,
            run.first_step, run.last_step, run.records)


def test_a_bar_only_log_is_read_once_per_change_and_never_rewinds(tmp_path, monkeypatch):
    p = tmp_path / "train.log"
    _bars(p)
    got = _snap(p)
    steps, vals = got[0]["loss"]
    assert sorted(got[0]) == ["loss", "v_num"]          # as a line's pairs; the rate is no pair
    assert got[1] == [] and steps == sorted(steps)      # epoch 2's "1/300" is no restart
    assert len(vals) == len(set(vals)) > 250            # one point per change, no redraw twice
    # "Epoch E:" names the epoch of a bar whose count starts over: the step is global (E, count)
    assert steps[:3] == [1.0, 2.0, 3.0] and 5 * 300 < steps[-1] <= 6 * 300
    with monkeypatch.context() as m:                    # the per-line loop gives the same
        m.setattr(fastpath.FastPath, "take", lambda self, text, run, marks: text)

        def decline(self, text, run, src):
            raise ValueError("use the per-line loop")
        m.setattr(linescan.OrderedScan, "scan", decline)
        assert _snap(p) == got
    v = check(str(p))
    assert v["verdict"] != "STOP", v["reason"]


def test_a_nan_in_a_bar_postfix_stops_the_run(tmp_path):
    p = tmp_path / "train.log"
    _bars(p, epochs=2, nan_at=450)
    v = check(str(p))
    assert (v["verdict"], v["findings"][0]["code"]) == ("STOP", "nonfinite_loss")
    # the only metric line of a run: a custom bar format, no "n/N [" count (Glow-PyTorch issue 1)
    one = tmp_path / "glow.log"
    one.write_text("Using seed: 7314\n170500096it [00:08, 20744734.07it/s]\n"
                   "Epoch [1/250]: [18/781]   2%|\u258d                    , total_loss=nan [00:10<08:12]\n")
    run = Tracker([str(one)]).update()
    assert math.isnan(run.get("loss").values[-1]) and run.get("loss").name == "total_loss"
    assert check(str(one))["verdict"] == "STOP"


def test_a_bar_without_a_metric_in_its_postfix_adds_nothing(tmp_path):
    p = tmp_path / "train.log"
    p.write_text("".join("step %d loss %.3f\n%3d%%|%s| %d/100 [00:01<00:01, 9it/s, v_num=3, gpu=0]\n"
                         % (i, 2.0 - i / 200, i, BAR, i) for i in range(1, 100)))
    run = Tracker([str(p)]).update()
    assert sorted(run.series) == ["loss"] and len(run.series["loss"]) == 99  # no v_num, no gpu


def test_a_bar_at_0_of_n_has_measured_nothing(tmp_path):
    """tqdm draws the bar before the first batch: its running means are 0/0 ("total_loss=inf"),
    not a loss of the run; the per-line loop and the ordered scan both skip it."""
    head = "  0%|          | 0/1541 [00:00<?, ?it/s, rpn_class_loss=inf, total_loss=inf]\n"
    done = "100%%|%s| 1541/1541 [04:34<00:00,  5.62it/s, rpn_class_loss=0.2896, total_loss=%.3f]\n"
    short = tmp_path / "short.log"
    short.write_text(head + "".join(done % (BAR * 10, 1.5 - e / 10) for e in range(3)))
    long = tmp_path / "long.log"  # > 4 KiB: read by the ordered scan
    long.write_text("".join(head + done % (BAR * 10, 2.0 / (e + 1)) + "Training Parameters\n" * 20
                            for e in range(12)))
    for p in (short, long):
        loss = Tracker([str(p)]).update().get("loss")
        assert all(math.isfinite(v) for v in loss.values), p.name
        assert check(str(p))["verdict"] != "STOP"


def test_a_postfix_string_with_colons_and_text_after_the_bar_is_read(tmp_path):
    """``set_postfix_str("Batch Loss: %.4f")``: "Name: value" items after the rate; what the script
    printed after the bar's closing bracket (a skipped batch's warning) is not the postfix."""
    p = tmp_path / "train.log"
    losses = [2.1, 1.9, 1.8, 27.9, 101.5, 108.1, 108.7, 120.2]
    p.write_text("".join("Epoch: [9/1000]:  91%%|%s| %d/493 [01:03<00:06,  7.08it/s, Batch Loss: %.4f]"
                         "[Warning] Skip this batch! (Loss: %.5f\n" % (BAR * 9, 440 + i, v, v * 1.01)
                         for i, v in enumerate(losses)))
    run = Tracker([str(p)]).update()
    assert run.get("loss").name == "batch_loss" and list(run.get("loss").values) == losses
    assert sorted(run.series) == ["batch_loss"]
    # a bar whose postfix names no metric still adds nothing
    q = tmp_path / "quiet.log"
    q.write_text("".join("%3d%%|%s| %d/100 [00:01<00:01, 9it/s, GPU Mem: 3.2]\n" % (i, BAR, i) for i in range(1, 9)))
    assert Tracker([str(q)]).update().series == {}
