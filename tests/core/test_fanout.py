"""core/fanout: the one per-host fan-out (fleet submit, balance, views, status --all-hosts, watch).

Order and concurrency are forced with events, not timed: the first item can only finish
after the last one has run, so the calls overlapped and the answers were put back in order.
"""

from __future__ import annotations

import threading

import pytest

from orchestrator.core import fanout
from orchestrator.errors import ConnectError


def test_results_in_input_order_while_calls_overlap_and_every_error_is_kept():
    last_ran = threading.Event()
    ended: list[str] = []

    def call(name: str) -> str:
        if name == "a":  # answers last: only once "d" has run
            assert last_ran.wait(10), "the calls did not run at the same time"
        if name == "d":
            last_ran.set()
        ended.append(name)
        if name == "b":
            raise ConnectError("cannot reach b", "start it")
        if name == "c":
            raise KeyError("c")
        return name.upper()

    out = fanout.fan_out(call, ["a", "b", "c", "d"], max_workers=4)
    assert [o.item for o in out] == ["a", "b", "c", "d"] and ended.index("d") < ended.index("a")
    assert [o.value for o in out] == ["A", None, None, "D"]
    assert isinstance(out[1].error, ConnectError) and isinstance(out[2].error, KeyError)
    assert [o.ok for o in out] == [True, False, False, True]

    # a host's GpurunError is its own answer; anything else is raised, after every call ended
    ended.clear()
    last_ran.clear()
    with pytest.raises(KeyError):
        fanout.map_caught(call, ["a", "b", "c", "d"], lambda n, exc: f"{n}: {exc.message}")
    assert sorted(ended) == ["a", "b", "c", "d"]
    last_ran.clear()
    got = fanout.map_caught(call, ["a", "b", "d"], lambda n, exc: f"{n}: {exc.message}")
    assert got == ["A", "b: cannot reach b", "D"]
    last_ran.clear()
    with pytest.raises(ConnectError):  # the first error in input order, not the first to happen
        fanout.map_all(call, ["a", "b", "c", "d"])


def test_one_item_runs_in_the_callers_thread_and_none_is_nothing():
    assert fanout.map_all(lambda _: threading.current_thread(), ["only"]) == [threading.current_thread()]
    assert fanout.fan_out(lambda _: 1 / 0, []) == []
    (one,) = fanout.fan_out(lambda _: 1 / 0, ["x"])
    with pytest.raises(ZeroDivisionError):
        one.get()
