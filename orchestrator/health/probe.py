"""Choosing a GPU probe: the JSON fake (env ``GPURUN_FAKE_NVML``), NVML, ``nvidia-smi``, else NoDriver.

Also owns the ``nvidia-smi`` CSV fallback, the fake, the kernel-log Xid scan (``NVRM: Xid``
lines filtered by PCI bus id, since a container's dmesg shows other tenants' GPUs) and
``count_gpus()`` for the scheduler. Fake JSON: ``{"driver": "550.54", "gpus": [GpuSample
fields...]}`` or ``{"no_driver": "why"}``; it is re-read on every ``samples()`` call.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Callable, Dict, List, Optional

from .base import GpuProbe, GpuProcess, GpuSample, NoDriver, ReadyProbe, throttle_names

FAKE_ENV = "GPURUN_FAKE_NVML"
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
_BUS_RE = re.compile(r"([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?$")

SMI_FIELDS = [
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu",
    "utilization.memory", "temperature.gpu", "clocks.sm", "clocks.max.sm", "power.draw",
    "power.limit", "clocks_throttle_reasons.active", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total", "retired_pages.pending", "remapped_rows.pending",
    "remapped_rows.failure",
]
_SMI_BASIC = 13  # the first 13 fields exist on every driver we care about


def bus_key(bus_id: Optional[str]) -> Optional[str]:
    """``00000000:3B:00.0`` and ``0000:3b:00`` both become ``3b:00``."""
    if not bus_id:
        return None
    m = _BUS_RE.search(bus_id.strip())
    return ("%s:%s" % m.groups()).lower() if m else None


def parse_kernel_xids(text: str) -> Dict[str, List[int]]:
    """Map bus key -> Xid codes from ``NVRM: Xid (PCI:...): N`` kernel log lines."""
    out: Dict[str, List[int]] = {}
    for m in _XID_RE.finditer(text):
        key = bus_key(m.group(1))
        if key:
            out.setdefault(key, []).append(int(m.group(2)))
    return out


def read_kernel_log() -> Optional[str]:
    """The kernel ring buffer via ``dmesg``; ``None`` when not permitted (common in containers)."""
    if not shutil.which("dmesg"):
        return None
    try:
        r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def merge_kernel_xids(samples: List[GpuSample], log: Optional[str]) -> None:
    if not log:
        return
    xids = parse_kernel_xids(log)
    for s in samples:
        codes = xids.get(bus_key(s.pci_bus_id) or "")
        if codes:
            s.xid = sorted(set(s.xid) | set(codes))


def _smi_value(raw: str) -> Optional[str]:
    raw = raw.strip()
    if not raw or raw.startswith("[") or raw in ("N/A", "Unknown Error"):
        return None
    return raw


def _num(raw: Optional[str]) -> Optional[float]:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def _yes(raw: Optional[str]) -> Optional[bool]:
    if raw is None:
        return None
    return raw.strip().lower() in ("yes", "1", "true", "enabled")


def parse_smi_csv(text: str, fields: List[str]) -> List[GpuSample]:
    """Parse ``--query-gpu`` CSV (noheader, nounits) into samples; odd lines become lost GPUs."""
    out: List[GpuSample] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields) or not cells[0].isdigit():
            if "lost" in line.lower() or "reset" in line.lower():
                out.append(GpuSample(index=len(out), lost=True))
            continue
        v = {f: _smi_value(c) for f, c in zip(fields, cells)}
        mask = v.get("clocks_throttle_reasons.active")
        s = GpuSample(
            index=int(cells[0]), uuid=v["uuid"], name=v["name"], pci_bus_id=v["pci.bus_id"],
            mem_total_mib=_num(v["memory.total"]), mem_used_mib=_num(v["memory.used"]),
            util_pct=_num(v["utilization.gpu"]), mem_util_pct=_num(v["utilization.memory"]),
            temp_c=_num(v["temperature.gpu"]), sm_clock_mhz=_num(v["clocks.sm"]),
            sm_clock_max_mhz=_num(v["clocks.max.sm"]), power_w=_num(v["power.draw"]),
            power_limit_w=_num(v["power.limit"]),
            throttle=throttle_names(int(mask, 16)) if mask else None,
        )
        ecc = _num(v.get("ecc.errors.uncorrected.volatile.total"))
        s.ecc_volatile_uncorrected = int(ecc) if ecc is not None else None
        ecc = _num(v.get("ecc.errors.corrected.volatile.total"))
        s.ecc_volatile_corrected = int(ecc) if ecc is not None else None
        s.retired_pages_pending = _yes(v.get("retired_pages.pending"))
        s.remapped_rows_pending = _yes(v.get("remapped_rows.pending"))
        s.remapped_rows_failure = _yes(v.get("remapped_rows.failure"))
        out.append(s)
    return out


class SmiProbe(ReadyProbe):
    """Fallback when NVML's Python library is missing but ``nvidia-smi`` works."""

    kind = "nvidia-smi"

    def __init__(self, exe: str = "nvidia-smi", kernel_log: Callable[[], Optional[str]] = read_kernel_log):
        self.exe = exe
        self._kernel_log = kernel_log

    def _run(self, *args: str) -> Optional[str]:
        try:
            r = subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout if r.returncode == 0 else None

    def driver_version(self) -> Optional[str]:
        out = self._run("--query-gpu=driver_version", "--format=csv,noheader")
        return out.splitlines()[0].strip() if out and out.strip() else None

    def samples(self) -> List[GpuSample]:
        fields = SMI_FIELDS
        out = self._run("--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")
        if out is None:  # an older driver rejects a newer field name: retry with the basics
            fields = SMI_FIELDS[:_SMI_BASIC]
            out = self._run("--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")
        samples = parse_smi_csv(out or "", fields)
        apps = self._run("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
        by_uuid: Dict[str, List[GpuProcess]] = {}
        for line in (apps or "").splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == 3 and cells[1].isdigit():
                by_uuid.setdefault(cells[0], []).append(GpuProcess(int(cells[1]), _num(_smi_value(cells[2]))))
        for s in samples:
            if apps is not None and not s.lost:
                s.processes = by_uuid.get(s.uuid or "", [])
        merge_kernel_xids(samples, self._kernel_log())
        return samples


class FakeProbe(ReadyProbe):
    """GPUs described by a JSON file; the seam tests and GPU-less demos use."""

    kind = "fake"

    def __init__(self, path: str) -> None:
        self.path = path

    def _load(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as err:
            raise ValueError("%s: cannot read fake NVML file: %s" % (self.path, err))
        if not isinstance(data, dict):
            raise ValueError("%s: top level must be an object with 'gpus'" % self.path)
        return data

    def driver_version(self) -> Optional[str]:
        return self._load().get("driver", "fake")

    def samples(self) -> List[GpuSample]:
        data = self._load()
        return [GpuSample.from_dict(g, "%s: gpus[%d]" % (self.path, i))
                for i, g in enumerate(data.get("gpus") or [])]


def open_probe(env: Optional[Dict[str, str]] = None) -> GpuProbe:
    """The best probe on this machine. Raises ``ValueError`` only for an unreadable fake file."""
    env = os.environ if env is None else env
    fake = env.get(FAKE_ENV)
    if fake:
        probe = FakeProbe(fake)
        data = probe._load()
        if data.get("no_driver"):
            return NoDriver(str(data["no_driver"]))
        return probe
    from .nvml import NvmlProbe, open_nvml

    nv = open_nvml()
    if isinstance(nv, NvmlProbe):
        return _WithKernelXids(nv)
    if shutil.which("nvidia-smi"):
        smi = SmiProbe()
        if smi._run("-L") is not None:
            return smi
        return NoDriver("nvidia-smi is installed but fails: the NVIDIA driver is not loaded")
    return nv


class _WithKernelXids:
    """NVML samples plus Xids from the kernel log (NVML events need root and long-lived sets)."""

    def __init__(self, inner, kernel_log: Callable[[], Optional[str]] = read_kernel_log) -> None:
        self._inner = inner
        self.kind, self.available, self.reason = inner.kind, inner.available, inner.reason
        self._kernel_log = kernel_log

    def driver_version(self) -> Optional[str]:
        return self._inner.driver_version()

    def samples(self) -> List[GpuSample]:
        out = self._inner.samples()
        merge_kernel_xids(out, self._kernel_log())
        return out

    def close(self) -> None:
        self._inner.close()


def count_gpus(env: Optional[Dict[str, str]] = None) -> Optional[int]:
    """How many GPUs the scheduler may place jobs on; ``None`` when no NVIDIA driver is present."""
    probe = open_probe(env)
    try:
        if not probe.available:
            return None
        return sum(1 for s in probe.samples() if not s.lost)
    finally:
        probe.close()
