"""The only module that imports pynvml (nvidia-ml-py): a lazy NVML ``GpuProbe``.

``open_nvml()`` returns an ``NvmlProbe`` or a ``NoDriver`` when the library or driver is
missing; inside ``samples()`` each failed call yields ``None`` and a GPU that stopped
answering is reported ``lost``, so one bad reading never crashes a watchdog tick.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Union

from .base import GpuProcess, GpuSample, NoDriver, ReadyProbe, throttle_names

_MIB = 1024.0 * 1024.0
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_GPU_IS_LOST = 15


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlProbe(ReadyProbe):
    """Reads every GPU through NVML. Construct with ``open_nvml()``; ``nvml`` is the module."""

    kind = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._n = nvml
        self._static: Dict[int, Dict[str, Any]] = {}
        self._xid: Dict[int, List[int]] = {}
        self._events = None
        try:  # Xid events need root and are NOT_SUPPORTED on many consumer/container GPUs
            self._events = nvml.nvmlEventSetCreate()
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    nvml.nvmlDeviceRegisterEvents(h, _XID_EVENT, self._events)
                except nvml.NVMLError:
                    pass
        except Exception:
            self._events = None

    def driver_version(self) -> Optional[str]:
        try:
            return _text(self._n.nvmlSystemGetDriverVersion())
        except Exception:
            return None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML read; ``None`` on any NVMLError (not supported, no permission, ...)."""
        try:
            return fn(*args)
        except self._n.NVMLError as err:
            if getattr(err, "value", None) == _GPU_IS_LOST:
                raise
            return None

    def _drain_xid(self) -> None:
        if self._events is None:
            return
        n = self._n
        wait = getattr(n, "nvmlEventSetWait_v2", None) or getattr(n, "nvmlEventSetWait")
        for _ in range(256):  # bounded: a storm of events must not stall the tick
            try:
                data = wait(self._events, 0)
            except n.NVMLError:
                return
            try:
                idx = n.nvmlDeviceGetIndex(data.device)
            except n.NVMLError:
                continue
            if data.eventType & _XID_EVENT:
                self._xid.setdefault(idx, []).append(int(data.eventData))

    def _static_info(self, i: int, h: Any) -> Dict[str, Any]:
        info = self._static.get(i)
        if info is None:
            n = self._n
            pci = self._call(n.nvmlDeviceGetPciInfo, h)
            info = {
                "uuid": _text(self._call(n.nvmlDeviceGetUUID, h)),
                "name": _text(self._call(n.nvmlDeviceGetName, h)),
                "pci_bus_id": _text(getattr(pci, "busId", None)) if pci is not None else None,
                "minor": self._call(n.nvmlDeviceGetMinorNumber, h),
                "sm_clock_max_mhz": self._call(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
            }
            self._static[i] = info
        return info

    def _sample_one(self, i: int) -> GpuSample:
        n = self._n
        h = n.nvmlDeviceGetHandleByIndex(i)
        s = GpuSample(index=i, **self._static_info(i, h))
        mem = self._call(n.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            s.mem_total_mib, s.mem_used_mib = mem.total / _MIB, mem.used / _MIB
        util = self._call(n.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            s.util_pct, s.mem_util_pct = float(util.gpu), float(util.memory)
        s.temp_c = self._call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        s.sm_clock_mhz = self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
        mw = self._call(n.nvmlDeviceGetPowerUsage, h)
        s.power_w = mw / 1000.0 if mw is not None else None
        lim = self._call(n.nvmlDeviceGetEnforcedPowerLimit, h)
        s.power_limit_w = lim / 1000.0 if lim is not None else None
        reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        s.throttle = throttle_names(self._call(reasons_fn, h)) if reasons_fn else None
        s.ecc_volatile_uncorrected = self._call(
            n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        s.ecc_volatile_corrected = self._call(
            n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
        pages = self._call(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        s.retired_pages = len(pages) if pages is not None else None
        pending = self._call(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        s.retired_pages_pending = bool(pending) if pending is not None else None
        rows = self._call(n.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            s.remapped_rows_pending, s.remapped_rows_failure = bool(rows[2]), bool(rows[3])
        procs = self._call(n.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is not None:
            s.processes = [GpuProcess(int(p.pid), (p.usedGpuMemory / _MIB) if p.usedGpuMemory else None)
                           for p in procs]
        s.xid = list(self._xid.get(i, []))
        return s

    def samples(self) -> List[GpuSample]:
        n = self._n
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError:
            return []
        self._drain_xid()
        out = []
        for i in range(count):
            try:
                out.append(self._sample_one(i))
            except n.NVMLError:  # handle lookup or GPU_IS_LOST: the card stopped answering
                out.append(GpuSample(index=i, lost=True, xid=list(self._xid.get(i, [])),
                                     **{k: v for k, v in self._static.get(i, {}).items()}))
        return out

    def close(self) -> None:
        try:
            if self._events is not None:
                self._n.nvmlEventSetFree(self._events)
            self._n.nvmlShutdown()
        except Exception:
            pass


DRIVER_PROC = "/proc/driver/nvidia"  # the kernel driver's tree (also visible in GPU containers)


def open_nvml(nvml: Any = None, driver_proc: str = DRIVER_PROC) -> Union[NvmlProbe, NoDriver]:
    """Initialise NVML lazily; ``NoDriver`` (with a plain reason) when it cannot start."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py's module name
        except ImportError:
            # a CPU box has neither: saying the library is missing there sends the user to
            # install a package that would find no driver either
            if not os.path.isdir(driver_proc):
                return NoDriver("no NVIDIA driver on this host (no %s)" % driver_proc)
            return NoDriver("the NVML Python library (nvidia-ml-py) is not installed; "
                            "`pip install nvidia-ml-py` for the Python gpurun's agent runs with")
    try:
        nvml.nvmlInit()
    except Exception as err:  # LibraryNotFound, DriverNotLoaded, NoPermission, ...
        text = str(err) or type(err).__name__
        if "Not Found" in text or "not found" in text.lower():
            return NoDriver("no NVIDIA driver: libnvidia-ml.so.1 not found")
        return NoDriver("NVIDIA driver not usable: %s" % text)
    return NvmlProbe(nvml)
