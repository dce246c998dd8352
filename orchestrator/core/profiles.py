"""Profile use cases: every provider profile as one row of plain facts (``profiles ls``) and one
profile in full with its money and data traps spelled out (``profiles show``, ``setup``).

Loading, layering and validating profile YAML is ``orchestrator.profiles``.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import ProfileError
from orchestrator.profiles import Profile, available_names, load_profile, plain_words

__all__ = ["list_profiles", "row", "show_profile"]


def row(p: Profile) -> dict[str, Any]:
    """One profile as a ``profiles ls --json`` row (documented keys)."""
    d = p.data
    return {
        "name": p.name, "kind": d["kind"], "description": d["description"],
        "source": p.source, "layers": p.layers,
        "meter_stop": d["meter_stop"]["name"],
        "meter_stop_irreversible": d["meter_stop"]["irreversible"],
        "destroy": d["destroy"]["name"],
        "bills_when_stopped": d["billing"]["when_stopped"],
        "danger_clocks": [f"{c['name']}: after {c['after']}" for c in d["danger_clocks"]],
        "spot": d["spot"]["available"], "detach": d["detach"], "boot_hook": d["boot_hook"],
        "credential_env": (d["api"] or {}).get("credential_env"),
        "checked": d["checked"],
    }


def list_profiles() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rows, errors)``: a row per valid profile, shipped and the user's; an invalid one does
    not hide the others but becomes ``{name, error, hint}``."""
    rows, errors = [], []
    for name in available_names():
        try:
            rows.append(row(load_profile(name)))
        except ProfileError as exc:
            errors.append({"name": name, "error": str(exc), "hint": exc.hint})
    return rows, errors


def show_profile(name: str) -> dict[str, Any]:
    """Profile ``name`` merged over its layers: ``{name, source, layers, profile, plain}``
    (the ``profiles show --json`` shape; ``plain``: meter, bills_when_stopped, danger_clocks,
    traps as sentences). Raises ProfileError for an unknown or invalid profile."""
    p = load_profile(name)
    return {"name": p.name, "source": p.source, "layers": p.layers, "profile": p.data, "plain": plain_words(p)}
