"""The host inventory: ``$XDG_DATA_HOME/gpurun/hosts.json``, and what an SSH target may be.

The host ``local`` always exists (this machine, profile ``local``) and is the default. Writes
go through a temp file and a rename under an flock, so two CLIs never half-write the file.

Every read checks the file once, here (``ENTRY``: the shape of one host): a file that is not
UTF-8 JSON, has the wrong shape, misses a key or holds an SSH target ssh could misread is one
``HostError`` naming file, line and key, on every command, never a traceback further on. A
write never replaces a file it could not read (it used to start again from ``{}``, dropping
every host). SSH users, host names and ports are checked at ``host add`` and on every read
(``ssh_problem``): they end up in an ``ssh`` / ``rsync`` argv, where a host name starting
with ``-`` is an option, and a control character or a full-width digit is never meant.

This module is read on every command and by shell completion, so it stays light: its checks
are a small table, not the profile schema (that import costs about 10 ms a command).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Callable

from orchestrator import paths
from orchestrator.errors import HostError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# user@host:port; the parts are checked by ssh_problem (which names a bad character)
SSH_RE = re.compile(r"^(?:(?P<user>[^@]*)@)?(?P<host>\[[^\]]*\]|[^:@\[\]]*)(?::(?P<port>[^:]*))?$")
_WORD = re.compile(r"^[A-Za-z0-9._-]+$")
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+$")
_PORT = re.compile(r"^[0-9]{1,5}$")          # ASCII only: int() reads "２２" as 22
MAX_INVENTORY_BYTES = 4 * 1024 * 1024
FORM = "user@host:port, e.g. root@1.2.3.4:22022 (letters, digits, '.', '_' and '-')"


def _file() -> str:
    return str(paths.data_home() / "hosts.json")


def local_entry(overrides: dict | None = None) -> dict:
    entry = {"name": "local", "profile": "local", "kind": "local",
             "state_dir": str(paths.local_state_dir("local")), "workdir": None, "slots": 1}
    if overrides:
        entry.update({k: v for k, v in overrides.items() if k in ("slots", "expect_gpus", "gpus", "notify", "secrets")})
    return entry


# --- what an SSH target may be ------------------------------------------------------------

def _char(ch: str) -> str:
    import unicodedata

    name = unicodedata.name(ch, "")
    return f"{ch!r} (U+{ord(ch):04X}{' ' + name if name else ''})"


def ssh_problem(word: Any, what: str) -> str | None:
    """Why ``word`` cannot be an SSH ``what`` (``user``, ``host``, ``port``), naming the
    offending character; None when it can. A host may be an IPv6 literal."""
    if what == "port":
        if isinstance(word, int) and not isinstance(word, bool):
            return None if 0 < word < 65536 else f"port {word} is out of range (1 to 65535)"
        if not isinstance(word, str) or not _PORT.match(word):
            bad = next((c for c in str(word) if not ("0" <= c <= "9")), None)
            return (f"port {word!r} is not a number" + (f": it has {_char(bad)}" if bad else "")
                    + " (ASCII digits 0-9 only)")
        return None if 0 < int(word) < 65536 else f"port {int(word)} is out of range (1 to 65535)"
    if not isinstance(word, str) or not word:
        return f"the {what} is empty"
    if word.startswith("-"):
        return f"the {what} {word!r} begins with '-' (ssh would read it as an option)"
    if what == "host" and ":" in word and _IPV6.match(word):
        return None
    if not _WORD.match(word):
        bad = next(c for c in word if not _WORD.match(c))
        return f"the {what} {word!r} has the character {_char(bad)}"
    return None


def parse_ssh(spec: str) -> dict:
    """``user@host:port`` (user and port optional) or an ``~/.ssh/config`` alias. Raises
    HostError naming the part (and the character) ssh could not be given."""
    m = SSH_RE.match(spec.strip(" \t\r\n"))  # not str.strip(): it would drop \x1c-\x1f and U+0085 too
    if not m:
        raise HostError(f"cannot read SSH target {spec!r}", "write it as " + FORM)
    host = m.group("host")
    bare = host[1:-1] if host.startswith("[") else host
    if host.startswith("[") and not (bare and ":" in bare and _IPV6.match(bare)):
        raise HostError(f"cannot read SSH target {spec!r}: {host!r} is not an IPv6 address",
                        "write an IPv6 host as [2001:db8::1]:22")
    for part, what in ((m.group("user"), "user"), (bare, "host"), (m.group("port"), "port")):
        problem = None if part is None else ssh_problem(part, what)
        if problem:
            raise HostError(f"SSH target {spec!r}: {problem}", "write it as " + FORM)
    port = int(m.group("port")) if m.group("port") else None
    return {"user": m.group("user"), "hostname": bare, "port": port}


def jump_problem(spec: Any) -> str | None:
    """Why a ProxyJump value (``user@host:port[,...]``) cannot be used; None when it can."""
    if not isinstance(spec, str):
        return "must be text (user@host:port, comma-separated for several hops)"
    for hop in spec.split(","):
        try:
            parse_ssh(hop)
        except HostError as exc:
            return exc.message
    return None


# --- the file's shape ---------------------------------------------------------------------

def _opt(kind: type | tuple, what: str, check: Callable[[Any], str | None] | None = None) -> tuple:
    return (kind, what, check)


def _min1(v: Any) -> str | None:
    return None if v >= 1 else f"{v} is below 1"


def _gpu_count(v: Any) -> str | None:
    return None if 0 <= v <= 64 else f"{v} is not between 0 and 64"


_TEXT = (str, type(None))
# key -> (types, what the key holds, extra check). Keys not listed are kept as they are:
# a newer gpurun may add some, and an older one must not refuse its inventory.
SSH_FIELDS: dict[str, tuple] = {
    "user": _opt(_TEXT, "text or null", lambda v: ssh_problem(v, "user")),
    "hostname": _opt(_TEXT, "text or null", lambda v: ssh_problem(v, "host")),
    "alias": _opt(_TEXT, "text or null", lambda v: ssh_problem(v, "host")),
    "port": _opt((int, type(None)), "a whole number from 1 to 65535, or null", lambda v: ssh_problem(v, "port")),
    "key": _opt(_TEXT, "a file path or null"),
    "proxy_jump": _opt(_TEXT, "user@host:port or null", jump_problem),
}
ENTRY: dict[str, tuple] = {
    "name": _opt(str, "the host's name"),
    "kind": _opt(str, "local or ssh", lambda v: None if v in ("local", "ssh") else f"{v!r} is not local or ssh"),
    "profile": _opt(_TEXT, "a profile name or null"),
    "ssh": _opt((dict, type(None)), "a mapping {user, hostname, port, ...} or null"),
    "python": _opt(_TEXT, "text or null"),
    "state_dir": _opt(_TEXT, "a path or null"),
    "workdir": _opt(_TEXT, "a path or null"),
    "slots": _opt((int, type(None)), "a whole number >= 1 or null", _min1),
    "expect_gpus": _opt((int, type(None)), "a whole number from 0 to 64, or null", _gpu_count),
    "insecure_host_key": _opt((bool, type(None)), "true or false"),
    "instance": _opt((dict, type(None)), "a mapping or null"),
    "secrets": _opt((list, type(None)), "a list of names or null"),
    # a Slurm host's own sbatch defaults (partition, account, ...), over its profile's `slurm:`
    "slurm": _opt((dict, type(None)), "a mapping {partition, account, qos, constraint, ...} or null"),
}


def _fail(src: str, text: str, key: tuple, msg: str, hint: str) -> HostError:
    dotted = ".".join(str(k) for k in key) or "(top level)"
    return HostError(f"{src}{_line_of(text, key)}: key '{dotted}': {msg}", hint)


def _line_of(text: str, key: tuple) -> str:
    """``:LINE`` of ``key`` in the JSON ``text`` (read as YAML, whose parser keeps lines;
    JSON is YAML), or "" when unknown. Only on the error path: it imports yaml."""
    try:
        import yaml

        from orchestrator.profile_schema import node_marks

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
        try:
            marks = node_marks(loader.get_single_node(), "")
        finally:
            loader.dispose()
        while key and key not in marks:
            key = key[:-1]
        return f":{marks[key][1]}" if key else ""
    except Exception:  # noqa: BLE001 - the line is a courtesy; the key is named anyway
        return ""


def _is(v: Any, kind: type | tuple) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)


def _check_fields(obj: dict, fields: dict, key: tuple, src: str, text: str, hint: str) -> None:
    for name, (kind, what, check) in fields.items():
        if name not in obj:
            continue
        v = obj[name]
        if not _is(v, kind):
            shown = type(v).__name__ if isinstance(v, (dict, list)) else repr(v)[:40]
            raise _fail(src, text, key + (name,), f"expected {what}, got {shown}", hint)
        problem = check(v) if (check and v is not None) else None
        if problem:
            raise _fail(src, text, key + (name,), problem, hint)


_FIX = "fix hosts.json by hand, or move it away and `gpurun host add` the hosts again"
_FIX_SSH = "an SSH target is " + FORM + "; " + _FIX


def check_inventory(data: Any, src: str, text: str = "") -> dict[str, dict]:
    """The ``hosts`` mapping of a parsed hosts.json, each entry checked; HostError otherwise."""
    if not isinstance(data, dict):
        raise _fail(src, text, (), f"expected a mapping {{\"hosts\": {{...}}}}, got {type(data).__name__}", _FIX)
    hosts = data.get("hosts", {})
    if not isinstance(hosts, dict):
        raise _fail(src, text, ("hosts",), f"expected a mapping of host name -> entry, got {type(hosts).__name__}",
                    _FIX)
    for name, entry in hosts.items():
        key = ("hosts", name)
        if not isinstance(entry, dict):
            raise _fail(src, text, key, f"expected a mapping of keys, got {repr(entry)[:40]}", _FIX)
        if not NAME_RE.match(name):
            raise _fail(src, text, key, f"invalid host name {name!r}", "use letters, digits, '.', '_' or '-' (max 63)")
        if "name" not in entry:
            raise _fail(src, text, key, "missing required key 'name'", f'add "name": "{name}"')
        _check_fields(entry, ENTRY, key, src, text, _FIX)
        if entry["name"] != name:
            raise _fail(src, text, key + ("name",), f"{entry['name']!r} differs from the entry's key {name!r}",
                        "make them equal")
        ssh = entry.get("ssh")
        if entry.get("kind", "local") == "ssh" and name != "local":
            if not isinstance(ssh, dict) or not (ssh.get("hostname") or ssh.get("alias")):
                raise _fail(src, text, key + ("ssh",), "an ssh host needs ssh.hostname or ssh.alias", _FIX_SSH)
        if isinstance(ssh, dict):
            _check_fields(ssh, SSH_FIELDS, key + ("ssh",), src, text, _FIX_SSH)
    return hosts


def _read_file() -> dict:
    """hosts.json parsed and checked; ``{"hosts": {}}`` when absent."""
    from orchestrator.inputfile import read_json

    src = _file()
    got = read_json(src, MAX_INVENTORY_BYTES, error=HostError, what="host inventory (hosts.json)", fix=_FIX)
    if got is None:
        return {"hosts": {}}
    data, text = got
    check_inventory(data, src, text)
    return data


def load_hosts() -> dict[str, dict]:
    hosts = dict(_read_file().get("hosts", {}))
    hosts["local"] = local_entry(hosts.get("local"))
    return hosts


def get_host(name: str | None) -> dict:
    name = name or os.environ.get("GPURUN_HOST") or "local"
    hosts = load_hosts()
    if name not in hosts:
        import difflib
        known = ", ".join(sorted(hosts))
        close = difflib.get_close_matches(name, sorted(hosts), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise HostError(f"unknown host {name!r}", f"{hint}known hosts: {known}; add one with "
                        f"`gpurun host add {name} --profile generic-ssh --ssh user@host:port`")
    return hosts[name]


def _locked() -> AbstractContextManager[dict]:
    from orchestrator.inputfile import locked_rewrite
    return locked_rewrite(_file(), _read_file, check_inventory, "hosts")


def add_host(entry: dict, *, replace: bool = False) -> dict:
    name = entry.get("name", "")
    if not NAME_RE.match(name or ""):
        raise HostError(f"invalid host name {name!r}", "use letters, digits, '.', '_' or '-' (max 63)")
    with _locked() as data:
        if name in data["hosts"] and not replace and name != "local":
            raise HostError(f"host {name!r} already exists", f"remove it first with `gpurun host rm {name}`")
        data["hosts"][name] = entry
    return entry


def update_host(name: str, **fields: object) -> None:
    with _locked() as data:
        entry = data["hosts"].get(name) or (local_entry() if name == "local" else None)
        if entry is None:
            raise HostError(f"unknown host {name!r}")
        entry.update(fields)
        data["hosts"][name] = entry


def remove_host(name: str) -> None:
    if name == "local":
        raise HostError("the host 'local' always exists and cannot be removed")
    with _locked() as data:
        if name not in data["hosts"]:
            raise HostError(f"unknown host {name!r}", "see `gpurun host ls`")
        del data["hosts"][name]
