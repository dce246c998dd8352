"""The provider-profile schema and its hand-written validator.

Owns the shape of a profile (``SCHEMA``), the YAML-node line map used to name FILE:LINE in
errors, and the checks no type system can express (secret-looking keys, state-dir tier).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.errors import ProfileError
from orchestrator.health.watchdog import ACTIONS, HOST_CODES, JOB_CODES

# --- the schema DSL ----------------------------------------------------------------------


@dataclass(frozen=True)
class T:
    """One value spec. ``kind``: str|int|num|bool|list|map|obj. ``fields`` for obj,
    ``item`` for list/map values, ``choices`` for enums, ``check`` a predicate + message,
    ``open`` for an obj that lets keys it does not list through (config.yaml's ``pull``: ``core/pull``
    refuses those not in its ``PULL_KEYS``)."""

    kind: str
    required: bool = False
    nullable: bool = False
    choices: tuple = ()
    item: "T | None" = None
    fields: dict = field(default_factory=dict)
    minimum: float | None = None
    maximum: float | None = None
    check: tuple[Callable[[Any], bool], str] | None = None
    open: bool = False


def Str(**kw: Any) -> T: return T("str", **kw)
def Int(**kw: Any) -> T: return T("int", **kw)
def Num(**kw: Any) -> T: return T("num", **kw)
def Bool(**kw: Any) -> T: return T("bool", **kw)
def List(item: T, **kw: Any) -> T: return T("list", item=item, **kw)
def Map(item: T, **kw: Any) -> T: return T("map", item=item, **kw)
def Obj(fields: dict, **kw: Any) -> T: return T("obj", fields=fields, **kw)


_ENV_NAME = (lambda v: re.fullmatch(r"[A-Z_][A-Z0-9_]*", v) is not None,
             "an environment variable NAME such as RUNPOD_API_KEY")
_SECRET_NAME = (lambda v: re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) is not None,
                "a secret NAME such as WANDB_API_KEY (letters, digits and '_')")
_URL = (lambda v: re.match(r"https?://[^\s]+$", v) is not None, "an http(s):// URL")
_NONEMPTY = (lambda v: bool(v.strip()), "non-empty text")
_MONTH = (lambda v: re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])(-\d\d)?", v) is not None,
          "a date like 2026-06")

# Taken from orchestrator/health/watchdog.py, the consumer on the host, so the two cannot drift.
POLICY_ACTIONS, JOB_EVENTS, HOST_EVENTS = ACTIONS, JOB_CODES, HOST_CODES

HOW = Obj({"command": Str(nullable=True), "api": Str(nullable=True),
           "console": Str(nullable=True)}, required=True)
VERB = Obj({"name": Str(required=True), "description": Str(required=True),
            "irreversible": Bool(required=True), "how": HOW}, required=True)

_SBATCH_WORD = (lambda v: re.fullmatch(r"[A-Za-z0-9_.:,+%=@/-]+", v) is not None,
                "letters, digits and . _ - : , + % = @ / (no spaces or quotes)")
_SBATCH_OPT = (lambda v: re.fullmatch(r"--[a-z][a-z-]*(=[^\s'\"\\]+)?", v) is not None,
               "one sbatch long option like --mem=32G (no spaces or quotes)")
SLURM = Obj({"partition": Str(nullable=True, check=_SBATCH_WORD), "account": Str(nullable=True, check=_SBATCH_WORD),
             "qos": Str(nullable=True, check=_SBATCH_WORD), "constraint": Str(nullable=True, check=_SBATCH_WORD),
             "time_default": Str(nullable=True, check=_NONEMPTY), "gres": Str(nullable=True, check=_SBATCH_WORD),
             "extra": List(Str(check=_SBATCH_OPT))})

SCHEMA = Obj({
    "name": Str(required=True),
    "description": Str(required=True),
    "kind": Str(required=True, choices=("local", "ssh", "ssh-rental", "cloud-api", "slurm")),
    "extends": Str(),
    "sources": List(Str(), required=True),
    "checked": Str(required=True, check=_MONTH),
    "ssh": Obj({
        "user": Str(nullable=True), "port": Int(nullable=True, minimum=1, maximum=65535),
        "form": Str(required=True), "scp_works": Bool(), "port_changes": Str(nullable=True),
        "note": Str(),
    }, nullable=True, required=True),
    "paths": Obj({
        "workdir": Str(required=True), "state_dir": Str(required=True),
        "cache_dir": Str(required=True), "durable_dir": Str(nullable=True),
    }, required=True),
    "storage": List(Obj({
        "name": Str(required=True), "path": Str(required=True),
        "survives_stop": Bool(required=True), "survives_destroy": Bool(required=True),
        "network_fs": Bool(required=True), "note": Str(),
    }), required=True),
    "meter_stop": VERB,
    "destroy": VERB,
    "billing": Obj({"when_stopped": List(Str(), required=True), "traps": List(Str())},
                   required=True),
    "danger_clocks": List(Obj({"name": Str(required=True), "after": Str(required=True),
                               "what": Str(required=True)}), required=True),
    "spot": Obj({"available": Bool(required=True), "grace_s": Num(nullable=True, minimum=0),
                 "signal": Str(nullable=True)}, required=True),
    "detach": Str(required=True, choices=("setsid", "tmux")),
    "boot_hook": Str(required=True, choices=("none", "cron_reboot", "vast_onstart",
                                             "systemd_user")),
    "network": Obj({"proxy_hook": Str(nullable=True), "env": Map(Str()),
                    "note": Str()}, required=True),
    # Optional keys are read by the provider clients (orchestrator/providers/*.py ``extras``).
    "api": Obj({"base_url": Str(required=True, check=_URL),
                "credential_env": Str(required=True, check=_ENV_NAME),
                "auth": Str(required=True, choices=("bearer", "basic", "raw-header")),
                "note": Str(),
                "timeout_s": Num(minimum=1, maximum=3600),
                "poll_interval_s": Num(minimum=0.01, maximum=3600),
                "ssh_key_name": Str(check=_NONEMPTY),            # Lambda: the registered key to launch with
                "ssh_port": Int(minimum=1, maximum=65535),       # Lambda: non-standard SSH port
                "image": Str(check=_NONEMPTY),                   # default container/OS image
                "regions": List(Str(check=_NONEMPTY)),           # AutoDL: data centers to look in
                "prices": Map(Num(minimum=0)),                   # AutoDL: GPU name -> price per GPU-hour
                "gpu_specs": Map(Str(check=_NONEMPTY)),          # AutoDL: GPU name -> gpu_spec_uuid
                "cuda_v_from": Int(minimum=0)},                  # AutoDL: lowest CUDA version (118 = 11.8)
               nullable=True, required=True),
    "watchdog": Obj({
        "interval_s": Num(required=True, minimum=1),
        "stall_after_s": Num(required=True, minimum=1),
        "no_gpu_grace_s": Num(required=True, minimum=1),
        "idle_util_pct": Num(required=True, minimum=0.01, maximum=100),
        "cgroup_mem_pct": Num(required=True, minimum=1, maximum=100),
        "disk_pct": Num(required=True, minimum=1, maximum=100),
        "inode_pct": Num(required=True, minimum=1, maximum=100),
        "paths": List(Str()), "device_glob": List(Str()),
        "policy": Obj({**{e: Str(choices=POLICY_ACTIONS) for e in JOB_EVENTS},
                       **{e: Str(choices=("record", "notify")) for e in HOST_EVENTS}},
                      required=True),
    }, required=True),
    "reap": Obj({"min_age_s": Num(required=True, minimum=0), "auto": Bool(), "grace_s": Num(minimum=0)},
                required=True),
    "quality": Obj({"action": Str(required=True, choices=("alert", "stop", "ignore")),
                    "intervals_s": List(Num(minimum=1)), "first_check_s": Num(minimum=0.5), "scan_s": Num(minimum=0.5),
                    "primary": Str(), "lr_schedule": Str(),
                    "loss_bounded_below": Bool(), "reviewer_command": Str(), "reviewer_timeout_s": Num(minimum=1),
                    "gate_reviewer": Bool(), "baseline": Map(Num()),
                    # an OpenAI-compatible chat endpoint asked on ambiguous verdicts (quality/reviewer.py);
                    # key_env names the secret (gpurun secret set NAME) or env var: never the key itself
                    "reviewer": Obj({"base_url": Str(required=True, check=_URL),
                                     "model": Str(required=True, check=_NONEMPTY),
                                     "key_env": Str(check=_ENV_NAME), "timeout_s": Num(minimum=1, maximum=600)})},
                   required=True),
    "recovery": Obj({"on_preempt": Str(required=True, choices=("wait", "restart", "replace"))},
                    required=True),
    "notify": List(Obj({"kind": Str(required=True, choices=("generic", "slack", "feishu", "dingtalk", "wecom")),
                        "url_env": Str(required=True), "min_severity": Str(choices=("info", "warn", "error",
                                                                                     "critical")),
                        "secret_env": Str()})),
    "autostop": Obj({"enabled": Bool(required=True), "idle_minutes": Num(minimum=0),
                     "util_threshold": Num(minimum=0), "check_interval_s": Num(minimum=1),
                     "command": Str(), "irreversible": Bool(), "allow_irreversible": Bool(),
                     "require_verified_pull": Bool()}, required=True),
    # The agent daemon itself. idle_exit_minutes: with nothing queued or running and no gpurun
    # command for this long, the daemon exits (the next command starts it again). 30 on
    # `local`, so a demo leaves nothing behind; absent/0 (never) on remote profiles, whose
    # watchdog and autostop must keep running on an idle box.
    "agent": Obj({"idle_exit_minutes": Num(minimum=0, nullable=True)}),
    # Secret NAMES (`gpurun secret set NAME --host H`) every job on hosts of this profile gets
    # in its environment unless its queue line says `secrets=`: names only, never values.
    "secrets": List(Str(check=_SECRET_NAME)),
    # A Slurm cluster (kind: slurm): what every sbatch asks for (agent/slurm.py). A host entry's
    # `slurm:` keys win over these, a queue line's partition=/account=/qos=/constraint= over both.
    "slurm": SLURM,
})

# A key NAME that holds a secret value rather than the name of an env var holding it.
_SECRET_KEY = re.compile(
    r"(?i)(^|[_-])(api[_-]?key|apikey|token|secret|password|passwd|private[_-]?key|"
    r"access[_-]?key|credentials?|auth[_-]?token)$")
# Values that look like a pasted credential, whatever key they sit under.
_SECRET_VALUE = re.compile(
    r"^(sk-[A-Za-z0-9]{16,}|rpa_[A-Za-z0-9]{16,}|ghp_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}|"
    r"AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----.*)", re.S)

SECRET_HINT = ("profiles never hold secret values: put the NAME of an environment variable "
               "under api.credential_env and export the secret in your shell")


# --- line marks --------------------------------------------------------------------------

# More keys and items than any real file has: YAML aliases can make a 1 KiB file repeat one
# block a billion times ("billion laughs"), and this walk (then the validator's) would follow.
MAX_MARKS = 100_000


def node_marks(node: Any, source: str, path: tuple = (), out: dict | None = None) -> dict:
    """Map every key path (tuple of keys / list indexes) to ``(source, 1-based line)``.
    ValueError past ``MAX_MARKS`` of them."""
    import yaml

    out = {} if out is None else out
    if len(out) > MAX_MARKS:
        raise ValueError(f"more than {MAX_MARKS} keys and items (aliases repeating a block?)")
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            p = path + (key_node.value,)
            out[p] = (source, key_node.start_mark.line + 1)
            node_marks(value_node, source, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = (source, item.start_mark.line + 1)
            node_marks(item, source, path + (i,), out)
    return out


def dotted(path: tuple) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (("." if s else "") + str(p))
    return s or "(top level)"


# --- validator ---------------------------------------------------------------------------

# Numbers without a maximum of their own stay within this: YAML reads `.nan`, `.inf` and 1e400
# (inf), and a watchdog interval of NaN or 1e300 s would stop it forever or overflow a sleep.
NUM_LIMIT = 1e9


class Validator:
    """Checks one document against ``SCHEMA``; ``partial`` skips required-key checks (for
    override files that only change a few keys). Subclasses check other files with the same
    rules: ``error`` is what they raise, ``document`` names what an empty file should be."""

    error: type[Exception] = ProfileError
    document = "a profile"
    secret_hint = SECRET_HINT

    def __init__(self, source: str, marks: dict, partial: bool = False):
        self.source, self.marks, self.partial = source, marks, partial

    def where(self, path: tuple) -> str:
        """``file:line`` of the nearest key on ``path`` that some file set."""
        while path:
            if path in self.marks:
                src, line = self.marks[path]
                return f"{src}:{line}"
            path = path[:-1]
        # A key missing at the top level: point at the document's start.
        return f"{self.source}:1" if self.source.endswith((".yaml", ".yml")) else self.source

    def fail(self, path: tuple, msg: str, hint: str) -> None:
        raise self.error(f"{self.where(path)}: key '{dotted(path)}': {msg}", hint)

    def validate(self, data: Any, spec: T = SCHEMA, path: tuple = ()) -> None:
        if data is None:
            if not path:
                self.fail(path, "the file is empty", f"{self.document} is a YAML mapping of keys")
            if not spec.nullable:
                self.fail(path, "must not be empty", _expect(spec))
            return
        k = spec.kind
        if k == "obj":
            self._obj(data, spec, path)
        elif k in ("list", "map"):
            ok = isinstance(data, list) if k == "list" else isinstance(data, dict)
            if not ok:
                self.fail(path, f"expected {_expect(spec)}, got {_show(data)}", _expect(spec))
            items = enumerate(data) if k == "list" else data.items()
            for key, v in items:
                if k == "map":
                    self._check_secret_key(str(key), path + (key,), v)
                self.validate(v, spec.item, path + (key,))
        else:
            self._scalar(data, spec, path)

    def _obj(self, data: Any, spec: T, path: tuple) -> None:
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping of keys, got {_show(data)}",
                      "indent the keys below it, one per line")
        for key, value in data.items():
            skey = str(key)
            self._check_secret_key(skey, path + (skey,), value)
            if skey not in spec.fields:
                if spec.open:
                    continue
                near = difflib.get_close_matches(skey, list(spec.fields), n=1, cutoff=0.6)
                hint = (f"did you mean '{near[0]}'?" if near else
                        "known keys here: " + ", ".join(sorted(spec.fields)))
                self.fail(path + (skey,), "unknown key", hint)
            self.validate(value, spec.fields[skey], path + (skey,))
        if not self.partial:
            for name, sub in spec.fields.items():
                if sub.required and name not in data:
                    self.fail(path + (name,) if path else (name,), "missing required key",
                              f"add '{name}:' ({_expect(sub)})"
                              + (f" under '{dotted(path)}'" if path else ""))

    def _scalar(self, v: Any, spec: T, path: tuple) -> None:
        k = spec.kind
        ok = {"str": isinstance(v, str),
              "int": isinstance(v, int) and not isinstance(v, bool),
              "num": isinstance(v, (int, float)) and not isinstance(v, bool),
              "bool": isinstance(v, bool)}[k]
        if not ok:
            self.fail(path, f"expected {_expect(spec)}, got {_show(v)}", _expect(spec)
                      + (" (quote it if it is text)" if k == "str" else ""))
        if k in ("int", "num"):
            self._finite(v, spec, path)
        if k == "str" and _SECRET_VALUE.match(v.strip()):  # first: no message below may echo it
            self.fail(path, "the value looks like a secret (a key or token)", self.secret_hint)
        if spec.choices and v not in spec.choices:
            near = difflib.get_close_matches(str(v), [str(c) for c in spec.choices], n=1)
            self.fail(path, f"{v!r} is not one of {', '.join(spec.choices)}",
                      f"did you mean '{near[0]}'?" if near else "pick one of the listed values")
        if spec.minimum is not None and v < spec.minimum:
            self.fail(path, f"{v} is below the minimum {spec.minimum:g}", _expect(spec))
        if spec.maximum is not None and v > spec.maximum:
            self.fail(path, f"{v} is above the maximum {spec.maximum:g}", _expect(spec))
        if spec.check and not spec.check[0](v):
            # a key that names an environment variable (``*_env``) but holds something else most
            # likely holds the secret itself (a key has no fixed shape): never echo that one
            shown = "the value (not shown)" if path and str(path[-1]).endswith("_env") else repr(v)
            self.fail(path, f"{shown} is not {spec.check[1]}", f"write {spec.check[1]}")

    def _finite(self, v: Any, spec: T, path: tuple) -> None:
        # NaN compares false with every bound, so it passed minimum/maximum; inf passed minimum.
        if isinstance(v, float) and not math.isfinite(v):
            self.fail(path, f"{v} is not a finite number", _expect(spec) + " (not .nan or .inf)")
        if spec.maximum is None and abs(v) > NUM_LIMIT:
            # no repr() of an int of 5000 digits: Python refuses to make one
            shown = f"{v:g}" if isinstance(v, float) else (str(v) if abs(v) < 10 ** 40 else "a number of 40+ digits")
            self.fail(path, f"{shown} is too large (at most {NUM_LIMIT:g})", _expect(spec))

    def _check_secret_key(self, key: str, path: tuple, value: Any) -> None:
        if _SECRET_KEY.search(key) and value not in (None, ""):
            self.fail(path, "looks like a secret value", self.secret_hint)


def _expect(spec: T) -> str:
    base = {"str": "text", "int": "a whole number", "num": "a number",
            "bool": "true or false", "list": "a list (- item per line)",
            "map": "a mapping of NAME: value", "obj": "a mapping of keys"}[spec.kind]
    if spec.choices:
        base = "one of " + ", ".join(spec.choices)
    if spec.minimum is not None or spec.maximum is not None:
        lo = "" if spec.minimum is None else f" >= {spec.minimum:g}"
        hi = "" if spec.maximum is None else f" <= {spec.maximum:g}"
        base += lo + (" and" if lo and hi else "") + hi
    return base + (" or null" if spec.nullable else "")


def _show(v: Any) -> str:
    name = {bool: "a boolean", int: "a number", float: "a number", str: "text",
            list: "a list", dict: "a mapping"}.get(type(v), type(v).__name__)
    text = repr(v)
    return f"{name} {text[:40]}" if not isinstance(v, (list, dict)) else name


# --- cross-field rules -------------------------------------------------------------------

def tier_for(path: str, tiers: list[dict]) -> dict | None:
    """The storage tier holding ``path``: the longest tier path that is a prefix of it.
    ``~`` and ``{data_home}`` paths live under the ``~`` tier if one is declared, else ``/``."""
    def parts(p: str) -> list[str]:
        return [x for x in p.strip().split("/") if x]

    best, best_len = None, -1
    for tier in tiers:
        tp = tier["path"].rstrip("/") or "/"
        if tp == "/":
            match, n = True, 0
        elif path.startswith("{data_home}"):
            match, n = tp == "~", 1
        else:
            tparts, pparts = parts(tp), parts(path)
            match, n = pparts[:len(tparts)] == tparts, len(tparts)
            if not match and path.startswith("~") and tp == "~":
                match, n = True, 1
        if match and n > best_len:
            best, best_len = tier, n
    return best


def check_state_dir(data: dict, v: Validator) -> None:
    """The agent's SQLite must survive a stop and must not sit on a network filesystem (but
    on a Slurm cluster's shared home, opened from one login node only)."""
    sd = data["paths"]["state_dir"]
    tier = tier_for(sd, data["storage"])
    p = ("paths", "state_dir")
    if tier is None:
        v.fail(p, f"{sd} is on no declared storage tier", "add a tier to 'storage:' holding it")
    # A Slurm host's store is opened only by the verb processes of one login node (no daemon,
    # and the compute nodes write run-dir files only), so no lock is shared between hosts; its
    # run dirs must be on the shared filesystem the compute nodes write.
    if tier["network_fs"] and data.get("kind") != "slurm":
        v.fail(p, f"{sd} is on tier '{tier['name']}', a network filesystem where SQLite "
               "locking breaks", "put state_dir on a local disk tier that survives stop")
    if not tier["survives_stop"]:
        v.fail(p, f"{sd} is on tier '{tier['name']}', which is wiped on stop",
               "put state_dir on a tier with survives_stop: true")
