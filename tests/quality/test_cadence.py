"""One default for the agent's periodic quality cadence (``quality.options.INTERVALS_S``).

The daemon's scan (``agent/periodic``) assumed a 600 s first interval of its own while the
quality hook had its ladder; a profile ladder changed one and not the other's default."""

from __future__ import annotations

import pytest

from orchestrator.agent import quality_hook as QH
from orchestrator.agent.periodic import _quality_scan_every
from orchestrator.agent.store import Store
from orchestrator.profiles import load_profile
from orchestrator.quality.options import INTERVALS_S, check_intervals

T0 = 1_700_000_000.0


@pytest.fixture
def store_job(tmp_path):
    store = Store(str(tmp_path / "agent.db"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    store.insert_jobs([{"id": "j1", "name": "t", "command": "true", "run_dir": str(run_dir),
                        "log": str(run_dir / "stdout.log")}])
    assert store.transition("j1", ["queued"], "running", attempt=1, started_at=T0)
    yield store, store.get_job("j1")
    store.close()


@pytest.mark.parametrize("config,ladder", [
    ({}, INTERVALS_S),
    ({"quality": {}}, INTERVALS_S),
    ({"quality": {"intervals_s": []}}, INTERVALS_S),
    ({"quality": {"intervals_s": ["x"]}}, INTERVALS_S),     # malformed: keep checking on the default
    ({"quality": {"intervals_s": [0, 10]}}, INTERVALS_S),
    ({"quality": {"intervals_s": [120, 240]}}, (120.0, 240.0)),
    ({"quality": {"intervals_s": [5]}}, (5.0,)),
])
def test_scan_and_first_check_follow_one_ladder(store_job, config, ladder):
    store, job = store_job
    assert check_intervals(config) == tuple(float(x) for x in ladder)
    assert _quality_scan_every(config) == max(1.0, min(30.0, float(ladder[0])))
    assert not QH.periodic_due(store, job, T0 + ladder[0] - 1, config)
    assert QH.periodic_due(store, job, T0 + ladder[0], config)


def test_profiles_carry_the_same_default():
    assert tuple(load_profile("local").get("quality.intervals_s")) == INTERVALS_S
    assert tuple(load_profile("runpod").get("quality.intervals_s")) == INTERVALS_S
