"""Queue files: one shell command per line, with an optional leading option block.

    # comment
    python train.py --lr 3e-4
    [name=big gpus=2 retries=1 timeout=6h cwd=/data env.SEED=1 metrics=run/m.jsonl] python train.py
    [secrets=WANDB_API_KEY,HF_TOKEN] python train.py   # names of `gpurun secret set` values, never values

Blank lines and ``#`` comments are skipped; CRLF, a UTF-8 BOM and a missing final newline are
fine. Values may be quoted shell-style (``name="my run"``). Each job has a stable id (from its
name, else from its command and options), so submitting the same file twice adds nothing.
Any malformed line raises ``QueueFileError`` naming ``file:line``; nothing is submitted.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import QueueFileError

KEYS = ("name", "gpus", "retries", "timeout", "cwd", "metrics", "checkpoints", "secrets")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)?$", re.I)
UNITS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A line is an option block only when '[' is followed by key=...; "[ -f x ] && cmd" is a command.
BLOCK = re.compile(r"^\[\s*(?:\]|[A-Za-z_][A-Za-z0-9_.]*\s*=)")


@dataclass
class JobSpec:
    command: str
    line: int
    name: str | None = None
    gpus: int | None = None
    retries: int = 0
    timeout_s: float | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    metrics: str | None = None
    checkpoints: str | None = None
    secrets: list[str] | None = None  # None: the host's default; [] (``secrets=``): none

    @property
    def id(self) -> str:
        if self.name:
            key = "name\0" + self.name
        else:
            key = "cmd\0%s\0%s\0%s" % (self.command, self.cwd or "", sorted(self.env.items()))
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    @property
    def display_name(self) -> str:
        return self.name or _short(self.command)


def _short(cmd: str, n: int = 40) -> str:
    flat = " ".join(cmd.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def duration(text: str) -> float:
    m = DURATION.match(text.strip())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * UNITS[(m.group(2) or "").lower() or None]


def _split_block(raw: str, where: str) -> tuple[str, str]:
    """Split ``[options] command`` honouring quotes inside the block."""
    quote = None
    for i, ch in enumerate(raw):
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "]":
            return raw[1:i], raw[i + 1:].strip()
    if quote:
        raise QueueFileError(f"{where}: quote {quote} in the option block is never closed",
                             "close every quote inside [ ... ], e.g. [name=\"my run\"]")
    raise QueueFileError(f"{where}: option block opened with '[' is never closed",
                         "write options as [name=x gpus=1] followed by the command")


WANDB_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
WANDB_REF = re.compile(r"^wandb:(%s)/(%s)/(%s)$" % (WANDB_PART, WANDB_PART, WANDB_PART))
WANDB_URL = re.compile(r"^https?://[^/]+/(%s)/(%s)/runs/(%s)/?(?:[?#].*)?$" % (WANDB_PART, WANDB_PART, WANDB_PART))


def wandb_metrics(val: str, where: str) -> str | None:
    """``metrics=wandb:ENTITY/PROJECT/RUN_ID`` (or the run's page URL): the reference, kept as
    one (never a path); None when ``val`` names a file. A malformed reference is an error."""
    url = WANDB_URL.match(val) if val.startswith(("http://", "https://")) else None
    if url:
        return "wandb:%s/%s/%s" % url.groups()
    if not val.startswith("wandb:"):
        return None
    if WANDB_REF.match(val):
        return val
    raise QueueFileError(f"{where}: metrics={val!r} is not a W&B run reference",
                         "write metrics=wandb:ENTITY/PROJECT/RUN_ID (three parts, as in the run's page "
                         "https://wandb.ai/ENTITY/PROJECT/runs/RUN_ID), or a file path without 'wandb:'")


def _apply(spec: JobSpec, token: str, where: str) -> None:
    if "=" not in token:
        raise QueueFileError(f"{where}: option {token!r} has no value", "write options as key=value, e.g. gpus=1")
    key, val = token.split("=", 1)
    if key.startswith("env."):
        var = key[4:]
        if not ENV_KEY.match(var):
            raise QueueFileError(f"{where}: bad environment variable name {var!r}",
                                 "use letters, digits and '_' (not starting with a digit)")
        spec.env[var] = val
        return
    if key == "secrets":
        names = [n.strip() for n in val.split(",") if n.strip()]
        bad = [n for n in names if not ENV_KEY.match(n)]
        if bad:
            raise QueueFileError(f"{where}: bad secret name {bad[0]!r} in secrets=",
                                 "list secret names separated by commas, each like an environment variable "
                                 "name (letters, digits and '_', not starting with a digit): "
                                 "secrets=WANDB_API_KEY,HF_TOKEN")
        spec.secrets = list(dict.fromkeys(names))
        return
    if key not in KEYS:
        import difflib
        close = difflib.get_close_matches(key, KEYS + ("env.NAME",), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise QueueFileError(f"{where}: unknown option {key!r}",
                             hint + "valid options: " + ", ".join(KEYS) + ", env.NAME")
    ref = wandb_metrics(val, where) if key == "metrics" else None
    if ref:
        spec.metrics = ref
        return
    try:
        if key in ("gpus", "retries"):
            num = int(val)
            if num < 0:
                raise ValueError(val)
            setattr(spec, key, num)
        elif key == "timeout":
            spec.timeout_s = duration(val)
        elif not val:
            raise ValueError(val)
        else:
            setattr(spec, key, val)
    except ValueError:
        form = {"gpus": "a whole number >= 0", "retries": "a whole number >= 0",
                "timeout": "a duration like 90, 90s, 30m, 6h or 2d"}.get(key, "a non-empty value")
        raise QueueFileError(f"{where}: option {key}={val!r} is not valid", f"{key} must be {form}") from None


def parse_line(raw: str, lineno: int, source: str) -> JobSpec | None:
    where = f"{source}:{lineno}"
    text = raw.strip()
    if not text or text.startswith("#"):
        return None
    spec = JobSpec(command="", line=lineno)
    if BLOCK.match(text):
        block, text = _split_block(text, where)
        if "'" in block or '"' in block or "\\" in block:
            try:
                tokens = shlex.split(block)
            except ValueError as exc:
                raise QueueFileError(f"{where}: cannot read option block: {exc}",
                                     "close every quote inside [ ... ]") from None
        else:  # no quote, no escape: shlex.split's answer is a split on its whitespace (a cold-CLI cost)
            tokens = block.replace("\t", " ").replace("\r", " ").replace("\n", " ").split(" ")
            tokens = [t for t in tokens if t]
        for tok in tokens:
            _apply(spec, tok, where)
    if not text:
        raise QueueFileError(f"{where}: option block has no command after it",
                             "put the command on the same line, after ']'")
    spec.command = text
    return spec


def parse_text(text: str, source: str = "<queue>") -> list[JobSpec]:
    if text.startswith("\ufeff"):
        text = text[1:]
    specs = []
    for n, line in enumerate(text.splitlines(), 1):
        if "\0" in line:
            raise QueueFileError(f"{source}:{n}: line contains a NUL byte", "is this a binary file?")
        spec = parse_line(line, n, source)
        if spec is not None:
            specs.append(spec)
    return specs


def parse_file(path: str | Path) -> list[JobSpec]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise QueueFileError(f"{path}: no such queue file", "check the path; a queue file has one command per line")
    except IsADirectoryError:
        raise QueueFileError(f"{path}: is a directory, not a queue file", "pass the file, e.g. examples/queue.txt")
    except OSError as exc:
        raise QueueFileError(f"{path}: cannot read ({exc.strerror})", "check the file's permissions")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise QueueFileError(f"{path}:{line}: not valid UTF-8", "save the queue file as UTF-8") from None
    return parse_text(text, str(path))


def select(specs: list[JobSpec], start: int = 1) -> list[JobSpec]:
    """Jobs from the ``start``-th job on (1-based, counting jobs, not lines)."""
    return specs[start - 1:] if start > 1 else specs
