"""This host's GPUs as the agent sees them: which device indices the scheduler can hand out
(``visible_gpus``), and the sampled state plus verdict that ``gpu``, ``snapshot``, the
watchdog and VRAM admission all read (``gpu_report``), from one probe per process.

Discovery order: the host config's explicit ``gpus`` list; ``GPURUN_FAKE_GPUS=N`` (tests);
the health probe (NVML / nvidia-smi / fake NVML); a bare ``nvidia-smi -L``; none.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, List, Optional

from orchestrator.health.probe import FAKE_ENV, count_gpus, open_probe
from orchestrator.health.verdict import host_verdict

_PROBES: Dict[str, Any] = {}


def visible_gpus(config: Optional[dict] = None) -> List[int]:
    config = config or {}
    explicit = config.get("gpus")
    if isinstance(explicit, list):
        return [int(i) for i in explicit]
    fake = os.environ.get("GPURUN_FAKE_GPUS")
    if fake is not None and fake.strip().isdigit():
        return list(range(int(fake)))
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


def probe() -> Any:
    """One probe per process and fake path: NVML init and its event set are kept between ticks."""
    key = os.environ.get(FAKE_ENV, "")
    if key not in _PROBES:
        _PROBES[key] = open_probe()
    return _PROBES[key]


def gpu_report(config: Dict[str, Any], the_probe: Any = None) -> Dict[str, Any]:
    """Samples plus verdict for this host: the shape ``gpu`` and ``snapshot`` reply with."""
    try:
        p = the_probe or probe()
        samples = p.samples()
    except Exception as exc:  # a broken fake file or driver hiccup: report, do not crash
        return {"probe": "error", "available": False, "driver": None, "no_driver": "GPU probe failed: %s" % exc,
                "status": "WARN", "reasons": [{"code": "probe_error", "status": "WARN", "message": str(exc)}],
                "gpus": [], "_samples": []}
    verdict = host_verdict(samples, expected=config.get("expect_gpus"), available=p.available,
                           no_driver_reason=p.reason)
    rows = []
    for s, v in zip(samples, verdict["gpus"]):
        row = s.to_dict()
        row.update(status=v["status"], reasons=v["reasons"])
        rows.append(row)
    return {"probe": p.kind, "available": p.available, "driver": p.driver_version() if p.available else None,
            "no_driver": None if p.available else p.reason, "status": verdict["status"],
            "reasons": verdict["reasons"], "gpus": rows, "_samples": samples, "_verdict": verdict}
