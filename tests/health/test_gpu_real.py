"""Real-GPU checks: run wherever ``nvidia-smi`` works (``-m gpu``), skipped elsewhere."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from orchestrator.health import reaper
from orchestrator.health.probe import SmiProbe, count_gpus, open_probe
from orchestrator.health.verdict import host_verdict


def _nvidia_smi_gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_nvidia_smi_gpus() == 0, reason="needs an NVIDIA GPU with a working nvidia-smi")]


@pytest.fixture(autouse=True)
def _real(monkeypatch):
    monkeypatch.delenv("GPURUN_FAKE_NVML", raising=False)
    monkeypatch.delenv("GPURUN_FAKE_DEVICE_GLOB", raising=False)


def test_probe_reads_every_gpu():
    probe = open_probe()
    assert probe.available and probe.kind in ("nvml", "nvidia-smi")
    samples = probe.samples()
    assert len(samples) == _nvidia_smi_gpus() == count_gpus()
    for s in samples:
        assert s.name and s.uuid and s.mem_total_mib and s.mem_total_mib > 1000
        assert s.temp_c is not None and 0 < s.temp_c < 120
        assert s.sm_clock_max_mhz and s.sm_clock_max_mhz > 0
        assert s.throttle is not None
    v = host_verdict(samples, expected=len(samples))
    assert v["status"] in ("PASS", "WARN", "FAIL") and len(v["gpus"]) == len(samples)
    print("real GPU verdict:", v["status"], [(g["index"], g["status"], [r["code"] for r in g["reasons"]])
                                              for g in v["gpus"]])
    probe.close()


def test_nvml_and_nvidia_smi_agree():
    probe = open_probe()
    a = {s.uuid: s for s in probe.samples()}
    b = {s.uuid: s for s in SmiProbe(kernel_log=lambda: None).samples()}
    assert set(a) == set(b)
    for uuid, s in a.items():
        assert abs(s.mem_total_mib - b[uuid].mem_total_mib) <= 2
        assert s.pci_bus_id and b[uuid].pci_bus_id and s.pci_bus_id.lower().endswith(b[uuid].pci_bus_id.lower()[-7:])
    probe.close()


def test_reaper_sees_a_real_device_holder():
    p = subprocess.Popen(["/bin/sh", "-c", "exec 3</dev/nvidiactl; exec sleep 60"], start_new_session=True)
    try:
        import time
        time.sleep(0.3)
        holders = {h["pid"]: h for h in reaper.scan_holders()}
        assert "/dev/nvidiactl" in holders[p.pid]["devices"]
        plan = reaper.plan(now=time.time() + 600)
        assert p.pid in [c["pid"] for c in plan["candidates"]]
    finally:
        p.kill()
        p.wait()
