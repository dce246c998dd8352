"""GPU discovery for the scheduler: which device indices this host can hand out.

Order: the host config's explicit ``gpus`` list; ``GPURUN_FAKE_GPUS=N`` (tests); the health
probe (NVML / nvidia-smi / fake NVML) when it is importable; a bare ``nvidia-smi -L``; none.
"""

from __future__ import annotations

import os
import subprocess
from typing import List, Optional


def visible_gpus(config: Optional[dict] = None) -> List[int]:
    config = config or {}
    explicit = config.get("gpus")
    if isinstance(explicit, list):
        return [int(i) for i in explicit]
    fake = os.environ.get("GPURUN_FAKE_GPUS")
    if fake is not None and fake.strip().isdigit():
        return list(range(int(fake)))
    try:
        from orchestrator.health.probe import count_gpus  # optional room
    except ImportError:
        count_gpus = None  # type: ignore[assignment]
    if count_gpus is not None:
        try:
            n = count_gpus()
            if n is not None:
                return list(range(int(n)))
        except Exception:  # a broken probe must not stop the queue; fall through
            pass
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return list(range(sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))))
