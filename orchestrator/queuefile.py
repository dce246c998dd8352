"""Queue files: one shell command per line, with an optional leading option block.

    # comment
    python train.py --lr 3e-4
    [name=big gpus=2 retries=1 timeout=6h cwd=/data env.SEED=1 metrics=run/m.jsonl] python train.py
    [secrets=WANDB_API_KEY,HF_TOKEN] python train.py   # names of `gpurun secret set` values, never values
    [partition=gpu account=lab42 qos=short constraint=a100] python train.py   # sbatch's, on a Slurm host

Blank lines and ``#`` comments are skipped; CRLF, a UTF-8 BOM and a missing final newline are
fine. Only ``\\n`` (or ``\\r\\n``) ends a line: form feeds, ``\\x1c``-``\\x1e``, NEL and the
Unicode line separators are characters of the line, so one line is always one job and line
numbers match an editor's. Values may be quoted shell-style (``name="my run"``). Each job has
a stable id (from its name, else from its command and options), so submitting the same file
twice adds nothing. Any malformed line raises ``QueueFileError`` naming ``file:line`` (and the
option); nothing is submitted. The limits (``MAX_*``) are checked here, at submit, so a job
that could never start is refused before it is queued.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import QueueFileError
from orchestrator.inputfile import read_text

KEYS = ("name", "gpus", "retries", "timeout", "cwd", "metrics", "checkpoints", "secrets",
        "partition", "account", "qos", "constraint")
# sbatch's options for one job on a Slurm host (agent/slurm.py); other hosts have no use for them
SLURM_KEYS = ("partition", "account", "qos", "constraint")
SLURM_WORD = re.compile(r"^[A-Za-z0-9_.:,+%=@/|&*-]+$", re.ASCII)
# re.ASCII: int() and float() read full-width and other Unicode digits ("gpus=１" was 1).
DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(s|sec|m|min|h|hr|d)?$", re.I | re.ASCII)
UNITS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OPT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A token pasted where its NAME goes (``secrets=hf_AbC...``): refused without being repeated, since
# a name is stored on the job and shown in status, events and notifications. Known prefixes, an
# AWS key id, or a long run of mixed-case letters and digits (names are words: HF_TOKEN).
_TOKEN = re.compile(r"(?:sk-|sk_live_|rpa_|ghp_|gho_|github_pat_|hf_|glpat-|xox[abp]-)[A-Za-z0-9_-]{12,}"
                    r"|AKIA[0-9A-Z]{16}|(?=[^a-z]*[a-z])(?=[^A-Z]*[A-Z])(?=[^0-9]*[0-9])[A-Za-z0-9_+/=.-]{24,}")
WHOLE = re.compile(r"^[0-9]+$")
# A line is an option block when '[' is followed by a word and '=' (any word: "[env.A-B=1]" and
# "[=x]" must be refused as bad options, not run as commands); "[ -f x ] && cmd" is a command.
BLOCK = re.compile(r"^\[\s*(?:\]|[^\s\]=]*=)")

# Limits. A bigger file or value is a mistake (a binary, a pasted log), never a queue.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_VALUE_CHARS = 4096          # one option value (PATH_MAX); names are shorter still
MAX_NAME_CHARS = 128            # a name is shown in tables and is part of a folder name at home
MAX_GPUS = 64                   # more than any one box has; 10**20 overflowed SQLite's integer
MAX_RETRIES = 100
MAX_TIMEOUT_S = 366 * 86400
# The command reaches the shell as one argv string: Linux refuses any single argument of 128 KiB
# (MAX_ARG_STRLEN, NUL included), and jobwrap prepends a line sourcing the job's env file.
MAX_COMMAND_BYTES = 127 * 1024
# The env.* options of one job, all together: the kernel also caps a command's argv and
# environment together (ARG_MAX, commonly 2 MiB), shared with the host's own environment.
MAX_ENV_BYTES = 256 * 1024


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
    slurm: dict[str, str] = field(default_factory=dict)  # partition=, account=, qos=, constraint=

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


def _show(val: str) -> str:
    """``val`` quoted for a one-line message, cut short when long (a 500 KB value is one line too)."""
    return repr(val) if len(val) <= 60 else f"{val[:40]!r}… ({len(val)} characters)"


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


_PLAIN = re.compile(r"[^ \t\r\n'\"\\]+")
_IN_DOUBLE = re.compile(r"[\"\\]")
_WS = " \t\r\n"


def split_options(block: str, where: str = "<queue>") -> list[str]:
    """The option block's words, by ``shlex.split``'s POSIX rules (quotes join, ``\\`` escapes;
    inside double quotes only ``\\"`` and ``\\\\``), in linear time: shlex grows each word one
    character at a time by string concatenation, so a 500 KB value took seconds."""
    words: list[str] = []
    buf: list[str] = []
    open_word = False  # a word has started (an empty "" is a word too)
    i, n = 0, len(block)
    while i < n:
        ch = block[i]
        if ch in _WS:
            if open_word:
                words.append("".join(buf))
                buf, open_word = [], False
            i += 1
            continue
        open_word = True
        if ch == "'":
            end = block.find("'", i + 1)
            if end < 0:
                raise _unclosed(where)
            buf.append(block[i + 1:end])
            i = end + 1
        elif ch == '"':
            i += 1
            while True:
                m = _IN_DOUBLE.search(block, i)
                if m is None or (m.group() == "\\" and m.start() + 1 >= n):
                    raise _unclosed(where)
                buf.append(block[i:m.start()])
                if m.group() == '"':
                    i = m.end()
                    break
                nxt = block[m.start() + 1]
                buf.append(nxt if nxt in '"\\' else "\\" + nxt)
                i = m.start() + 2
        elif ch == "\\":
            if i + 1 >= n:
                raise QueueFileError(f"{where}: cannot read option block: '\\' at its end escapes nothing",
                                     "remove the trailing backslash, or quote the value")
            buf.append(block[i + 1])
            i += 2
        else:
            m = _PLAIN.match(block, i)
            buf.append(m.group())  # type: ignore[union-attr]  # ch is none of the specials
            i = m.end()  # type: ignore[union-attr]
    if open_word:
        words.append("".join(buf))
    return words


def _unclosed(where: str) -> QueueFileError:
    return QueueFileError(f"{where}: cannot read option block: a quote is never closed",
                          "close every quote inside [ ... ]")


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


_FORMS = {"gpus": "a whole number >= 0", "retries": "a whole number >= 0",
          "timeout": "a duration like 90, 90s, 30m, 6h or 2d",
          **{k: "a Slurm name like gpu or a100 (letters, digits, . _ - : , + % = @ / | & *)"
             for k in SLURM_KEYS}}


def _bad_value(key: str, val: str, where: str, why: str = "is not valid", limit: str = "") -> QueueFileError:
    hint = f"{key} must be {_FORMS.get(key, 'a non-empty value')}"
    if not val.isascii() and any(c.isdigit() for c in val):
        hint += " in ASCII digits 0-9"  # "１" (full width) looks like a number and is not one here
    return QueueFileError(f"{where}: option {key}={_show(val)} {why}", hint + (f", at most {limit}" if limit else ""))


def _whole(key: str, val: str, limit: int, where: str) -> int:
    if not WHOLE.match(val):
        raise _bad_value(key, val, where)
    if len(val) > 6 or int(val) > limit:  # no int() of a 4000-digit string
        raise _bad_value(key, val, where, f"is above the limit {limit}", str(limit))
    return int(val)


def _apply(spec: JobSpec, token: str, where: str, seen: set[str]) -> None:
    if "=" not in token:
        raise QueueFileError(f"{where}: option {_show(token)} has no value", "write options as key=value, e.g. gpus=1")
    key, val = token.split("=", 1)
    if key in seen:
        raise QueueFileError(f"{where}: option {key!r} is given twice",
                             f"keep one {key}= in the option block (the second would silently win)")
    seen.add(key)
    if len(val) > MAX_VALUE_CHARS:
        raise QueueFileError(f"{where}: option {key}= is {len(val)} characters long",
                             f"an option value is at most {MAX_VALUE_CHARS} characters")
    if key.startswith("env."):
        var = key[4:]
        if not ENV_KEY.match(var):
            raise QueueFileError(f"{where}: bad environment variable name {var!r} in option {key!r}",
                                 "use letters, digits and '_' (not starting with a digit): env.MY_VAR=1")
        spec.env[var] = val
        return
    if not OPT_KEY.match(key):
        if not key:
            raise QueueFileError(f"{where}: option {_show(token)} has no name before '='",
                                 "write options as key=value, e.g. name=x; valid keys: " + ", ".join(KEYS))
        raise QueueFileError(f"{where}: bad option name {key!r}",
                             "an option is key=value with a key among " + ", ".join(KEYS) + ", env.NAME")
    if key == "secrets":
        names = [n.strip() for n in val.split(",") if n.strip()]
        for i, name in enumerate(names, 1):
            if _TOKEN.fullmatch(name):
                raise QueueFileError(f"{where}: secrets= entry {i} looks like a secret value, not its NAME "
                                     "(not shown)", "store the value once with `gpurun secret set NAME` "
                                     "(from $NAME or a hidden prompt), then write secrets=NAME")
        bad = [n for n in names if not ENV_KEY.match(n)]
        if bad:
            raise QueueFileError(f"{where}: bad secret name {_show(bad[0])} in secrets=",
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
    if key in SLURM_KEYS:
        if not SLURM_WORD.match(val):
            raise _bad_value(key, val, where, "is not a Slurm name")
        spec.slurm[key] = val
        return
    ref = wandb_metrics(val, where) if key == "metrics" else None
    if ref:
        spec.metrics = ref
        return
    if key == "gpus":
        spec.gpus = _whole(key, val, MAX_GPUS, where)
    elif key == "retries":
        spec.retries = _whole(key, val, MAX_RETRIES, where)
    elif key == "timeout":
        try:
            seconds = duration(val)
        except ValueError:
            raise _bad_value(key, val, where) from None
        if seconds > MAX_TIMEOUT_S:
            raise _bad_value(key, val, where, f"is above the limit {MAX_TIMEOUT_S // 86400}d",
                             f"{MAX_TIMEOUT_S // 86400}d")
        spec.timeout_s = seconds
    elif not val:
        raise _bad_value(key, val, where)
    elif key == "name" and len(val) > MAX_NAME_CHARS:
        raise QueueFileError(f"{where}: option name= is {len(val)} characters long",
                             f"a job name is at most {MAX_NAME_CHARS} characters")
    else:
        setattr(spec, key, val)


def parse_line(raw: str, lineno: int, source: str) -> JobSpec | None:
    where = f"{source}:{lineno}"
    text = raw.strip()
    if not text or text.startswith("#"):
        return None
    spec = JobSpec(command="", line=lineno)
    if BLOCK.match(text):
        block, text = _split_block(text, where)
        seen: set[str] = set()
        for tok in split_options(block, where):
            _apply(spec, tok, where, seen)
        env_bytes = sum(len(k.encode()) + len(v.encode("utf-8", "surrogatepass")) + 2 for k, v in spec.env.items())
        if env_bytes > MAX_ENV_BYTES:
            raise QueueFileError(f"{where}: the env.* options add up to {env_bytes} bytes",
                                 f"a job's env.* options are at most {MAX_ENV_BYTES} bytes together "
                                 "(the kernel limits a command and its environment); put large settings in a file")
    if not text:
        raise QueueFileError(f"{where}: option block has no command after it",
                             "put the command on the same line, after ']'")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        raise QueueFileError(f"{where}: the command is {size} bytes long",
                             f"a command is at most {MAX_COMMAND_BYTES} bytes (the kernel refuses longer "
                             "arguments); put it in a script and run the script")
    spec.command = text
    return spec


def parse_text(text: str, source: str = "<queue>") -> list[JobSpec]:
    if text.startswith("\ufeff"):
        text = text[1:]
    specs = []
    # Not str.splitlines(): it also breaks at \f, \v, \x1c-\x1e, \x85, U+2028/9, which made one
    # line two jobs and every later line number wrong. A lone \r is kept (CRLF is one end).
    for n, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        if "\0" in line:
            raise QueueFileError(f"{source}:{n}: line contains a NUL byte", "is this a binary file?")
        spec = parse_line(line, n, source)
        if spec is not None:
            specs.append(spec)
    return specs


def parse_file(path: str | Path) -> list[JobSpec]:
    try:
        text = read_text(path, MAX_FILE_BYTES, error=QueueFileError, what="queue file")
    except FileNotFoundError:
        raise QueueFileError(f"{path}: no such queue file",
                             "check the path; a queue file has one command per line") from None
    except IsADirectoryError:
        raise QueueFileError(f"{path}: is a directory, not a queue file",
                             "pass the file, e.g. examples/queue.txt") from None
    return parse_text(text, str(path))


def select(specs: list[JobSpec], start: int = 1) -> list[JobSpec]:
    """Jobs from the ``start``-th job on (1-based, counting jobs, not lines)."""
    return specs[start - 1:] if start > 1 else specs
