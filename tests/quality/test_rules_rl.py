"""An RL run's episode return (``rules_rl``): a policy that learned and then fell back to its
random start is a STOP when it sits there at one value, the reviewer's doubt when it is noisy
(a long dip looks the same until it recovers), and nothing at all for names that are no return."""

from __future__ import annotations

import random

from orchestrator.quality import rules_rl as RL
from orchestrator.quality.judge import judge
from orchestrator.quality.reviewer import ambiguity
from orchestrator.quality.roles import is_return
from quality.synth import run_of


def test_returns_are_known_by_their_names():
    for name in ("Eval_AverageReturn", "Train_AverageReturn", "Environment/Cumulative Reward",
                 "rollout/ep_rew_mean", "episode_reward", "avg_reward", "eval/mean_reward", "reward"):
        assert is_return(name), name
    for name in ("Eval_StdReturn", "Train_BestReturn", "Initial_DataCollection_AverageReturn",
                 "rewards/chosen", "rewards/margins", "reward_loss", "loss", "val_acc"):
        assert not is_return(name), name


def _rows(returns):
    return [{"Eval_AverageReturn": r} for r in returns]


def test_a_return_stuck_at_one_value_after_it_had_learned_is_a_stop():
    rng = random.Random(1)
    learned = [15 + 50 * i + rng.gauss(0, 8) for i in range(20)]  # 15 -> 1000, CS285's pendulum
    collapsed = [3.0] * 30
    v = judge(run_of(_rows(learned + collapsed)), {})
    assert v["verdict"] == "STOP" and v["findings"][0]["code"] == "return_collapse"
    assert judge(run_of(_rows(learned + collapsed[:5])), {})["verdict"] != "STOP"  # 5 evals are no quarter


def test_a_noisy_return_back_at_its_start_is_the_reviewer_s_and_a_dip_that_recovers_never_stops():
    rng = random.Random(2)
    learned = [-200 + 12 * i + rng.gauss(0, 10) for i in range(25)]  # LunarLander: -200 -> +90
    low = [-210 + rng.gauss(0, 30) for _ in range(15)]
    v = judge(run_of(_rows(learned + low)), {})
    f = next(f for f in v["findings"] if f["code"] == "return_collapse")
    assert f["severity"] == "warn" and v["verdict"] == "WAIT"
    assert ambiguity(v)["code"] == "return_collapse"
    recovered = learned + low + [100 + rng.gauss(0, 10) for _ in range(30)]
    for n in range(20, len(recovered) + 1):  # every prefix: never a STOP
        assert judge(run_of(_rows(recovered[:n])), {})["verdict"] != "STOP", n


def test_a_return_that_never_learned_or_a_dpo_reward_falling_is_not_a_collapse():
    rng = random.Random(3)
    flat = [20 + rng.gauss(0, 5) for _ in range(60)]  # never left its random start: a flat start
    assert RL.return_collapse(run_of(_rows(flat)), {}) == []
    chosen = [{"rewards/chosen": 0.5 - 0.05 * i, "loss": 0.69 - 0.005 * i} for i in range(60)]
    assert RL.return_collapse(run_of(chosen), {}) == []


def test_the_judge_s_rl_veto_knows_a_return_by_the_same_words():
    # CS285's logger writes "Eval_AverageReturn" in CamelCase: the veto's own substring list did not
    # know it, so a critic's loss growing with the returns it predicts stopped a run that learned
    rows = [{"Eval_AverageReturn": -1146.0 + 40.0 * i, "Critic_Loss": 456.0 * min(22.0, 1.0 + i)} for i in range(30)]
    v = judge(run_of(rows), {})
    assert v["verdict"] != "STOP" and any(f["evidence"].get("rl_return_held") for f in v["findings"]), v["reason"]
    # twin: the same loss rise while that return falls is a STOP
    falling = [dict(r, Eval_AverageReturn=-1146.0 - 40.0 * i) for i, r in enumerate(rows)]
    assert judge(run_of(falling), {})["verdict"] == "STOP"
