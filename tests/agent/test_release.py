"""The ``release`` verb (a fleet rebalance's first half): queued -> moved by compare-and-set on
a real agent, refused for a started job, answered again for a moved one, and undone by a
submit that places the job here again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rigs.boxagent import BoxAgent


@pytest.fixture
def box(tmp_path: Path):
    b = BoxAgent(tmp_path / "state", {"slots": 1})
    yield b
    b.stop_all()


def test_release_moves_only_queued_jobs_and_is_idempotent(box: BoxAgent, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    box.submit({"first": f"while [ ! -e {gate} ]; do sleep 0.05; done", "second": "true", "third": "true"},
               env={"A": "1"}, gpus=0)
    box.wait(["first"], states=("running",))
    res = box.ok("release", {"jobs": [box.id("first"), box.id("second"), "nosuch"], "to": "b2"})
    assert [s["id"] for s in res["released"]] == [box.id("second")]
    spec = res["released"][0]
    assert spec["command"] == "true" and spec["env"] == {"A": "1"} and spec["attempt"] == 0
    refused = {r["id"]: r["state"] for r in res["refused"]}
    assert refused == {box.id("first"): "running", "nosuch": None}
    # answered again (a controller that died mid-move finishes it), and may be re-targeted
    again = box.ok("release", {"jobs": [box.id("second")], "to": "b3"})
    assert [s["id"] for s in again["released"]] == [box.id("second")]
    gate.touch()
    jobs = box.wait(["first", "third"])
    assert jobs["second"]["state"] == "moved" and jobs["second"]["moved_to"] == "b3"
    assert jobs["second"]["started_at"] is None  # it never ran here
    # retrying a moved job says where it lives
    rep = box.verb("retry", {"job": box.id("second")}, ensure=False)
    assert not rep["ok"] and "b3" in rep["error"]["message"]


def test_submit_places_a_moved_job_here_again(box: BoxAgent, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    box.submit({"hold": f"while [ ! -e {gate} ]; do sleep 0.05; done", "back": f"echo ran >> {tmp_path}/back.out"},
               gpus=0)
    box.wait(["hold"], states=("running",))
    assert box.ok("release", {"jobs": [box.id("back")], "to": "elsewhere"})["released"]
    added = box.ok("submit", {"jobs": [{"id": box.id("back"), "name": "back", "command": f"echo ran >> {tmp_path}/back.out",
                                        "gpus": 0}]})["added"]
    assert added == [box.id("back")]
    gate.touch()
    jobs = box.wait(["hold", "back"])
    assert jobs["back"]["state"] == "succeeded" and jobs["back"]["moved_to"] is None
    assert (tmp_path / "back.out").read_text() == "ran\n"  # once
