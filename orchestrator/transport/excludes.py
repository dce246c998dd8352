"""Exclude patterns for code sync, one meaning for rsync, the tar/SFTP fallbacks and hashing.

A small, documented subset of rsync/gitignore syntax: ``name`` matches a file or directory
name at any depth, ``dir/`` matches directories only, ``/path`` is anchored at the tree root,
``*``, ``?`` and ``[..]`` glob inside one path component, ``**`` spans components, ``#``
starts a comment line. Negation (``!``) is not supported and is rejected.
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
        self.rules: list[tuple[re.Pattern, bool, bool]] = []
        for pat in patterns:
            dir_only = pat.endswith("/")
            pat = pat.rstrip("/")
            anchored = pat.startswith("/") or "/" in pat
            pat = pat.lstrip("/")
            if pat:
                self.rules.append((_compile(pat), dir_only, anchored))

    def excluded(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        for rx, dir_only, anchored in self.rules:
            if dir_only and not is_dir:
                continue
            if rx.fullmatch(rel if anchored else name):
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


def walk(root: Path, matcher: Matcher) -> Iterator[tuple[str, Path]]:
    """Yield ``(relative posix path, absolute path)`` for every kept regular file or symlink,
    sorted, skipping excluded directories without descending into them."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        # os.walk lists a symlink to a directory among dirnames: send it as a link, never descend.
        links = [d for d in dirnames if (base / d).is_symlink()]
        dirnames[:] = sorted(d for d in dirnames
                             if d not in links and not matcher.excluded(rel_dir + d, True))
        for name in sorted(set(filenames).union(links)):
            rel = rel_dir + name
            if not matcher.excluded(rel, False):
                yield rel, base / name
