"""One function over many hosts (or members, or gates) at once: the controller's one fan-out.

Each call waits on its own box, so they run in threads, at most ``max_workers`` at a time.
Results come back in the order of the input, whatever order the boxes answered in. Every
call's exception is captured as a value (``Outcome.error``), so one host failing never
hides another's answer, and none is lost: ``map_all`` raises the first one in input order
only after every call has ended (as ``ThreadPoolExecutor.map`` did at each site before),
and ``map_caught`` turns the expected ``GpurunError`` of a host into that host's own
result (``{"host": h, "error": ...}``, as each view shows it) and raises anything else.

One item (or none) runs in the caller's thread: a single host needs no pool.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Callable, Generic, Optional, Sequence, TypeVar

from orchestrator.errors import GpurunError

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 32  # hosts answered at once: each is one SSH round trip, mostly waiting


@dataclass(frozen=True)
class Outcome(Generic[T, R]):
    """What ``fn(item)`` did: its ``value``, or the ``error`` it raised."""

    item: T
    value: Optional[R] = None
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def get(self) -> R:
        """The value, or the captured exception raised again (its traceback kept)."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def _one(fn: Callable[[T], R], item: T) -> Outcome[T, R]:
    try:
        return Outcome(item, fn(item))
    except BaseException as exc:  # captured, never lost: the caller decides (``get``)
        return Outcome(item, error=exc)


def fan_out(fn: Callable[[T], R], items: Sequence[T], *,
            max_workers: int = MAX_WORKERS) -> list[Outcome[T, R]]:
    """``fn`` over ``items`` in parallel (at most ``max_workers`` threads): one ``Outcome``
    per item, in input order, once every call has ended."""
    items = list(items)
    if len(items) <= 1:
        return [_one(fn, i) for i in items]
    with cf.ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items)))) as pool:
        return list(pool.map(lambda i: _one(fn, i), items))


def map_all(fn: Callable[[T], R], items: Sequence[T], *,
            max_workers: int = MAX_WORKERS) -> list[R]:
    """``fn``'s values in input order; when calls raised, the first of them in input order
    is raised, after every call has ended."""
    return [o.get() for o in fan_out(fn, items, max_workers=max_workers)]


def map_caught(fn: Callable[[T], R], items: Sequence[T], on_error: Callable[[T, GpurunError], R], *,
               max_workers: int = MAX_WORKERS) -> list[R]:
    """Like ``map_all``, but an item whose call raised a ``GpurunError`` (a host that could not
    answer, a refused verb) gets ``on_error(item, exc)`` as its value; anything else raises."""
    out: list[R] = []
    for o in fan_out(fn, items, max_workers=max_workers):
        if isinstance(o.error, GpurunError):
            out.append(on_error(o.item, o.error))
        else:
            out.append(o.get())
    return out
