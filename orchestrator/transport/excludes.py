"""Exclude patterns for code sync, one meaning for rsync, the tar/SFTP fallbacks and hashing.

A small, documented subset of rsync/gitignore syntax: ``name`` matches a file or directory
name at any depth, ``dir/`` matches directories only, ``/path`` is anchored at the tree root,
``a/b`` (a slash inside) matches the last components of a path (as rsync does), ``*``, ``?``
and ``[..]`` glob inside one path component, ``**`` spans components, ``#`` starts a comment
line. Negation (``!``) is not supported and is rejected in ``.gpurunignore``.

Every ``.gitignore`` in the tree applies too, to its own directory and below (rsync's
``--filter=':- .gitignore'``, :data:`RSYNC_GITIGNORE_FILTER`; :func:`walk` does the same for
the tar/SFTP fallbacks and the code hash), so build output such as ``*.egg-info`` stays home.
As with rsync, a ``!`` line there re-includes nothing: what a ``.gitignore`` lists stays out.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Iterator, Sequence

from orchestrator.errors import BadInput

DEFAULT_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", "node_modules/",
                    "wandb/", ".mypy_cache/", ".pytest_cache/", ".ipynb_checkpoints/",
                    ".DS_Store", ".gpurun/")
GITIGNORE = ".gitignore"
RSYNC_GITIGNORE_FILTER = "--filter=:- " + GITIGNORE  # per-directory merge, exclude rules only


def read_gitignore(path: Path) -> list[str]:
    """The exclude patterns of one ``.gitignore`` as rsync's ``:-`` merge reads them:
    blank lines and comments skipped, ``!`` lines without effect."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "!")):
            out.append(line)
    return out


def read_ignore_file(path: Path) -> list[str]:
    """Patterns from a ``.gpurunignore`` file; BadInput names the line of a bad pattern."""
    out: list[str] = []
    if not path.is_file():
        return out
    for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise BadInput(f"{path}:{n}: negated pattern {line!r} is not supported",
                           hint="list only what to leave out; remove the leading '!'")
        out.append(line)
    return out


class Matcher:
    """Decides whether a relative path (``a/b/c``) is excluded."""

    def __init__(self, patterns: Sequence[str]):
        # mode: "root" (leading /: the whole path), "tail" (a / inside: the path's last
        # components, rsync's rule), "name" (the last component)
        self.rules: list[tuple[re.Pattern, bool, str]] = []
        for pat in patterns:
            dir_only = pat.endswith("/")
            pat = pat.rstrip("/")
            mode = "root" if pat.startswith("/") else "tail" if "/" in pat else "name"
            pat = pat.lstrip("/")
            if pat:
                self.rules.append((_compile(pat), dir_only, mode))

    def excluded(self, rel: str, is_dir: bool) -> bool:
        parts = rel.split("/")
        for rx, dir_only, mode in self.rules:
            if dir_only and not is_dir:
                continue
            if mode == "name":
                if rx.fullmatch(parts[-1]):
                    return True
            elif mode == "root":
                if rx.fullmatch(rel):
                    return True
            elif any(rx.fullmatch("/".join(parts[i:])) for i in range(len(parts))):
                return True
        return False


def _compile(pat: str) -> re.Pattern:
    parts = []
    for chunk in re.split(r"(\*\*/?)", pat):
        if chunk.startswith("**"):
            parts.append("(?:.*/)?" if chunk.endswith("/") else ".*")
        elif chunk:
            parts.append(fnmatch.translate(chunk).replace(r"\Z", "").replace("(?s:", "(?:")
                         .replace(".*", "[^/]*"))
    return re.compile("".join(parts))


def walk(root: Path, matcher: Matcher, gitignore: bool = True) -> Iterator[tuple[str, Path]]:
    """Yield ``(relative posix path, absolute path)`` for every kept regular file or symlink,
    sorted, skipping excluded directories without descending into them. With ``gitignore``
    each directory's ``.gitignore`` excludes too, for paths below it (as rsync's filter)."""
    root = Path(root)
    scoped: list[tuple[str, Matcher]] = []   # (dir prefix "a/b/", its .gitignore) on the current path

    def out(rel: str, is_dir: bool) -> bool:
        if matcher.excluded(rel, is_dir):
            return True
        return any(rel.startswith(prefix) and m.excluded(rel[len(prefix):], is_dir) for prefix, m in scoped)

    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        if gitignore:
            # os.walk is top-down: drop the scopes of directories we have left, add this one's
            scoped[:] = [(p, m) for p, m in scoped if rel_dir.startswith(p)]
            if GITIGNORE in filenames and not (base / GITIGNORE).is_symlink():
                pats = read_gitignore(base / GITIGNORE)
                if pats:
                    scoped.append((rel_dir, Matcher(pats)))
        # os.walk lists a symlink to a directory among dirnames: send it as a link, never descend.
        links = [d for d in dirnames if (base / d).is_symlink()]
        dirnames[:] = sorted(d for d in dirnames if d not in links and not out(rel_dir + d, True))
        for name in sorted(set(filenames).union(links)):
            rel = rel_dir + name
            if not out(rel, False):
                yield rel, base / name
