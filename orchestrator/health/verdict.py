"""GPU health verdicts: PASS / WARN / FAIL per GPU and per host, each with coded reasons.

Rules (from the field): Xid 48 (double-bit ECC) and 79 (off the bus) fail, other Xids warn;
volatile uncorrected ECC fails; pending page retirement / row remap warns, a remap failure
fails; active HW slowdown, HW thermal or power-brake throttling fails, SW thermal warns;
>= 83 C with the SM clock under 70 % of max fails (hot alone warns); a lost GPU or fewer
GPUs than expected fails.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .base import GpuSample

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}
FATAL_XIDS = {48: "double-bit ECC error", 79: "GPU has fallen off the bus"}
FAIL_THROTTLE = {"hw_slowdown": "HW slowdown", "hw_thermal": "HW thermal slowdown",
                 "hw_power_brake": "HW power brake"}
WARN_THROTTLE = {"sw_thermal": "SW thermal slowdown"}
TEMP_HOT_C = 83.0
SM_CLOCK_FLOOR = 0.70


def worst(statuses: List[str]) -> str:
    return max(statuses, key=lambda s: _RANK[s]) if statuses else PASS


def _reason(code: str, status: str, message: str) -> Dict[str, str]:
    return {"code": code, "status": status, "message": message}


def gpu_reasons(s: GpuSample) -> List[Dict[str, str]]:
    """Every reason this GPU is not PASS (empty list means healthy)."""
    r: List[Dict[str, str]] = []
    if s.lost:
        r.append(_reason("gpu_lost", FAIL, "GPU %d stopped answering (lost / needs reset)" % s.index))
    for code in sorted(set(s.xid)):
        if code in FATAL_XIDS:
            r.append(_reason("xid_%d" % code, FAIL, "Xid %d: %s; re-rent this box" % (code, FATAL_XIDS[code])))
        else:
            r.append(_reason("xid_%d" % code, WARN, "Xid %d seen (often an application fault)" % code))
    if s.ecc_volatile_uncorrected:
        r.append(_reason("ecc_uncorrected", FAIL,
                         "%d uncorrected ECC errors since the last reset" % s.ecc_volatile_uncorrected))
    if s.remapped_rows_failure:
        r.append(_reason("remap_failure", FAIL, "row remapping failed: memory is damaged"))
    if s.remapped_rows_pending:
        r.append(_reason("remap_pending", WARN, "remapped rows pending: reset the GPU to apply"))
    if s.retired_pages_pending:
        r.append(_reason("retire_pending", WARN, "retired pages pending: reset the GPU to apply"))
    for name in s.throttle or []:
        if name in FAIL_THROTTLE:
            r.append(_reason("throttle_" + name, FAIL, "active throttling: %s" % FAIL_THROTTLE[name]))
        elif name in WARN_THROTTLE:
            r.append(_reason("throttle_" + name, WARN, "active throttling: %s" % WARN_THROTTLE[name]))
    if s.temp_c is not None and s.temp_c >= TEMP_HOT_C:
        if s.sm_clock_mhz is not None and s.sm_clock_max_mhz:
            frac = s.sm_clock_mhz / s.sm_clock_max_mhz
            if frac < SM_CLOCK_FLOOR:
                r.append(_reason("hot_slow", FAIL, "%.0f C with SM clock at %.0f %% of max: thermally "
                                 "throttled (expect 25-40 %% slower)" % (s.temp_c, 100 * frac)))
            else:
                r.append(_reason("hot", WARN, "%.0f C (>= %.0f C), clocks still fine" % (s.temp_c, TEMP_HOT_C)))
        else:
            r.append(_reason("hot", WARN, "%.0f C (>= %.0f C)" % (s.temp_c, TEMP_HOT_C)))
    return r


def gpu_verdict(s: GpuSample) -> Dict[str, Any]:
    reasons = gpu_reasons(s)
    return {"index": s.index, "status": worst([x["status"] for x in reasons]), "reasons": reasons}


def host_verdict(samples: List[GpuSample], expected: Optional[int] = None,
                 available: bool = True, no_driver_reason: Optional[str] = None) -> Dict[str, Any]:
    """Verdict for a whole host. With no driver and GPUs expected -> FAIL; none expected -> PASS
    with a plain-words reason, so a CPU-only box is not an error by itself."""
    host_reasons: List[Dict[str, str]] = []
    gpus = [gpu_verdict(s) for s in samples]
    if not available:
        status = FAIL if expected else WARN
        host_reasons.append(_reason("no_driver", status, no_driver_reason or "no NVIDIA driver on this host"))
    seen = sum(1 for s in samples if not s.lost)
    if expected is not None and available and seen < expected:
        host_reasons.append(_reason("missing_gpus", FAIL, "%d GPU(s) visible, %d expected" % (seen, expected)))
    status = worst([g["status"] for g in gpus] + [x["status"] for x in host_reasons])
    return {"status": status, "reasons": host_reasons, "gpus": gpus}


def exit_code(status: str) -> int:
    """The ``gpurun gpu`` contract: 0 for PASS/WARN, 2 for FAIL (a script can re-rent)."""
    return 2 if status == FAIL else 0
