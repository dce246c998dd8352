"""Where a reader stopped in an append-only file, and how it notices the file was replaced
(rotated, truncated or rewritten): the byte cursor every incremental reader keeps."""

from __future__ import annotations

import hashlib
import os
from typing import Optional


class FileCursor:
    """Where we stopped in an append-only file, and how to notice it was replaced."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.ino: Optional[int] = None
        self.head = ""

    def _head_hash(self, f) -> str:
        f.seek(0)
        return hashlib.sha1(f.read(4096)).hexdigest()

    def check(self, f) -> bool:
        """True when the file is the one we were reading (else the caller restarts at 0)."""
        st = os.fstat(f.fileno())
        if self.ino is None:
            self.ino = st.st_ino
        if st.st_ino != self.ino or st.st_size < self.offset:
            return False
        return not self.head or self._head_hash(f) == self.head

    def seal(self, f) -> None:
        """Remember the file head once it is complete, to notice a rewrite later."""
        if not self.head and self.offset >= 4096:
            self.head = self._head_hash(f)

    def state(self) -> dict:
        return {"offset": self.offset, "ino": self.ino, "head": self.head}

    def restore(self, st: dict) -> None:
        self.offset, self.ino, self.head = int(st.get("offset", 0)), st.get("ino"), st.get("head", "")
