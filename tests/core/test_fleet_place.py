"""Placement over a fleet (``core/fleet.place``), pure: capacity in GPUs or slots, a job's
``gpus=``, the load a member already carries, ties by name, and a job that fits nowhere."""

from __future__ import annotations

import pytest

from orchestrator.core.fleet import Capacity, Load, load_of, place
from orchestrator.errors import BadInput


def jobs(n: int, gpus: int = 1, prefix: str = "j") -> list[dict]:
    return [{"id": f"{prefix}{i}", "name": f"{prefix}{i}", "gpus": gpus, "source": f"q.txt:{i + 1}"}
            for i in range(n)]


def spread(placed: dict[str, list[dict]]) -> dict[str, int]:
    return {h: len(js) for h, js in placed.items()}


def test_equal_boxes_share_the_queue_and_ties_go_by_name():
    loads = {"box-b": Load(Capacity(0, 2)), "box-a": Load(Capacity(0, 2))}
    placed = place(jobs(6), loads)
    assert spread(placed) == {"box-a": 3, "box-b": 3}
    # the first job (a tie at 0/2 vs 0/2) goes to the first name; then they alternate
    assert [j["id"] for j in placed["box-a"]] == ["j0", "j2", "j4"]
    assert loads["box-a"].used == 3 and loads["box-b"].used == 3


def test_spread_follows_capacity():
    loads = {"big": Load(Capacity(8, 1)), "small": Load(Capacity(2, 1)), "cpu": Load(Capacity(0, 2))}
    placed = place(jobs(12), loads)
    # load / capacity stays level: 8 GPUs, 2 GPUs and 2 slots take 12 jobs as 8, 2, 2
    assert spread(placed) == {"big": 8, "small": 2, "cpu": 2}


def test_existing_load_counts():
    loads = {"a": Load(Capacity(4, 1), used=4), "b": Load(Capacity(4, 1), used=0)}
    placed = place(jobs(4), loads)
    assert spread(placed) == {"a": 0, "b": 4}
    assert place(jobs(2, prefix="k"), loads) == {"a": [jobs(2, prefix="k")[0]], "b": [jobs(2, prefix="k")[1]]}


def test_gpus_n_goes_only_where_n_gpus_exist():
    loads = {"a2": Load(Capacity(2, 1)), "b4": Load(Capacity(4, 1)), "cpu": Load(Capacity(0, 8))}
    big = jobs(3, gpus=4, prefix="big")
    placed = place(big, loads, needs_gpu={j["id"] for j in big})
    assert spread(placed) == {"a2": 0, "b4": 3, "cpu": 0}
    # a 4-GPU job holds 4 units of b4's capacity: 3 of them make b4 3x full
    assert loads["b4"].used == 12


def test_gpu_jobs_avoid_gpu_less_boxes_but_plain_jobs_use_their_slots():
    loads = {"gpu": Load(Capacity(1, 1)), "cpu": Load(Capacity(0, 1))}
    asked = jobs(2, gpus=1, prefix="g")
    plain = jobs(2, prefix="p")
    placed = place(asked + plain, loads, needs_gpu={j["id"] for j in asked})
    # the GPU jobs queue on the one GPU (2/1 full), so the plain jobs go to the idle slot box
    assert [j["id"] for j in placed["gpu"]] == ["g0", "g1"]
    assert [j["id"] for j in placed["cpu"]] == ["p0", "p1"]


def test_a_multi_gpu_job_on_a_slot_box_holds_one_slot():
    loads = {"cpu": Load(Capacity(0, 2))}
    placed = place(jobs(2, gpus=3), loads)   # no gpus= on the line: any box takes it
    assert spread(placed) == {"cpu": 2} and loads["cpu"].used == 2


def test_nothing_fits_names_the_line_and_places_nothing():
    loads = {"a": Load(Capacity(2, 1)), "cpu": Load(Capacity(0, 4))}
    ok = jobs(2, prefix="ok")
    big = [{"id": "x", "name": "train-xl", "gpus": 8, "source": "sweep.txt:7"}]
    with pytest.raises(BadInput) as err:
        place(ok + big, loads, needs_gpu={"x"})
    assert err.value.message.startswith("sweep.txt:7: job train-xl asks for gpus=8")
    assert "a 2 GPU(s)" in err.value.message and "cpu no GPU" in err.value.message
    assert err.value.hint and "gpus=" in err.value.hint
    with pytest.raises(BadInput, match="sweep.txt:3"):   # a GPU job and no GPU box at all
        place([{"id": "y", "name": "y", "gpus": 1, "source": "sweep.txt:3"}],
              {"cpu": Load(Capacity(0, 4))}, needs_gpu={"y"})


def test_load_of_counts_queued_and_running_only():
    rows = [{"state": "queued", "gpus": 2}, {"state": "running", "gpus": 1}, {"state": "succeeded", "gpus": 4},
            {"state": "moved", "gpus": 4}, {"state": "queued", "gpus": 0}]
    assert load_of(rows, Capacity(4, 1)).used == 2 + 1 + 1   # gpus=0 still takes a GPU on a GPU box
    assert load_of(rows, Capacity(0, 3)).used == 3          # one slot per active job


def test_a_thousand_jobs_over_four_boxes_stay_level():
    loads = {f"box-{c}": Load(Capacity(0, 4)) for c in "abcd"}
    placed = place(jobs(1000), loads)
    assert spread(placed) == {"box-a": 250, "box-b": 250, "box-c": 250, "box-d": 250}
    ids = [j["id"] for js in placed.values() for j in js]
    assert sorted(ids) == sorted(f"j{i}" for i in range(1000))   # each job exactly once
