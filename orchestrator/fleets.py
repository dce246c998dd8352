"""The fleet inventory: ``$XDG_DATA_HOME/gpurun/fleets.json``, named groups of inventory hosts.

Shape: ``{"fleets": {NAME: {"hosts": [host names], "created_at": unix seconds}}}``. Written
like ``hosts.json`` (``orchestrator/hosts.py``): under an flock, through a temp file and a
rename, so two CLIs never half-write it; a file that cannot be read is never replaced.

Every read checks the file once, here: a file that is not UTF-8 JSON, has the wrong shape or
names a host that could not be one is one ``FleetError`` naming file, line and key. A fleet
only names hosts; what reaches them stays in ``hosts.json``. A host removed from the host
inventory (``gpurun host rm``) stays listed here and is dropped where the fleet is read
(``get_fleet`` reports it in its warnings), so removing a host never needs this file to be
written as well.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from orchestrator import hosts as hostinv
from orchestrator import paths
from orchestrator.errors import FleetError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

MAX_FLEETS_BYTES = 1024 * 1024
_FIX = "fix fleets.json by hand, or move it away and `gpurun fleet add` the fleets again"
_NAME_HINT = "use letters, digits, '.', '_' or '-' (max 63), e.g. gpu3"


def _file() -> str:
    return str(paths.data_home() / "fleets.json")


def _fail(src: str, text: str, key: tuple, msg: str, hint: str = _FIX) -> FleetError:
    dotted = ".".join(str(k) for k in key) or "(top level)"
    # the line is found the way hosts.json finds its own (error path only: it imports yaml)
    return FleetError(f"{src}{hostinv._line_of(text, key)}: key '{dotted}': {msg}", hint)


def check_fleets(data: Any, src: str, text: str = "") -> dict[str, dict]:
    """The ``fleets`` mapping of a parsed fleets.json, each fleet checked; FleetError otherwise.
    Keys other than ``hosts`` and ``created_at`` are kept (a newer gpurun may add some)."""
    if not isinstance(data, dict):
        raise _fail(src, text, (), f"expected a mapping {{\"fleets\": {{...}}}}, got {type(data).__name__}")
    fleets = data.get("fleets", {})
    if not isinstance(fleets, dict):
        raise _fail(src, text, ("fleets",), f"expected a mapping of fleet name -> fleet, got {type(fleets).__name__}")
    for name, fleet in fleets.items():
        key = ("fleets", name)
        if not hostinv.NAME_RE.match(name):
            raise _fail(src, text, key, f"invalid fleet name {name!r}", _NAME_HINT)
        if not isinstance(fleet, dict):
            raise _fail(src, text, key, f"expected a mapping {{\"hosts\": [...]}}, got {repr(fleet)[:40]}")
        if "hosts" not in fleet:
            raise _fail(src, text, key, "missing required key 'hosts'", 'add "hosts": ["HOST", ...]')
        members = fleet["hosts"]
        if not isinstance(members, list):
            raise _fail(src, text, key + ("hosts",), f"expected a list of host names, got {repr(members)[:40]}")
        for i, h in enumerate(members):
            if not isinstance(h, str) or not hostinv.NAME_RE.match(h):
                raise _fail(src, text, key + ("hosts", i), f"{repr(h)[:40]} is not a host name",
                            "a fleet lists host names from `gpurun host ls`; " + _FIX)
        at = fleet.get("created_at")
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float))
                               or not 0 <= at < 1e11):
            raise _fail(src, text, key + ("created_at",), f"expected unix seconds, got {repr(at)[:40]}")
    return fleets


def _read_file() -> dict:
    """fleets.json parsed and checked; ``{"fleets": {}}`` when absent."""
    from orchestrator.inputfile import read_json

    src = _file()
    got = read_json(src, MAX_FLEETS_BYTES, error=FleetError, what="fleet inventory (fleets.json)", fix=_FIX)
    if got is None:
        return {"fleets": {}}
    data, text = got
    check_fleets(data, src, text)
    return data


def load_fleets() -> dict[str, dict]:
    """Every fleet: ``{name: {"hosts": [host names], "created_at": float}}``."""
    return dict(_read_file().get("fleets", {}))


def fleet_names() -> list[str]:
    """Every fleet name, sorted; never raises (shell completion calls it on every Tab)."""
    try:
        return sorted(load_fleets())
    except (FleetError, OSError):
        return []


def _unknown(name: str, known: list[str]) -> FleetError:
    import difflib

    # case folded first: `--fleet gpu` for fleet GPU is the likeliest slip
    close = [k for k in known if k.casefold() == name.casefold()] or \
        difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listed = f"known fleets: {', '.join(known)}; " if known else "no fleet exists yet; "
    return FleetError(f"unknown fleet {name!r}",
                      f"{hint}{listed}make one with `gpurun fleet add {name} HOST...`")


def get_fleet(name: str, warnings: list[str] | None = None) -> list[str]:
    """The host names of fleet ``name`` that are in the host inventory, in the fleet's order.
    A member no longer in the inventory is dropped, with a line appended to ``warnings``.
    FleetError (hint: the known fleets) when ``name`` is unknown."""
    fleets = load_fleets()
    if name not in fleets:
        raise _unknown(name, sorted(fleets))
    inventory = hostinv.load_hosts()
    kept: list[str] = []
    for h in fleets[name]["hosts"]:
        if h in inventory:
            kept.append(h)
        elif warnings is not None:
            warnings.append(f"fleet {name}: host {h!r} is no longer in the host inventory; left out "
                            f"(`gpurun fleet rm {name} {h}` forgets it)")
    return kept


def _locked() -> AbstractContextManager[dict]:
    from orchestrator.inputfile import locked_rewrite
    return locked_rewrite(_file(), _read_file, check_fleets, "fleets")


def add_fleet(name: str, hosts: list[str]) -> list[str]:
    """Create fleet ``name`` or add ``hosts`` to it (a host already in it is kept once);
    returns its hosts. Each host must be in the host inventory (``local`` is): HostError
    naming the first that is not. FleetError for a bad fleet name or no hosts."""
    if not hostinv.NAME_RE.match(name or ""):
        raise FleetError(f"invalid fleet name {name!r}", _NAME_HINT)
    if not hosts:
        raise FleetError(f"no hosts named for fleet {name!r}", f"e.g. `gpurun fleet add {name} box-a box-b`")
    for h in hosts:
        hostinv.get_host(h)   # HostError with the known hosts and a "did you mean"
    with _locked() as data:
        fleet = data["fleets"].setdefault(name, {"hosts": [], "created_at": time.time()})
        for h in hosts:
            if h not in fleet["hosts"]:
                fleet["hosts"].append(h)
        return list(fleet["hosts"])


def remove_fleet(name: str, hosts: list[str] | None = None) -> list[str]:
    """Forget fleet ``name`` (no ``hosts``), or take ``hosts`` out of it; returns the host names
    taken out. A fleet left with no host is forgotten. Nothing on any box is touched.
    FleetError for an unknown fleet or a host not in it."""
    with _locked() as data:
        fleets = data["fleets"]
        if name not in fleets:
            raise _unknown(name, sorted(fleets))
        members = fleets[name]["hosts"]
        if not hosts:
            del fleets[name]
            return list(members)
        missing = [h for h in hosts if h not in members]
        if missing:
            raise FleetError(f"host {missing[0]!r} is not in fleet {name!r}",
                             f"its hosts: {', '.join(members) or '(none)'}")
        fleets[name]["hosts"] = [h for h in members if h not in hosts]
        if not fleets[name]["hosts"]:
            del fleets[name]
        return [h for h in members if h in hosts]


__all__ = ["add_fleet", "check_fleets", "fleet_names", "get_fleet", "load_fleets", "remove_fleet"]
