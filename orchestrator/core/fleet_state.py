"""The controller's memory of a fleet's lost hosts: ``data_home()/fleet-state.json``.

Two facts live here, and nothing else:

- ``unreachable_since``: ``{host: first time it failed to answer}``; cleared when it answers.
  A host unreachable for longer than ``lost_after_s`` (``--lost-after``, else config.yaml's
  ``fleet.lost_after_s``, else 120 s) is *lost* and its queue moves away.
- ``lost_moves``: ``{host: {job id: {"to", "state", "at"}}}``: where each job of a lost host
  went and what state it was in then. When the host answers again, its copies of those jobs
  are released (compare-and-set), so a job that was queued there never runs twice.
- ``gpus``: ``{host: {"n", "at"}}``: how many GPUs its agent saw, for ``GPU_TTL_S`` (a balance
  is then one round trip per member, not two).

The moves between reachable hosts need no record here: the old host's ``moved`` row is their
journal (``core/fleet_balance``). Written like ``hosts.json``: under a lock, to a temporary
file, then renamed; a file that cannot be read is one ``FleetError`` naming it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator import paths
from orchestrator.errors import FleetError

SCHEMA = "gpurun/FLEET-STATE/v1"
GPU_TTL_S = 600.0
LOST_AFTER_S = 120.0   # when neither --lost-after nor config.yaml's fleet.lost_after_s says


def lost_after_s(flag: float | None = None) -> float:
    """How long a member may stay silent before it is lost: ``flag`` (``--lost-after``) when
    given, else ``fleet.lost_after_s`` in config.yaml, else ``LOST_AFTER_S``. A bad value in the
    file is a ConfigError naming file, line and key (``userconfig`` checks the whole file)."""
    if flag is not None:
        return float(flag)
    from orchestrator.userconfig import read_config

    data, _ = read_config()
    value = (data.get("fleet") or {}).get("lost_after_s")
    return LOST_AFTER_S if value is None else float(value)


def state_file() -> Path:
    return paths.data_home() / "fleet-state.json"


def empty() -> dict[str, Any]:
    return {"schema": SCHEMA, "unreachable_since": {}, "lost_moves": {}, "gpus": {}}


def load() -> dict[str, Any]:
    """The state, or an empty one when the file does not exist yet."""
    path = state_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return empty()
    except OSError as exc:
        raise FleetError(f"{path}: cannot read the fleet state: {exc.strerror or exc}",
                         hint="check the file's permissions") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise FleetError(f"{path}" + (f", line {line}" if line else "") + f": not valid JSON ({exc})",
                         hint="it records where a lost host's jobs went; restore it from a backup, or "
                              "move it away once every fleet host answers again") from None
    for key in ("unreachable_since", "lost_moves", "gpus"):
        if not isinstance(data, dict) or not isinstance(data.get(key, {}), dict):
            raise FleetError(f"{path}: key {key!r} is not an object",
                             hint="the file is written by gpurun; move it away once every host answers")
    out = empty()
    out["unreachable_since"] = {str(k): float(v) for k, v in data.get("unreachable_since", {}).items()}
    out["lost_moves"] = {str(h): dict(v) for h, v in data.get("lost_moves", {}).items() if isinstance(v, dict)}
    out["gpus"] = {str(h): v for h, v in data.get("gpus", {}).items() if isinstance(v, dict)}
    return out


def cached_gpus(data: dict[str, Any], host: str, now: float) -> int | None:
    rec = data["gpus"].get(host) or {}
    return int(rec["n"]) if "n" in rec and now - float(rec.get("at") or 0) < GPU_TTL_S else None


def save(data: dict[str, Any]) -> None:
    """Replace the file in one rename (fsync'd: a lost move must survive a crash)."""
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"fleet-state.json.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(dict(data, schema=SCHEMA), fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextmanager
def locked(timeout_s: float = 300.0) -> Iterator[None]:
    """One fleet command at a time on this controller (``balance`` holds it throughout)."""
    lock = paths.data_home() / "fleet-state.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise FleetError(f"another gpurun fleet command holds {lock}",
                                     hint="wait for it to finish, then run this one again") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def note_reachability(data: dict[str, Any], answered: list[str], silent: list[str], now: float) -> list[str]:
    """Record who answered and who did not; returns the hosts that answered again after a
    silence (their ``unreachable_since`` is cleared by ``forget_host`` once reconciled)."""
    since = data["unreachable_since"]
    for name in silent:
        since.setdefault(name, now)
    return [name for name in answered if name in since or name in data["lost_moves"]]


def lost_hosts(data: dict[str, Any], silent: list[str], now: float, lost_after_s: float) -> list[str]:
    since = data["unreachable_since"]
    return [n for n in silent if now - since.get(n, now) >= lost_after_s]


def record_lost_move(data: dict[str, Any], host: str, job: str, to: str, state: str, now: float) -> None:
    data["lost_moves"].setdefault(host, {})[job] = {"to": to, "state": state, "at": now}


def forget_host(data: dict[str, Any], host: str) -> None:
    data["unreachable_since"].pop(host, None)
    data["lost_moves"].pop(host, None)


def events_file() -> Path:
    return paths.data_home() / "fleet-events.jsonl"


def note_event(kind: str, data: dict[str, Any]) -> None:
    """Append one line to the controller's fleet log (``fleet-events.jsonl``): the one place a
    job that ran on two members is remembered after the command that found it has ended."""
    try:
        path = events_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"ts": time.time(), "kind": kind, **data}, sort_keys=True) + "\n")
    except OSError:
        pass   # the report and the command's output still say it
