"""Secrets on the box: one 0600 file in the agent's state dir, read at launch and when redacting.

``gpurun secret set NAME`` sends the value in the verb's JSON request (stdin of the agent
process, never argv) and ``put`` writes it here; nothing else on the box keeps a copy: not the
store, not the job rows (a job holds the secret NAMES it asked for), not the agent log.

    <state_dir>/secrets.json   {"version": 1, "secrets": {NAME: {"value": str, "set_at": float}}}

The file is created with mode 0600 (never wider, not even for an instant: ``os.open`` with the
mode, then a rename over the old file) in a state dir narrowed to 0700; writers serialize on
``secrets.lock``. Readers never lock: a rename is atomic.

``values(state_dir)`` is what redaction uses: the known values, cached per process and
re-read only when the file changes (one ``stat`` per call, nothing when no file exists), so
the event writer and every verb reply can afford it. ``redact`` replaces each value with
``***``. Values shorter than ``MIN_LEN`` cannot be hidden in text and are refused by ``put``.

Stdlib only, Python >= 3.8 (it ships in the agent zipapp).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

FILE = "secrets.json"
LOCK = "secrets.lock"
MASK = "***"
MIN_LEN = 4        # a shorter value would turn ordinary text into *** everywhere
MAX_LEN = 64 * 1024
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_HINT = "a secret name looks like an environment variable name: letters, digits and '_', not starting " \
            "with a digit (e.g. WANDB_API_KEY)"

# path -> ((mtime_ns, size, ino), {NAME: value}, values to mask, longest first)
_CACHE: Dict[str, Tuple[Tuple[int, int, int], Dict[str, str], List[str]]] = {}


def valid_name(name: Any) -> bool:
    return isinstance(name, str) and NAME_RE.match(name) is not None and len(name) <= 256


def path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE)


def _read(state_dir: str) -> Dict[str, Dict[str, Any]]:
    try:
        with open(path(state_dir)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    table = data.get("secrets") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        return {}
    return {k: v for k, v in table.items()
            if valid_name(k) and isinstance(v, dict) and isinstance(v.get("value"), str)}


def load(state_dir: str) -> Dict[str, str]:
    """``{NAME: value}`` of every secret set on this box (empty when none)."""
    return {k: v["value"] for k, v in _read(state_dir).items()}


def names(state_dir: str) -> Dict[str, float]:
    """``{NAME: set_at}`` (epoch seconds): what may be shown, never the values."""
    return {k: float(v.get("set_at") or 0.0) for k, v in _read(state_dir).items()}


def _write(state_dir: str, table: Dict[str, Dict[str, Any]]) -> None:
    """Replace the file in one rename; the temporary file is 0600 from its creation."""
    target = path(state_dir)
    tmp = "%s.%d.tmp" % (target, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old leftover temp file may have had another mode
        with os.fdopen(fd, "w") as f:
            json.dump({"version": 1, "secrets": table}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, target)


class _Locked:
    """The state dir made private (0700) and the writers' lock held."""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.fd = -1

    def __enter__(self) -> "_Locked":
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        if os.stat(self.state_dir).st_mode & 0o077:
            os.chmod(self.state_dir, 0o700)
        self.fd = os.open(os.path.join(self.state_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)


def check_value(value: Any) -> Optional[str]:
    """Why ``value`` cannot be a secret (never quoting it), or None when it can."""
    if not isinstance(value, str) or not value:
        return "the value is empty"
    if len(value) < MIN_LEN:
        return "the value is shorter than %d characters, too short to be hidden in output" % MIN_LEN
    if len(value) > MAX_LEN:
        return "the value is longer than %d bytes" % MAX_LEN
    if "\0" in value:
        return "the value contains a NUL byte, which no environment variable can hold"
    return None


def put(state_dir: str, name: str, value: str) -> float:
    """Set ``name`` to ``value`` (replacing an older value); returns when it was set.
    ``ValueError`` (naming the secret, never its value) for a bad name or value."""
    if not valid_name(name):
        raise ValueError("bad secret name %r: %s" % (name, NAME_HINT))
    why = check_value(value)
    if why:
        raise ValueError("secret %s not set: %s" % (name, why))
    now = time.time()
    with _Locked(state_dir):
        table = _read(state_dir)
        table[name] = {"value": value, "set_at": now}
        _write(state_dir, table)
    return now


def remove(state_dir: str, name: str) -> bool:
    """Forget ``name``; False when it was not set."""
    with _Locked(state_dir):
        table = _read(state_dir)
        if name not in table:
            return False
        del table[name]
        _write(state_dir, table)
    return True


def forms(value: str) -> List[str]:
    """The texts to mask for one value: itself, its JSON-escaped form when that differs, and
    each long enough line of a multi-line value (a PEM key printed line by line)."""
    out = [value]
    escaped = json.dumps(value)[1:-1]
    if escaped != value:
        out.append(escaped)
    if "\n" in value:
        out.extend(line for line in value.splitlines() if len(line.strip()) >= 8)
    return out


def _cached(state_dir: str) -> Tuple[Dict[str, str], List[str]]:
    p = path(state_dir)
    try:
        st = os.stat(p)
    except OSError:
        _CACHE.pop(p, None)
        return {}, []
    key = (st.st_mtime_ns, st.st_size, st.st_ino)  # a rewrite is a rename: a new inode
    hit = _CACHE.get(p)
    if hit is not None and hit[0] == key:
        return hit[1], hit[2]
    table = load(state_dir)
    masks = set()
    for v in table.values():
        if len(v) >= MIN_LEN:
            masks.update(forms(v))
    out = sorted(masks, key=len, reverse=True)
    _CACHE[p] = (key, table, out)
    return table, out


def cached(state_dir: str) -> Dict[str, str]:
    """``load``, cached per process until the file changes (one ``stat`` when unchanged,
    nothing more when there is no file). Do not modify the returned dict."""
    return _cached(state_dir)[0]


def values(state_dir: str) -> List[str]:
    """The texts to mask on this box, longest first; cached like ``cached``."""
    return _cached(state_dir)[1]


def redact(text: Any, values: Iterable[str]) -> Any:
    """``text`` with every one of ``values`` replaced by ``***`` (non-text is returned as is)."""
    if not isinstance(text, str) or not text:
        return text
    for v in values:
        if v and v in text:
            text = text.replace(v, MASK)
    return text


def redact_obj(obj: Any, values: List[str]) -> Any:
    """A copy of a JSON-like ``obj`` with every string (keys too) redacted."""
    if not values:
        return obj
    if isinstance(obj, str):
        return redact(obj, values)
    if isinstance(obj, dict):
        return {redact(k, values): redact_obj(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v, values) for v in obj]
    return obj


def held_back(text: str, values: List[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a secret that the next
    read completes: a log read in chunks holds them back, so no chunk ends mid-secret."""
    keep = 0
    for v in values:
        i = text.find(v[0], max(0, len(text) - len(v) + 1)) if v else -1
        while i >= 0:  # the leftmost start whose rest of ``text`` begins ``v``: the longest piece
            if v.startswith(text[i:]):
                keep = max(keep, len(text) - i)
                break
            i = text.find(v[0], i + 1)
    return keep


def for_job(state_dir: str, wanted: Iterable[str]) -> Tuple[Dict[str, str], List[str], List[str]]:
    """``({NAME: value} of the wanted secrets that are set, [wanted NAMES that are not],
    [set NAMES not wanted])``: what a job exports, what fails it, what it must not inherit."""
    have = cached(state_dir)
    wanted = list(wanted)
    found = {n: have[n] for n in wanted if n in have}
    return found, [n for n in wanted if n not in have], [n for n in have if n not in found]


class RedactingStream:
    """A text stream (the daemon's ``sys.stderr``, which is ``agent.log``) that masks the box's
    secret values in everything written to it."""

    def __init__(self, stream: Any, state_dir: str):
        self._stream = stream
        self._state_dir = state_dir

    def write(self, text: Any) -> Any:
        return self._stream.write(redact(text, values(self._state_dir)))

    def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
