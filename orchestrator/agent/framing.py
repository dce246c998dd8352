"""Sentinel framing of the agent's JSON replies (stdlib only).

``frame`` wraps one JSON document; ``unframe`` finds the last complete frame in noisy
output and decodes it, raising ``ValueError`` when there is none.
"""

from __future__ import annotations

import json
from typing import Any

BEGIN = "\n<<<GPURUN-REPLY-7f3a>>>\n"
END = "\n<<<GPURUN-END-7f3a>>>\n"


def frame(obj: Any) -> str:
    return BEGIN + json.dumps(obj, separators=(",", ":"), default=str) + END


def unframe(text: str) -> Any:
    """Decode the last framed reply in ``text``; ``ValueError`` if none is complete."""
    end = text.rfind(END.strip())
    if end < 0:
        raise ValueError("no reply frame in agent output")
    start = text.rfind(BEGIN.strip(), 0, end)
    if start < 0:
        raise ValueError("reply frame has no beginning")
    body = text[start + len(BEGIN.strip()):end].strip()
    return json.loads(body)
