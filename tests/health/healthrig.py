"""Health-room rigs (imported by tests and conftest): the fake NVML file, a real agent Store, real job processes holding a
stand-in GPU device, and a real loopback webhook server."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.agent import gpus
from orchestrator.agent.context import AgentContext
from orchestrator.agent.store import Store
from rigs.webhook import serve


def healthy_gpu(index: int, **over) -> dict:
    g = {"index": index, "uuid": "GPU-fake-%d" % index, "name": "NVIDIA H100 80GB HBM3",
         "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index), "minor": index,
         "mem_total_mib": 81559, "mem_used_mib": 1024, "util_pct": 97, "mem_util_pct": 40, "temp_c": 62,
         "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "power_w": 610, "power_limit_w": 700,
         "throttle": [], "ecc_volatile_uncorrected": 0, "ecc_volatile_corrected": 0, "retired_pages": 0,
         "retired_pages_pending": False, "remapped_rows_pending": False, "remapped_rows_failure": False,
         "xid": [], "lost": False, "processes": []}
    g.update(over)
    return g


class FakeNvml:
    """Writes the JSON the probe reads (``GPURUN_FAKE_NVML``); call ``set`` between ticks."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, gpus=None, **top) -> None:
        doc = dict(top)
        if gpus is not None:
            doc["gpus"] = gpus
        self.path.write_text(json.dumps(doc))


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch) -> FakeNvml:
    fake = FakeNvml(tmp_path / "nvml.json")
    fake.set([healthy_gpu(0), healthy_gpu(1)], driver="550.54.15")
    monkeypatch.setenv("GPURUN_FAKE_NVML", str(fake.path))
    gpus._PROBES.clear()
    yield fake
    gpus._PROBES.clear()


@pytest.fixture
def device(tmp_path) -> Path:
    """A stand-in for /dev/nvidia0 (a plain file: real device nodes do not exist here)."""
    d = Path(tempfile.mkdtemp(prefix="gpurun-dev-"))
    os.chmod(d, 0o755)  # another uid must be able to open it too
    (d / "nvidia0").write_text("")
    (d / "nvidiactl").write_text("")
    for f in d.iterdir():
        os.chmod(f, 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def agent(tmp_path):
    """A ctx like the daemon's: state dir, a real SQLite Store, the host config."""
    state = tmp_path / "state"
    state.mkdir()
    store = Store(str(state / "agent.db"))
    ctx = AgentContext(str(state), store, {"name": "testbox"})
    yield ctx
    store.close()


class Procs:
    """Real processes; each can hold an fd on a device path and carry a job's env marker."""

    def __init__(self) -> None:
        self.procs = []

    def spawn(self, hold=None, env=None, user=None, sleep=300) -> subprocess.Popen:
        opens = " ".join('%d<"$%d"' % (3 + i, 1 + i) for i in range(len(hold or [])))
        script = "exec %s; echo ready; exec sleep %d" % (opens, sleep) if opens else "echo ready; exec sleep %d" % sleep
        argv = ["/bin/sh", "-c", script, "sh"] + [str(h) for h in (hold or [])]
        if user is not None:
            argv = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups"] + argv
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, start_new_session=True)
        assert p.stdout.readline().strip() == b"ready"
        self.procs.append(p)
        # "ready" comes from the shell; wait for its exec into sleep too, so the process a test
        # records is the one the watchdog later finds (a loaded box ran a tick in between)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with open("/proc/%d/comm" % p.pid) as f:
                    if f.read().strip() == "sleep":
                        break
            except OSError:
                break
            time.sleep(0.005)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except OSError:
                    pass
                try:
                    os.kill(p.pid, 9)  # not a group leader
                except OSError:
                    pass
                p.wait(timeout=10)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.close()


def add_running_job(store: Store, tmp_path: Path, job_id: str, pid: int, *, gpus=1, gpu_ids=(0,),
                    started_ago=3600.0, metrics=None, attempt=1) -> dict:
    run_dir = tmp_path / "runs" / job_id
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "log.txt"
    log.write_text("")
    store.insert_jobs([{"id": job_id, "name": job_id, "command": "train", "gpus": gpus, "run_dir": str(run_dir),
                        "log": str(log), "metrics": str(metrics) if metrics else None}])
    assert store.transition(job_id, ["queued"], "running", pid=pid, gpu_ids=list(gpu_ids), attempt=attempt,
                            started_at=time.time() - started_ago)
    return store.get_job(job_id)


def job_env(job_id: str, attempt: int = 1) -> dict:
    return {"GPURUN_JOB_ID": job_id, "GPURUN_JOB_TOKEN": "%s:%d" % (job_id, attempt)}


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture
def webhook():
    """A real HTTP server on loopback recording every POST; ``statuses`` scripts replies."""
    with serve() as srv:
        yield srv
