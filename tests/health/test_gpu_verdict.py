"""GPU probes (fake, nvidia-smi parsing, NVML adapter) and PASS/WARN/FAIL verdicts."""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest
from healthrig import healthy_gpu

from orchestrator.health import nvml as nvml_mod
from orchestrator.health.base import GpuSample, NoDriver, throttle_names
from orchestrator.health.probe import (FakeProbe, SMI_FIELDS, SmiProbe, count_gpus, merge_kernel_xids,
                                       open_probe, parse_kernel_xids, parse_smi_csv)
from orchestrator.health.verdict import exit_code, gpu_verdict, host_verdict


def verdict_of(**over):
    return gpu_verdict(GpuSample.from_dict(healthy_gpu(0, **over)))


def codes(v):
    return [r["code"] for r in v["reasons"]]


def test_healthy_gpus_pass(fake_nvml):
    probe = open_probe()
    assert probe.kind == "fake" and probe.available
    samples = probe.samples()
    assert [s.index for s in samples] == [0, 1]
    v = host_verdict(samples, expected=2)
    assert v["status"] == "PASS" and v["reasons"] == [] and all(g["reasons"] == [] for g in v["gpus"])
    assert exit_code(v["status"]) == 0
    assert count_gpus() == 2


def test_xid_79_and_48_fail_other_xids_warn():
    v = verdict_of(xid=[79])
    assert v["status"] == "FAIL" and codes(v) == ["xid_79"] and "fallen off the bus" in v["reasons"][0]["message"]
    assert verdict_of(xid=[48])["status"] == "FAIL"
    v = verdict_of(xid=[13, 31])
    assert v["status"] == "WARN" and codes(v) == ["xid_13", "xid_31"]


def test_ecc_and_memory_repair_states():
    v = verdict_of(ecc_volatile_uncorrected=3)
    assert v["status"] == "FAIL" and codes(v) == ["ecc_uncorrected"] and "3 uncorrected" in v["reasons"][0]["message"]
    assert verdict_of(ecc_volatile_corrected=50)["status"] == "PASS"  # corrected errors are normal
    assert codes(verdict_of(retired_pages_pending=True)) == ["retire_pending"]
    assert verdict_of(remapped_rows_pending=True)["status"] == "WARN"
    assert verdict_of(remapped_rows_failure=True)["status"] == "FAIL"


def test_thermal_throttling():
    v = verdict_of(temp_c=87, sm_clock_mhz=1200, sm_clock_max_mhz=1980, throttle=["hw_thermal", "sw_thermal"])
    assert v["status"] == "FAIL"
    assert set(codes(v)) == {"throttle_hw_thermal", "throttle_sw_thermal", "hot_slow"}
    hot_ok = verdict_of(temp_c=84, sm_clock_mhz=1900)
    assert hot_ok["status"] == "WARN" and codes(hot_ok) == ["hot"]
    assert verdict_of(throttle=["sw_power_cap", "gpu_idle"])["status"] == "PASS"  # normal operation
    assert verdict_of(throttle=["hw_power_brake"])["status"] == "FAIL"
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]


def test_lost_and_missing_gpus(fake_nvml):
    fake_nvml.set([healthy_gpu(0), {"index": 1, "lost": True}])
    samples = open_probe().samples()
    v = host_verdict(samples, expected=2)
    assert v["status"] == "FAIL"
    assert codes(v["gpus"][1]) == ["gpu_lost"]
    assert [r["code"] for r in v["reasons"]] == ["missing_gpus"] and "1 GPU(s) visible, 2 expected" in v["reasons"][0]["message"]
    assert count_gpus() == 1


def test_unknown_values_are_none_not_failures(fake_nvml):
    fake_nvml.set([{"index": 0, "temp_c": None, "util_pct": None}])
    (s,) = open_probe().samples()
    assert s.temp_c is None and s.mem_free_mib is None
    assert gpu_verdict(s)["status"] == "PASS"


def test_no_driver_is_its_own_state(fake_nvml):
    fake_nvml.set(no_driver="no NVIDIA driver: libnvidia-ml.so.1 not found")
    probe = open_probe()
    assert isinstance(probe, NoDriver) and not probe.available and probe.samples() == []
    assert count_gpus() is None
    v = host_verdict([], expected=None, available=False, no_driver_reason=probe.reason)
    assert v["status"] == "WARN" and "libnvidia-ml" in v["reasons"][0]["message"]
    assert host_verdict([], expected=1, available=False)["status"] == "FAIL"


def test_real_machine_without_driver_reports_no_driver(monkeypatch):
    monkeypatch.delenv("GPURUN_FAKE_NVML", raising=False)
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    probe = open_probe()
    assert probe.kind == "none" and "NVIDIA" in probe.reason


def test_bad_fake_file_names_the_key(fake_nvml):
    fake_nvml.set([{"index": 0, "temperature": 50}])
    with pytest.raises(ValueError, match=r"gpus\[0\]: unknown key 'temperature'"):
        FakeProbe(str(fake_nvml.path)).samples()


SMI_OUT = (
    "0, GPU-aaa, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559, 70000, 0, 0, 86, 1100, 1980, 300.5, 700.00, "
    "0x0000000000000040, 0, 2, No, No, No\n"
    "1, GPU-bbb, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 81559, 5, 99, 30, 55, 1980, 1980, [N/A], 700.00, "
    "0x0000000000000000, [N/A], [N/A], [N/A], Yes, No\n"
    "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
)


def test_nvidia_smi_csv_parsing():
    s = parse_smi_csv(SMI_OUT, SMI_FIELDS)
    assert len(s) == 3
    assert s[0].throttle == ["hw_thermal"] and s[0].temp_c == 86 and s[0].sm_clock_max_mhz == 1980
    assert s[0].ecc_volatile_corrected == 2 and s[0].retired_pages_pending is False
    assert s[1].power_w is None and s[1].ecc_volatile_uncorrected is None and s[1].remapped_rows_pending is True
    assert s[2].lost
    v = host_verdict(s)
    assert [g["status"] for g in v["gpus"]] == ["FAIL", "WARN", "FAIL"]


def test_smi_probe_runs_a_real_executable(tmp_path):
    exe = tmp_path / "nvidia-smi"
    data = tmp_path / "out.csv"
    data.write_text(SMI_OUT.splitlines()[0] + "\n")
    exe.write_text('#!/bin/sh\ncase "$1" in\n  --query-gpu=index*) cat %s;;\n'
                   '  --query-compute-apps*) echo "GPU-aaa, 4242, 69000";;\n  *) echo 550.54.15;;\nesac\n' % data)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    probe = SmiProbe(str(exe), kernel_log=lambda: "[1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n"
                                                "[2.0] NVRM: Xid (PCI:0000:99:00): 48, other tenant's GPU\n")
    (s,) = probe.samples()
    assert s.processes[0].pid == 4242 and s.processes[0].used_mib == 69000
    assert s.xid == [79]  # the other tenant's Xid 48 (bus 99) is not ours
    assert probe.driver_version() == "550.54.15"


def test_kernel_xid_parse_and_merge():
    log = "NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception\nNVRM: Xid (PCI:0000:18:00): 13, again\n"
    assert parse_kernel_xids(log) == {"18:00": [13, 13]}
    s = [GpuSample(index=0, pci_bus_id="00000000:18:00.0", xid=[31])]
    merge_kernel_xids(s, log)
    assert s[0].xid == [13, 31]


class FakeNvmlModule:
    """A module-shaped stand-in for pynvml (exercises our adapter, not the C library)."""

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__("NVML error %d" % value)
            self.value = value

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

    def __init__(self, init_error=None, lost=()):
        self.init_error, self.lost = init_error, set(lost)

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        if i in self.lost:
            raise self.NVMLError(15)
        return i

    def nvmlEventSetCreate(self):
        raise self.NVMLError(3)  # NOT_SUPPORTED, as in many containers

    def nvmlDeviceGetUUID(self, h):
        return "GPU-%d" % h

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:%02X:00.0" % (0x10 + h))

    def nvmlDeviceGetMinorNumber(self, h):
        return h

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1410

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1410

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * 1024 ** 3, used=1024 ** 3)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=88, memory=20)

    def nvmlDeviceGetTemperature(self, h, kind):
        raise self.NVMLError(4)  # one failed call: NO_PERMISSION -> None

    def nvmlDeviceGetPowerUsage(self, h):
        return 250000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 400000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return 0

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return 0

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 0, 0, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=100 + h, usedGpuMemory=2 * 1024 ** 3)]


def test_nvml_adapter_reads_and_tolerates_one_failed_call():
    probe = nvml_mod.open_nvml(FakeNvmlModule(lost=[1]))
    assert probe.kind == "nvml" and probe.driver_version() == "550.54.15"
    s0, s1 = probe.samples()
    assert s0.temp_c is None  # the failed call, not a crash
    assert s0.util_pct == 88 and s0.mem_total_mib == 80 * 1024 and s0.power_w == 250.0
    assert s0.throttle == ["sw_power_cap"] and s0.processes[0].used_mib == 2048 and s0.pci_bus_id.endswith("10:00.0")
    assert s1.lost and gpu_verdict(s1)["status"] == "FAIL"


def test_nvml_missing_library_is_no_driver():
    probe = nvml_mod.open_nvml(FakeNvmlModule(init_error=12))
    assert isinstance(probe, NoDriver) and "NVIDIA" in probe.reason


def test_no_python_library_says_which_is_missing_the_driver_or_the_library(tmp_path, monkeypatch):
    """Without pynvml, a CPU box (no /proc/driver/nvidia) is told it has no driver, not sent to
    install a library that would find none; a box with the driver is told to install it."""
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)  # ``import pynvml`` raises ImportError
    cpu_box = nvml_mod.open_nvml(driver_proc=str(tmp_path / "absent"))
    assert isinstance(cpu_box, NoDriver) and "no NVIDIA driver" in cpu_box.reason
    assert "nvidia-ml-py" not in cpu_box.reason
    (tmp_path / "nvidia").mkdir()
    gpu_box = nvml_mod.open_nvml(driver_proc=str(tmp_path / "nvidia"))
    assert isinstance(gpu_box, NoDriver) and "pip install nvidia-ml-py" in gpu_box.reason


def test_sample_round_trips_through_json():
    s = GpuSample.from_dict(healthy_gpu(3, processes=[{"pid": 5, "used_mib": 10.0}], xid=[13]))
    again = GpuSample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s
