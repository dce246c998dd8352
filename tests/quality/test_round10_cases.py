"""What blind round 10 taught (issue 11): nine of its failures were read as no loss at all. A
HiFi-GAN "Gen Loss Total : 101.3", DiffEqFlux's "Loss of 0.0132 on iteration 2", CNTK's
"TrainLossPerSample = 1.#QNAN000" (a NaN as Microsoft's C runtime prints it) and DeepXDE's
table of bracketed loss terms are losses now; and an RL run's critic loss that grows with its
returns is no divergence. Each case is replayed on every prefix, the last one as an ended run,
and each has a twin that must still STOP (or must not be read), so a reading or a veto that
took everything would fail here."""

from __future__ import annotations

import math

from orchestrator.quality.judge import judge
from orchestrator.quality.sources import Tracker
from quality.prefixes import verdicts, write_log


def _stops(seen) -> list:
    return [r for v, r in seen if v == "STOP"]


def _loss(path):
    run = Tracker([str(path)]).update()
    s = run.get("loss")
    return run, (s.name if s is not None else None), (list(s.values) if s is not None else [])


def test_a_loss_named_in_words_then_total_is_the_loss(tmp_path):
    rows = ["Steps : %d, Gen Loss Total : %.3f, Mel-Spec. Error : %.3f, s/b : 0.435"
            % (5 * i, 100.0 - i if i < 9 else float("nan"), 2.0 - 0.01 * i) for i in range(12)]
    p = write_log(tmp_path, ["Epoch: 1"] + rows)
    run, name, vals = _loss(p)
    assert name == "gen_loss_total" and run.last_step == 55.0 and math.isnan(vals[-1])
    assert any("nonfinite_loss" in r for r in _stops(verdicts(p)))
    # the words after "loss" must say which total: "loss of batch 3" names no loss
    q = write_log(tmp_path, ["loss of batch %d: 0.25" % b for b in range(1, 20)], "batch.log")
    assert _loss(q)[1] is None


def test_a_loss_of_a_value_on_an_iteration(tmp_path):
    # DiffEqFlux's callback: the loss frozen to its last digit for every iteration shown
    p = write_log(tmp_path, [" Loss of 0.01318282507795006%d on iteration %d" % (7 + i % 3 % 2 * 2, i)
                             for i in range(2, 30)])
    run, name, vals = _loss(p)
    assert name == "loss" and len(vals) == 28 and run.last_step == 29.0
    assert any("frozen" in r for r in _stops(verdicts(p)))
    # twin: the same lines with a loss that falls
    q = write_log(tmp_path, [" Loss of %.6f on iteration %d" % (0.5 / i, i) for i in range(2, 30)], "fall.log")
    assert _stops(verdicts(q)) == []


def _cntk(n: int, nan_from: int) -> list:
    return [" Epoch[%d of 50]-Minibatch[ %d- %d]: SamplesSeen = 500; TrainLossPerSample = %s; "
            "EvalErr[0]PerSample = 0.27600000; TotalTime = 2.7641s; SamplesPerSecond = 180.9"
            % (1 + i // 20, (i % 20) * 500 + 1, (i % 20 + 1) * 500,
               "1.#QNAN000" if i >= nan_from else "%.8f" % (5.0 / i ** 0.3)) for i in range(1, n + 1)]


def test_an_msvc_nan_is_a_nan_line_by_line_and_in_a_large_chunk(tmp_path):
    small = write_log(tmp_path, _cntk(5, 4), "small.log")
    large = write_log(tmp_path, _cntk(400, 380), "large.log")  # > 4 KiB: the ordered scan, the fast path
    for p, nans in ((small, 2), (large, 21)):
        run, name, vals = _loss(p)
        assert name == "trainlosspersample" and sum(map(math.isnan, vals)) == nans, p.name
        assert judge(run, {}, final=True)["verdict"] == "STOP"
    # "-1.#IND" and "1.#INF" too; a "#" elsewhere ("output #0") is no number at all
    p = write_log(tmp_path, ["Iteration %d, loss = %s" % (i, "-1.#IND" if i == 9 else "1.#INF" if i == 8 else
                                                          "%.3f" % (2.0 - 0.1 * i)) for i in range(10)]
                  + ["Train net output #0: loss = 1.5"], "ind.log")
    vals = _loss(p)[2]
    assert math.isinf(vals[8]) and math.isnan(vals[9]) and vals[-1] == 1.5


def _deepxde(tmp_path, nan_at=None, name="train.log"):
    rows = ["Compiling model...", "Training model...", "",
            "Step      Train loss                        Test loss                         Test metric"]
    for i in range(12):
        t = 2.0 * 0.7 ** i
        cells = "[%.2e, %.2e]" % (t, t / 10) if nan_at is None or i < nan_at else "[nan, nan]"
        rows.append("%-9d %s    [%.2e, %.2e]    []" % (1000 * i, cells, t * 1.1, t / 9))
    rows += ["", "Best model at step 11000:", "  train loss: 4.36e-02", "  test loss: 4.80e-02"]
    return write_log(tmp_path, rows, name)


def test_deepxdes_table_of_loss_terms_is_read_as_their_sum(tmp_path):
    p = _deepxde(tmp_path)
    run, name, vals = _loss(p)
    assert name == "loss" and math.isclose(vals[0], 2.2) and list(run.series["loss"].steps)[:2] == [0.0, 1000.0]
    assert math.isclose(run.series["val_loss"].values[0], 2.2 + 2.0 / 9, rel_tol=1e-3)
    assert _stops(verdicts(p)) == []
    nan = _deepxde(tmp_path, nan_at=9, name="nan.log")  # twin: a term goes NaN, so does the sum
    assert any("nonfinite_loss" in r for r in _stops(verdicts(nan)))


def _rl_csv(tmp_path, ret, name="progress.csv", ev=None):
    """A DDPG progress.csv: the critic's loss climbs 456 -> ~10,000 as the Q-values grow;
    ``ret(i)`` is the episode return at row i, ``ev(i)`` the eval's mean reward (when given)."""
    rows = ["rollout/return,train/loss_critic,total/steps,rollout/Q_mean" + (",eval/mean_reward" if ev else "")]
    for i in range(40):
        critic = 456.0 if i < 3 else 456.0 * min(22.0, 1.0 + i)
        rows.append("%.2f,%.3f,%d,%.2f" % (ret(i), critic, 2000 * (i + 1), -60.0 - 5 * i)
                    + (",%.2f" % ev(i) if ev else ""))
    return write_log(tmp_path, rows, name)


def test_an_rl_critic_loss_that_grows_with_its_returns_is_no_divergence(tmp_path):
    rising = _rl_csv(tmp_path, lambda i: -1146.0 + 25.0 * i)
    assert _stops(verdicts(rising)) == []
    # twin: the same critic loss while the return falls: the climb still stops the run
    falling = _rl_csv(tmp_path, lambda i: -1146.0 - 25.0 * i, "falling.csv")
    assert _stops(verdicts(falling)) != []
    # and while the rollout's return holds but the eval's falls: every return must hold
    split = _rl_csv(tmp_path, lambda i: -1146.0 + 25.0 * i, "split.csv", ev=lambda i: -6.4 - 0.5 * i)
    assert _stops(verdicts(split)) != []


def test_a_split_named_with_a_period_keeps_its_metrics_apart(tmp_path):
    """"Train. Total Loss: nan, AUC: 50.04%, AP: 1.78%" then "Val. ... AP: 100.00%": two splits,
    not one AP that rose from 1.78 to 100 beside the NaN (which vetoed the NaN's STOP)."""
    rows = []
    for e in range(12):
        loss = "%.4f" % (1.6 - 0.03 * e) if e < 4 else "nan"
        rows += ["09-02 20:40:%02d - INFO - __main__ - Epoch: %d, Loss: %s" % (e, e, loss),
                 "09-02 20:40:%02d - INFO - __main__ - Train. Total Loss: %s, AUC: 50.04%%, AP: 1.78%%" % (e, loss),
                 "09-02 20:40:%02d - INFO - __main__ - Val. Total Loss: %s, AUC: %s%%, AP: %s%%"
                 % (e, loss, "100.00" if e >= 4 else "71.20", "100.00" if e >= 4 else "12.50")]
    p = write_log(tmp_path, rows)
    run = Tracker([str(p)]).update()
    assert list(run.series["ap"].values)[-1] == 1.78 and list(run.series["val_ap"].values)[-1] == 100.0
    assert any("nonfinite_loss" in r for r in _stops(verdicts(p)))
