"""Where gpurun keeps things on the controller: XDG data and config dirs, shipped data.

Only stdlib; every function reads the environment at call time so tests can point
``XDG_DATA_HOME`` / ``XDG_CONFIG_HOME`` at a temp dir.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path


def data_home() -> Path:
    """``$XDG_DATA_HOME/gpurun`` (default ``~/.local/share/gpurun``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "gpurun"


def config_home() -> Path:
    """``$XDG_CONFIG_HOME/gpurun`` (default ``~/.config/gpurun``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "gpurun"


def _shipped_dir(name: str) -> Path:
    """A top-level data dir (``profiles``, ``templates``): in the source tree for editable
    installs, else under ``<prefix>/share/gpurun`` where the wheel's data-files land."""
    tree = Path(__file__).resolve().parent.parent / name
    if tree.is_dir():
        return tree
    for prefix in (sysconfig.get_path("data"), sys.prefix, os.path.join(sys.prefix, "local")):
        cand = Path(prefix) / "share" / "gpurun" / name
        if cand.is_dir():
            return cand
    return tree


def shipped_profiles_dir() -> Path:
    return _shipped_dir("profiles")


def templates_dir() -> Path:
    return _shipped_dir("templates")


def user_profiles_dir() -> Path:
    return config_home() / "profiles"


def artifacts_home() -> Path:
    """Where ``gpurun pull`` puts artifacts when neither ``--dest`` nor ``pull.dest`` says:
    one place whatever the current directory, so ``down`` and ``recover`` find them."""
    return data_home() / "artifacts"


def local_state_dir(host: str = "local") -> Path:
    """The agent state dir for a host whose agent runs on this machine."""
    return data_home() / "hosts" / host / "agent"
