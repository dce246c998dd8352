"""``gpurun setup`` core: probe judgement (pure) and real runs through LocalTransport."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator import paths
from orchestrator.core.setup import proxy_line, render_env, run_setup
from orchestrator.core.setup_checks import analyse, is_network_fs, mount_of, parse_gpus
from orchestrator.profiles import load_profile
from orchestrator.transport.local import LocalTransport

MOUNTS = ("overlay / overlay rw 0 0\n"
          "/dev/nvme0n1 /data ext4 rw 0 0\n"
          "srv:/export /data/shared nfs4 rw 0 0\n"
          "/dev/fuse /mnt/my\\040bucket fuse.s3fs rw 0 0\n")


def probe_doc(**over) -> dict:
    """A probe reply as templates/setup_probe.sh prints it (healthy GPU box)."""
    doc = {
        "user": "root", "home": "/root",
        "python": {"path": "/usr/bin/python3", "version": "3.10.12"},
        "nvidia_smi": {"path": "/usr/bin/nvidia-smi", "query_rc": 0,
                       "query": "0, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15\n"
                                "1, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15",
                       "banner": "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   "
                                 "CUDA Version: 12.4     |"},
        "paths": [], "mounts": MOUNTS,
        "memory": {"cgroup_max": str(64 << 30), "cgroup_current": str(16 << 30), "total": ""},
        "tools": {"rsync": True, "tmux": True, "setsid": True, "crontab": True},
        "systemd_user": False, "provider_env": {}, "files": {"network_turbo": True},
    }
    doc.update(over)
    return doc


def path_row(asked: str, nearest: str, pct: int = 10, ipct: int = 5) -> dict:
    return {"asked": asked, "expanded": asked, "exists": True, "nearest": nearest,
            "writable": True,
            "df": f"/dev/x 1000000 {pct * 10000} 900000 {pct}% {nearest}",
            "dfi": f"/dev/x 100000 {ipct * 1000} 90000 {ipct}% {nearest}"}


def checks_of(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


# --- pure judgement ----------------------------------------------------------------------

def test_mounts_and_network_fs_detection() -> None:
    assert mount_of("/data/run", MOUNTS) == ("/data", "ext4")
    assert mount_of("/data/shared/x", MOUNTS) == ("/data/shared", "nfs4")
    assert mount_of("/data/sharedX", MOUNTS) == ("/data", "ext4")
    assert mount_of("/mnt/my bucket/a", MOUNTS) == ("/mnt/my bucket", "fuse.s3fs")
    assert mount_of("/etc", MOUNTS) == ("/", "overlay")
    assert all(map(is_network_fs, ["nfs", "nfs4", "cifs", "ceph", "fuse.sshfs", "fuse.juicefs"]))
    assert not any(map(is_network_fs, ["ext4", "xfs", "overlay", "fuse.lxcfs", "fuseblk"]))


def test_gpu_driver_and_cuda_are_parsed(isolated_home: Path) -> None:
    gpus, driver, cuda, err = parse_gpus(probe_doc()["nvidia_smi"])
    assert err is None and len(gpus) == 2 and gpus[1]["name"] == "NVIDIA H100 80GB HBM3"
    assert (driver, cuda) == ("550.54.15", "12.4")
    p = load_profile("generic-ssh")
    host = {"name": "b", "state_dir": "/data/st"}
    r = analyse(probe_doc(paths=[path_row("/data/st", "/data")]), p, host,
                {"state_dir": "/data/st", "durable_dir": ""})
    c = checks_of(r)
    assert c["gpus"]["status"] == "ok" and "2 x NVIDIA H100" in c["gpus"]["detail"]
    assert c["python"]["status"] == "ok" and c["state dir"]["status"] == "ok"
    assert "cgroup limit 64.0 GiB, 25% in use" in c["memory"]["detail"]
    assert r["refusal"] is None


def test_zero_gpus_on_runpod_is_a_loud_failure(isolated_home: Path) -> None:
    nv = {"path": "/usr/bin/nvidia-smi", "query_rc": 0, "query": "", "banner": ""}
    r = analyse(probe_doc(nvidia_smi=nv, provider_env={"RUNPOD_GPU_COUNT": "1"}),
                load_profile("runpod"), {"name": "pod"}, {"state_dir": "/workspace/.gpurun/state"})
    g = checks_of(r)["gpus"]
    assert g["status"] == "fail" and "ZERO GPUs" in g["detail"] and "RP1" in g["detail"]


def test_missing_nvidia_smi_warns_on_a_cpu_box_fails_when_gpus_expected(isolated_home) -> None:
    p = load_profile("generic-ssh")
    lay = {"state_dir": "/x"}
    r = analyse(probe_doc(nvidia_smi=None), p, {"name": "b"}, lay)
    assert checks_of(r)["gpus"]["status"] == "warn"
    r = analyse(probe_doc(nvidia_smi=None), p, {"name": "b", "expect_gpus": 2}, lay)
    assert checks_of(r)["gpus"]["status"] == "fail"


def test_state_dir_on_nfs_is_refused(isolated_home: Path) -> None:
    p = load_profile("generic-ssh")
    r = analyse(probe_doc(paths=[path_row("~/.gpurun/state", "/data/shared/home")]), p,
                {"name": "lab"}, {"state_dir": "~/.gpurun/state"})
    assert r["refusal"] and "network filesystem (nfs4" in r["refusal"]["message"]
    assert "paths.state_dir" in r["refusal"]["hint"]


def test_full_inodes_and_python_too_old_and_no_tmux(isolated_home: Path) -> None:
    p = load_profile("autodl")
    doc = probe_doc(python={"path": "/usr/bin/python3", "version": "3.6.9"},
                    tools={"rsync": False, "tmux": False, "setsid": True},
                    paths=[path_row("/root/autodl-tmp", "/data", pct=40, ipct=97)],
                    files={"network_turbo": False})
    c = checks_of(analyse(doc, p, {"name": "a"}, {"state_dir": "/root/autodl-tmp/.gpurun/state",
                                                 "durable_dir": "/root/autodl-fs"}))
    assert c["tier data-disk"]["status"] == "fail" and "inodes 97% used" in c["tier data-disk"]["detail"]
    assert c["python"]["status"] == "fail" and "3.6.9" in c["python"]["detail"]
    assert c["tmux"]["status"] == "fail" and c["rsync"]["status"] == "warn"
    assert c["proxy hook"]["status"] == "warn"
    assert c["tier autodl-fs"]["status"] == "warn"  # the durable tier is absent


# --- env file ----------------------------------------------------------------------------

def test_autodl_env_file_is_posix_safe_without_the_proxy_file(isolated_home: Path,
                                                               tmp_path: Path) -> None:
    p = load_profile("autodl")
    lay = {"hf_home": "/root/autodl-tmp/.cache/huggingface",
           "pip_cache": "/root/autodl-tmp/.cache/pip"}
    text = render_env(p, {"name": "a"}, lay)
    assert proxy_line("source /etc/network_turbo") in text
    env_file = tmp_path / "env.sh"
    env_file.write_text(text)
    # dash where present: no `source`, and a failed `.` would abort the job's shell
    sh = shutil.which("dash") or "/bin/sh"
    out = subprocess.run([sh, "-c", f'. "{env_file}"; echo "$HF_ENDPOINT|$HF_HUB_DISABLE_XET|'
                          '$PYTHONUNBUFFERED|$HF_HOME|$PIP_INDEX_URL"; echo after'],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "https://hf-mirror.com|1|1|/root/autodl-tmp/.cache/huggingface|"
        "https://pypi.tuna.tsinghua.edu.cn/simple", "after"]


# --- real runs on this machine -----------------------------------------------------------

@pytest.fixture
def box(isolated_home: Path, tmp_path: Path) -> dict:
    """A test-only profile whose tiers live in tmp_path, and a host entry using it."""
    root = tmp_path / "box"
    (root / "data").mkdir(parents=True)
    d = paths.user_profiles_dir()
    d.mkdir(parents=True)
    (d / "tbox.yaml").write_text(
        f"extends: autodl\ndescription: test box\n"
        f"paths:\n  workdir: {root}/data/work\n  state_dir: {root}/data/state\n"
        f"  cache_dir: {root}/data/cache\n  durable_dir: {root}/fs\n"
        f"storage:\n  - {{name: data, path: {root}/data, survives_stop: true,"
        f" survives_destroy: false, network_fs: false}}\n"
        f"  - {{name: fs, path: {root}/fs, survives_stop: true, survives_destroy: true,"
        f" network_fs: true}}\n"
        "detach: setsid\nboot_hook: vast_onstart\n")
    return {"name": "tbox", "profile": "tbox", "kind": "local", "root": root,
            "state_dir": str(root / "data" / "state")}


def test_dry_run_touches_nothing(box: dict) -> None:
    r = run_setup(load_profile("tbox"), box, None, dry_run=True,
                  onstart=str(box["root"] / "onstart.sh"))
    assert r["dry_run"] and r["checks"] == []
    assert [a["what"] for a in r["actions"]][:3] == [
        "probe the box (read-only)", "create the directory layout", "write the job environment"]
    assert all(a["done"] is None for a in r["actions"])
    assert sorted(os.listdir(box["root"])) == ["data"] and not os.listdir(box["root"] / "data")


def test_setup_creates_layout_env_and_idempotent_onstart(box: dict) -> None:
    onstart = box["root"] / "onstart.sh"
    onstart.write_text("#!/bin/sh\necho user-stuff\n")
    t = LocalTransport()
    for _ in range(2):
        r = run_setup(load_profile("tbox"), box, t, onstart=str(onstart))
    assert r["refusal"] is None and all(a["done"] for a in r["actions"]), r["actions"]
    state = box["root"] / "data" / "state"
    for d in (state / "bin", box["root"] / "data" / "work",
              box["root"] / "data" / "cache" / "huggingface"):
        assert d.is_dir()
    env = (state / "env.sh").read_text()
    assert "HF_HUB_DISABLE_XET=1" in env and f"HF_HOME={box['root']}/data/cache/huggingface" in env
    text = onstart.read_text()
    assert text.startswith("#!/bin/sh\necho user-stuff\n")
    assert text.count("# >>> gpurun-boot:tbox >>>") == 1 and str(state / "boot.sh") in text
    assert os.access(onstart, os.X_OK) and os.access(state / "boot.sh", os.X_OK)
    c = checks_of(r)
    assert c["tier data"]["status"] == "ok" and c["state dir"]["status"] == "ok"
    assert c["python"]["status"] == "ok"
    assert not list(state.glob("*.gpurun-tmp"))


def test_cron_hook_replaces_its_own_line(box: dict, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in crontab keeping the table in a file: the box has no cron daemon.
    fake = tmp_path / "bin"
    fake.mkdir()
    table = tmp_path / "crontab.txt"
    table.write_text("0 3 * * * backup.sh\n")
    (fake / "crontab").write_text(
        f'#!/bin/sh\nif [ "$1" = "-l" ]; then cat {table}; else cp "$1" {table}; fi\n')
    (fake / "crontab").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    (paths.user_profiles_dir() / "tbox.yaml").write_text(
        (paths.user_profiles_dir() / "tbox.yaml").read_text()
        .replace("boot_hook: vast_onstart", "boot_hook: systemd_user"))
    box = dict(box, state_dir=str(box["root"] / "data" / "st 100%"))
    for _ in range(2):
        r = run_setup(load_profile("tbox"), box, LocalTransport())
    assert all(a["done"] for a in r["actions"]), r["actions"]
    lines = table.read_text().splitlines()
    assert lines[0] == "0 3 * * * backup.sh" and len(lines) == 2
    assert lines[1].startswith("@reboot /bin/sh ") and "st 100\\%" in lines[1]
    assert any("systemctl --user` does not work" in n for n in r["notes"])


def test_state_dir_on_network_tier_refused_before_any_change(
        box: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.core import setup_checks

    # No NFS server here: make the real probe's /proc/mounts answer look like NFS for it.
    real = setup_checks.mount_of
    monkeypatch.setattr(setup_checks, "mount_of",
                        lambda p, m: ("/srv", "nfs4") if "/data" in p else real(p, m))
    r = run_setup(load_profile("tbox"), box, LocalTransport(),
                  onstart=str(box["root"] / "onstart.sh"))
    assert r["refusal"] and not r["ok"]
    assert all(a["done"] is None for a in r["actions"][1:])
    assert not (box["root"] / "data" / "state").exists()


def test_boot_script_really_restarts_the_agent(box: dict) -> None:
    from orchestrator.agent import control
    from orchestrator.core import agentship

    r = run_setup(load_profile("tbox"), box, LocalTransport(),
                  onstart=str(box["root"] / "onstart.sh"))
    assert r["ok"], r["checks"]
    state = Path(box["state_dir"])
    build, pyz = agentship.build()
    shutil.copy(pyz, state / "bin" / f"agent-{build}.pyz")
    # what vast runs at container start: the onstart file, which runs boot.sh
    subprocess.run(["/bin/sh", str(box["root"] / "onstart.sh")], check=True, timeout=30)
    # the boot script starts the daemon detached: give a loaded CI box time (it failed once at 20 s)
    deadline = time.time() + 60
    info = None
    while time.time() < deadline and not (info and info["build"] == build):
        info = control.running_daemon(str(state))
        time.sleep(0.05)
    try:
        assert info and info["build"] == build and info["pid"]
        assert "started" in (state / "boot.log").read_text()
    finally:
        if info and info["pid"]:
            os.kill(info["pid"], signal.SIGTERM)
            end = time.time() + 10
            while control.running_daemon(str(state)) and time.time() < end:
                time.sleep(0.05)


# --- the real command --------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-c", "from orchestrator.cli.main import main; main()",
                           *args], capture_output=True, text=True, timeout=120)


def test_cli_dry_run_prints_every_command(box: dict) -> None:
    from orchestrator import hosts

    hosts.add_host({k: v for k, v in box.items() if k != "root"})
    r = run_cli("setup", "tbox", "tbox", "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("DRY RUN: nothing will run on the host")
    assert "$ sh -s -- " in out and "$ mkdir -p " in out and "| export HF_HUB_DISABLE_XET=1" in out
    assert "Danger clock 'auto-release' (after 15 days powered off)" in out
    assert not (box["root"] / "data" / "state").exists()


def test_cli_unknown_host_and_profile_exit_2(isolated_home: Path) -> None:
    r = run_cli("setup", "generic-ssh", "nosuchhost")
    assert r.returncode == 2 and "unknown host 'nosuchhost'" in r.stderr
    r = run_cli("setup", "nosuchprofile", "local")
    assert r.returncode == 2 and "unknown profile 'nosuchprofile'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.ssh
def test_setup_over_real_ssh(ssh_host: dict) -> None:
    import json

    r = run_cli("setup", "generic-ssh", ssh_host["name"], "--json")
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    c = checks_of(doc)
    assert c["python"]["status"] == "ok" and c["state dir"]["status"] == "ok"
    assert c["gpus"]["status"] == "warn"  # the rig has no GPU: loud, not fatal
    assert doc["host"] == ssh_host["name"] and doc["refusal"] is None
    assert all(a["done"] for a in doc["actions"] if a["done"] is not None)
    assert r.returncode == (0 if doc["ok"] else 1)
    env = Path(ssh_host["state_dir"]) / "env.sh"
    assert "export PYTHONUNBUFFERED=1" in env.read_text()
    assert (Path(ssh_host["workdir"]).parent / "state" / "bin").is_dir()
