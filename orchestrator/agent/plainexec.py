"""Running a job's command line without ``bash -c`` when bash would only exec it (issue 15).

``bash -c LINE`` costs ~2 ms of shell start between one job's end and the next one's start.
For a line of plain words bash does nothing but split it on spaces, look the first word up in
``PATH`` and exec it in place of itself (the last command of ``-c`` is exec'd, not forked), so
the wrapper can do that itself. The rule is conservative; anything outside it goes to bash:

* the line holds only letters, digits, spaces and ``_-./=:,+@%`` (no quotes, ``$``, globs,
  ``~``, ``#``, braces, redirections, ``;&|<>()``, backslash, tab or newline), so bash's word
  splitting is a split on spaces and no expansion can change a word;
* the first word is no bash builtin or keyword (``cd``, ``echo``, ``exec``, ``time``, ``if``...)
  and holds no ``=`` (an assignment prefix);
* there is no ``env.sh`` to source first (``jobwrap.job_script``), bash is the job shell, and
  the job's environment holds nothing that changes what bash runs: ``BASH_ENV`` (sourced at
  start), exported functions (``BASH_FUNC_*``), ``SHELLOPTS``/``BASHOPTS`` (``xtrace`` prints),
  ``EXECIGNORE``, ``POSIXLY_CORRECT``; ``PATH`` is set and has no empty entry; ``SHLVL`` is
  unset or a plain number below 999;
* the first word names an executable file: a path when it holds a ``/``, else the first
  executable regular file along the job's ``PATH`` (bash's lookup, read from the job's
  environment, not the wrapper's).

The environment the program gets is what bash would pass it: ``_`` set to the path it ran
(``dir/word`` as bash spells it), ``PWD`` kept when it names the working directory and set from
``getcwd`` otherwise, ``OLDPWD`` dropped unless it names a directory, ``SHLVL`` as inherited
(``0`` when unset). argv, cwd, process group, signal dispositions and the log are the same as
under ``bash -c``. A word that is found nowhere, or a spawn that fails (a directory, no
permission, a script without ``#!``), goes to ``bash -c`` after all, so the user sees bash's own
message and exit code (``bash: line 1: NAME: command not found``, 127). The job wrapper
(``jobwrap.run``) calls ``argv_env`` after it has moved into the job's directory.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@% ")
# ``compgen -b`` and ``compgen -k`` of bash 5: never exec'd by bash, so never by the wrapper
_BASH_WORDS = frozenset(
    ". : [ alias bg bind break builtin caller cd command compgen complete compopt continue declare dirs "
    "disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill let local "
    "logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt source suspend "
    "test times trap true type typeset ulimit umask unalias unset wait "
    "if then else elif fi case esac for select while until do done in function time { } ! [[ ]] coproc".split())
_ENV_KEYS = ("BASH_ENV", "SHELLOPTS", "BASHOPTS", "EXECIGNORE", "POSIXLY_CORRECT")


def words(command: str) -> Optional[List[str]]:
    """The words of ``command`` when it is a plain line bash would only exec, else None."""
    if not command or not _PLAIN.issuperset(command):
        return None
    argv = command.split()
    if not argv or argv[0] in _BASH_WORDS or "=" in argv[0]:
        return None
    return argv


def _executable(path: str) -> bool:
    try:
        return os.path.isfile(path) and os.access(path, os.X_OK, effective_ids=os.access in os.supports_effective_ids)
    except OSError:
        return False


def _lookup(name: str, path_var: str) -> Optional[str]:
    """``name`` along ``path_var`` as bash finds it: the first executable regular file, spelled
    ``dir/name`` (no doubled ``/``). None when there is none (bash then says why)."""
    for d in path_var.split(":"):
        cand = d + name if d.endswith("/") else d + "/" + name
        if _executable(cand):
            return cand
    return None


def _shell_vars(env: Dict[str, str]) -> Optional[Dict[str, str]]:
    """``env`` as bash -c passes it to the program it execs, less ``_``; None when bash would
    do more with it than this module knows (bash then runs the line)."""
    if any(k in env for k in _ENV_KEYS) or any(k.startswith("BASH_FUNC_") for k in env):
        return None
    if not env.get("PATH") or "" in env["PATH"].split(":"):
        return None
    lvl = env.get("SHLVL")
    if lvl is not None and not (lvl.isdigit() and lvl.isascii() and str(int(lvl)) == lvl and int(lvl) < 999):
        return None
    out = dict(env)
    out.setdefault("SHLVL", "0")
    pwd = env.get("PWD", "")
    try:
        here = os.stat(".")
    except OSError:
        return None
    try:
        st = os.stat(pwd) if pwd.startswith("/") else None
    except OSError:
        st = None
    if st is None or (st.st_dev, st.st_ino) != (here.st_dev, here.st_ino):
        try:
            out["PWD"] = os.getcwd()
        except OSError:
            return None
    if "OLDPWD" in out and not os.path.isdir(out["OLDPWD"]):
        del out["OLDPWD"]
    return out


def argv_env(command: str, env: Dict[str, str], shell: str) -> Optional[Tuple[str, List[str], Dict[str, str]]]:
    """``(path, argv, env)`` to spawn in place of ``shell -c command``, or None for the shell.
    Call it in the job's working directory (relative paths and ``PWD`` are judged there)."""
    if shell != "/bin/bash":
        return None
    argv = words(command)
    if argv is None:
        return None
    out = _shell_vars(env)
    if out is None:
        return None
    path = argv[0] if "/" in argv[0] else _lookup(argv[0], out["PATH"])
    if path is None or not _executable(path):
        return None
    out["_"] = path
    return path, argv, out
