"""The user config ``$XDG_CONFIG_HOME/gpurun/config.yaml``: its schema and its one reader.

``read_config`` is the only place the file is read (``core/pull.user_config`` calls it for
``pull``, ``down`` and ``recover``; ``core/fleet_state.lost_after_s`` for ``fleet``). It checks the whole file once, with the profile schema's
validator (``profile_schema.Validator``), so a value of the wrong type (``pull: {dest: 5}``,
``interval_s: abc``), a non-finite number, bad UTF-8, a FIFO or a 1 GB file is one
``ConfigError`` naming file, line and key, never a traceback where the value is used.

``pull`` keys not listed here are left to ``core/pull.pull_config``, which refuses those not
in its ``PULL_KEYS``: the pull engine owns that list, this schema owns the types.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator import paths
from orchestrator.errors import ConfigError
from orchestrator.profile_schema import Int, Num, Obj, Str, Validator

_NONEMPTY = (lambda v: bool(v.strip()) and "\0" not in v, "non-empty text")


def _expands(v: str) -> bool:
    from pathlib import Path

    try:
        Path(v).expanduser()   # "~nosuchuser/x" raises RuntimeError where pull uses it
    except (RuntimeError, ValueError):
        return False
    return bool(v.strip())


_DIR = (_expands, "a directory path (~ or ~USER of a user who exists)")
_URL = (lambda v: re.match(r"https?://[^\s]+$", v) is not None, "an http(s):// URL")
_ENV_NAME = (lambda v: re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) is not None,
             "an environment variable NAME such as R2_ACCESS_KEY_ID")

PULL = Obj({
    "dest": Str(check=_DIR),
    "keep_latest": Int(minimum=0, maximum=1_000_000, nullable=True),   # null or absent: keep all
    "best": Obj({"metric": Str(required=True, check=_NONEMPTY), "mode": Str(choices=("min", "max"))}),
    "interval_s": Num(minimum=1, maximum=86400),                       # as `pull --interval` (>= 1)
    "method": Str(choices=("auto", "rsync", "sftp")),
    "settle_s": Num(minimum=0, maximum=3600),
    "reverify": Int(minimum=0, maximum=1_000_000),
    "bwlimit_kbps": Int(minimum=0, maximum=100_000_000),
    "streams": Int(minimum=1, maximum=8),                              # parallel ssh streams per large file
}, open=True)

S3 = Obj({
    "endpoint_url": Str(check=_URL),
    "bucket": Str(required=True, check=_NONEMPTY),
    "prefix": Str(),
    "access_key_env": Str(check=_ENV_NAME),
    "secret_key_env": Str(check=_ENV_NAME),
    "region": Str(check=_NONEMPTY),
})

# how long a fleet member may stay silent before its queue moves (``core/fleet_state``); at
# most 30 days: a longer silence is a box that is gone, and --lost-after says so for one run
FLEET = Obj({"lost_after_s": Num(minimum=0, maximum=30 * 86400)})

SCHEMA = Obj({"pull": PULL, "s3": S3, "fleet": FLEET})


class ConfigValidator(Validator):
    """The profile validator's rules and messages, raising ConfigError."""

    error = ConfigError
    document = "config.yaml"
    secret_hint = ("config.yaml never holds secret values: put the NAME of an environment variable "
                   "(s3.access_key_env, s3.secret_key_env) and export the secret in your shell")


def config_path() -> str:
    return str(paths.config_home() / "config.yaml")


def read_config() -> tuple[dict, str]:
    """(``config.yaml`` parsed and checked, its path); ``{}`` when absent or empty. Raises
    ConfigError naming file, line and key for anything else."""
    from pathlib import Path

    from orchestrator.profiles import read_yaml

    path = config_path()
    try:
        data, marks = read_yaml(Path(path), ConfigError, "config.yaml")
    except FileNotFoundError:
        return {}, path
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not config.yaml", "move it away; config.yaml is a file") from None
    if data is None:   # empty, or only comments
        return {}, path
    check(data, path, marks)
    return data, path


def check(data: Any, source: str, marks: dict | None = None) -> None:
    """Raise ConfigError unless ``data`` is a valid config.yaml document."""
    ConfigValidator(source, marks or {}).validate(data, SCHEMA)
