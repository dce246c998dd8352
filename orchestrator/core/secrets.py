"""Secret use cases: put a value on a host (``set``), list the names (``names``), forget one
(``remove``), and check a name before anything crosses the network.

The value goes to the agent in the ``secret_set`` request body, which is the stdin of the
agent process on the host: never in a command line, never in a log, never in the controller's
job snapshot (``AgentClient`` records only ``submit`` and ``status``). On the host it lives in
one 0600 file (``orchestrator/agent/secrets.py``); jobs ask for secrets by name (``secrets=``
in a queue line, ``secrets:`` in the profile or the host entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from orchestrator import hosts as hostinv
from orchestrator.agent import secrets as box
from orchestrator.errors import BadInput

__all__ = ["SecretInfo", "check_name", "names", "remove", "set_secret"]


@dataclass(frozen=True)
class SecretInfo:
    """One secret of a host as ``secret ls`` shows it: a name and when it was set."""

    name: str
    set_at: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "set_at": self.set_at}


def check_name(name: str) -> str:
    """``name`` when it looks like an environment variable name; ``BadInput`` (exit 2) else."""
    if not box.valid_name(name):
        raise BadInput(f"bad secret name {name!r}", box.NAME_HINT)
    return name


def check_value(name: str, value: Optional[str]) -> str:
    """The value, or ``BadInput`` saying why it cannot be a secret (never quoting it)."""
    why = box.check_value(value)
    if why:
        raise BadInput(f"secret {name} not set: {why}",
                       f"give a value of at least {box.MIN_LEN} characters (export {name}=... or type it at "
                       f"the prompt)")
    return value  # type: ignore[return-value]


def set_secret(name: str, value: str, host: Optional[str] = None) -> tuple[str, float]:
    """Put ``value`` under ``name`` on ``host``; returns ``(host name, set_at)``."""
    from orchestrator.core.session import open_session

    check_name(name)
    check_value(name, value)
    entry = hostinv.get_host(host)
    with open_session(host=entry) as s:
        res = s.secret_set(name, value)
    return entry["name"], float(res["set_at"])


def names(host: Optional[str] = None) -> tuple[str, list[SecretInfo]]:
    """``(host name, the secrets set there)``: names and times, never values."""
    from orchestrator.core.session import open_session

    entry = hostinv.get_host(host)
    with open_session(host=entry) as s:
        rows = s.secret_ls()["secrets"]
    return entry["name"], [SecretInfo(str(r["name"]), float(r.get("set_at") or 0.0)) for r in rows]


def remove(name: str, host: Optional[str] = None) -> str:
    """Forget ``name`` on ``host``; ``BadInput`` when it was not set. Returns the host name."""
    from orchestrator.core.session import open_session

    check_name(name)
    entry = hostinv.get_host(host)
    with open_session(host=entry) as s:
        res = s.secret_rm(name)
    if not res["removed"]:
        raise BadInput(f"no secret {name} on {entry['name']}",
                       f"see `gpurun secret ls --host {entry['name']}` for the names set there")
    return entry["name"]


def default_names(host: dict) -> Optional[list[str]]:
    """The secrets every job on ``host`` asks for unless its line says ``secrets=``: the host
    entry's ``secrets`` list, else the profile's; None when neither names any."""
    names_ = host.get("secrets")
    if names_ is None:
        from orchestrator.profiles import load_profile
        names_ = load_profile(host.get("profile") or "local").get("secrets")
    if not names_:
        return None
    for n in names_:
        if not box.valid_name(n):
            raise BadInput(f"host {host.get('name')!r}: bad secret name {n!r} in its default secrets",
                           box.NAME_HINT)
    return list(dict.fromkeys(names_))
