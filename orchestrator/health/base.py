"""The GPU probe contract: ``GpuSample`` (one consistent reading of one GPU) and ``GpuProbe``.

Every implementation (NVML, ``nvidia-smi`` parsing, the JSON fake, ``NoDriver``) fills the
same dataclass; a value the probe could not read is ``None``, never a string sentinel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional

try:  # Protocol is 3.8+; keep the import soft so a 3.7 box still loads the module
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore

# Throttle / clocks-event reasons we name; bits follow NVML's nvmlClocksEventReason* mask.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


def throttle_names(mask: Optional[int]) -> Optional[List[str]]:
    """Decode an NVML clocks-event bitmask into our reason names (``None`` stays unknown)."""
    if mask is None:
        return None
    return [name for bit, name in sorted(THROTTLE_BITS.items()) if mask & bit]


@dataclass
class GpuProcess:
    """A process NVML says uses a GPU. Inside containers the pid is a *host* pid: advisory."""

    pid: int
    used_mib: Optional[float] = None


@dataclass
class GpuSample:
    """One reading of one GPU. Units: MiB, percent, Celsius, MHz, watts."""

    index: int
    uuid: Optional[str] = None
    name: Optional[str] = None
    pci_bus_id: Optional[str] = None
    minor: Optional[int] = None  # N in /dev/nvidiaN
    mem_total_mib: Optional[float] = None
    mem_used_mib: Optional[float] = None
    util_pct: Optional[float] = None
    mem_util_pct: Optional[float] = None
    temp_c: Optional[float] = None
    sm_clock_mhz: Optional[float] = None
    sm_clock_max_mhz: Optional[float] = None
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    throttle: Optional[List[str]] = None  # active reasons, names from THROTTLE_BITS
    ecc_volatile_uncorrected: Optional[int] = None
    ecc_volatile_corrected: Optional[int] = None
    retired_pages: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    xid: List[int] = field(default_factory=list)  # Xid codes seen on this GPU
    lost: bool = False
    processes: Optional[List[GpuProcess]] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], where: str = "gpu") -> "GpuSample":
        """Build from a plain dict (the fake's JSON); unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError("%s: unknown key %r (known: %s)" % (where, unknown[0], ", ".join(sorted(known))))
        if "index" not in data:
            raise ValueError("%s: missing key 'index'" % where)
        kw = dict(data)
        procs = kw.get("processes")
        if procs is not None:
            kw["processes"] = [GpuProcess(int(p["pid"]), p.get("used_mib")) for p in procs]
        kw["xid"] = [int(x) for x in kw.get("xid") or []]
        return cls(**kw)

    @property
    def mem_free_mib(self) -> Optional[float]:
        if self.mem_total_mib is None or self.mem_used_mib is None:
            return None
        return max(0.0, self.mem_total_mib - self.mem_used_mib)


class GpuProbe(Protocol):
    """Reads GPUs. ``kind`` is ``nvml`` | ``nvidia-smi`` | ``fake`` | ``none``.

    ``available`` is False only for the no-driver / no-library state (then ``reason`` says why
    in plain words and ``samples()`` returns ``[]``). A single failed read inside ``samples()``
    yields ``None`` fields (or ``lost=True`` for a GPU that stopped answering), never raises.
    """

    kind: str
    available: bool
    reason: Optional[str]

    def driver_version(self) -> Optional[str]: ...

    def samples(self) -> List[GpuSample]: ...

    def close(self) -> None: ...


class ReadyProbe:
    """What every working probe shares: ``available`` with no ``reason``; ``close`` frees nothing."""

    available = True
    reason: Optional[str] = None

    def close(self) -> None:
        pass


class NoDriver:
    """The state "no NVIDIA driver or library here": distinct from a failed call."""

    kind = "none"
    available = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def driver_version(self) -> Optional[str]:
        return None

    def samples(self) -> List[GpuSample]:
        return []

    def close(self) -> None:
        pass
