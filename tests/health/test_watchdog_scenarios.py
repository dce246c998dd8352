"""Watchdog scenarios through the agent's real tick: real Store, real job processes, the fake
NVML file, a fake cgroup tree and injected statvfs numbers."""

from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace

import pytest
from healthrig import add_running_job, age, healthy_gpu, job_env

from orchestrator.agent import admission, gpus, watchdog_hook
from orchestrator.health import watchdog
from orchestrator.quality.progress import read_progress

GIB = 1024 ** 3


def fs(pct=20.0, inodes_pct=2.0, total_blocks=1_000_000, files=1_000_000):
    used = int(total_blocks * pct / 100)
    iused = int(files * inodes_pct / 100)
    return SimpleNamespace(f_blocks=total_blocks, f_bfree=total_blocks - used, f_bavail=total_blocks - used,
                           f_frsize=4096, f_files=files, f_ffree=files - iused, f_fsid=0)


@pytest.fixture
def cgroup(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "memory.max").write_text(str(8 * GIB))
    (root / "memory.current").write_text(str(2 * GIB))
    (root / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    return root


@pytest.fixture
def wd(agent, cgroup, device, fake_nvml):
    """A tick with the test's cgroup, device glob and disk numbers (per path, default healthy)."""
    agent.config["watchdog"] = {"device_glob": [str(device / "nvidia*")]}
    disks = {}

    def statvfs(path):
        return disks.get(path) or fs()

    def tick(**kw):
        return watchdog_hook.tick(agent, cgroup_root=str(cgroup), statvfs=statvfs, **kw)

    return SimpleNamespace(tick=tick, disks=disks, ctx=agent, store=agent.store, nvml=fake_nvml, device=device)


def kinds(store, *only):
    return [e["kind"] for e in store.events() if not only or e["kind"] in only]


def finding_events(store):
    return [e for e in store.events() if e["data"].get("code")]


def test_healthy_host_and_working_job_produce_no_findings(wd, procs, tmp_path):
    p = procs.spawn(hold=[wd.device / "nvidia0"], env=job_env("ok"))
    add_running_job(wd.store, tmp_path, "ok", p.pid)
    assert wd.tick() == []
    assert finding_events(wd.store) == []
    snap = wd.store.kv_get(watchdog_hook.FINDINGS_KEY)
    assert snap["findings"] == [] and snap["jobs"]["ok"]["alive"] is True


def test_hung_job_is_stalled_and_notified(wd, procs, tmp_path):
    p = procs.spawn(hold=[wd.device / "nvidia0"], env=job_env("hung"))
    job = add_running_job(wd.store, tmp_path, "hung", p.pid)
    age(tmp_path / "runs" / "hung" / "log.txt", 2400)
    wd.nvml.set([healthy_gpu(0, util_pct=0), healthy_gpu(1)])
    wd.tick()
    (ev,) = finding_events(wd.store)
    assert ev["kind"] == "stalled" and ev["severity"] == "error" and ev["job_id"] == "hung"
    assert "no log/metrics/checkpoint growth for 40 min" in ev["message"] and "hung" in ev["message"]
    assert ev["data"]["action"] == "notify" and ev["data"]["util_pct"] == 0
    wd.tick()  # still hung: reported once, not every minute
    assert len(finding_events(wd.store)) == 1
    assert p.poll() is None and wd.store.get_job(job["id"])["reason"] is None  # notify kills nothing


def test_data_bound_job_is_not_stalled(wd, procs, tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"step": 100, "loss": 2.5}) + "\n")
    p = procs.spawn(hold=[wd.device / "nvidia0"], env=job_env("db"))
    add_running_job(wd.store, tmp_path, "db", p.pid, metrics=metrics)
    age(tmp_path / "runs" / "db" / "log.txt", 2400)  # silent stdout, but steps advance
    wd.nvml.set([healthy_gpu(0, util_pct=0), healthy_gpu(1)])
    wd.tick()
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 200, "loss": 2.1}) + "\n")
    wd.tick()
    evs = finding_events(wd.store)
    assert [e["kind"] for e in evs] == ["data_bound"]
    assert evs[0]["severity"] == "info" and evs[0]["data"]["action"] == "record" and evs[0]["data"]["step"] == 200
    assert wd.store.kv_get(watchdog_hook.FINDINGS_KEY)["jobs"]["db"] == {"step": 200, "loss": 2.1, "alive": True}


def test_stalled_with_busy_gpu_is_a_warning_about_buffering(wd, procs, tmp_path):
    p = procs.spawn(hold=[wd.device / "nvidia0"], env=job_env("buf"))
    add_running_job(wd.store, tmp_path, "buf", p.pid)
    age(tmp_path / "runs" / "buf" / "log.txt", 2400)
    wd.tick()
    (ev,) = finding_events(wd.store)
    assert ev["kind"] == "stalled" and ev["severity"] == "warn" and "block-buffered" in ev["message"]


def test_policy_kill_ends_the_job_group(wd, procs, tmp_path):
    wd.ctx.config["watchdog"]["policy"] = {"stalled": "kill"}
    wd.ctx.config["kill_grace_s"] = 0.5
    p = procs.spawn(hold=[wd.device / "nvidia0"], env=job_env("k"))
    add_running_job(wd.store, tmp_path, "k", p.pid)
    age(tmp_path / "runs" / "k" / "log.txt", 2400)
    wd.nvml.set([healthy_gpu(0, util_pct=0), healthy_gpu(1)])
    actions = wd.tick()
    assert [(a["action"], a["job_id"], a["code"]) for a in actions] == [("kill", "k", "stalled")]
    assert p.wait(timeout=5) == -signal.SIGTERM
    job = wd.store.get_job("k")
    assert job["cancel_requested"] and job["reason"].startswith("watchdog kill: job k: no log")


def test_policy_requeue_sets_reason_for_the_runner(wd, procs, tmp_path):
    wd.ctx.config["watchdog"]["policy"] = {"no_gpu_memory": "requeue"}
    p = procs.spawn(env=job_env("cpu"))  # holds no GPU device at all
    add_running_job(wd.store, tmp_path, "cpu", p.pid)
    (a,) = wd.tick()
    assert a["action"] == "requeue" and a["code"] == "no_gpu_memory"
    job = wd.store.get_job("cpu")
    assert not job["cancel_requested"] and job["reason"].startswith("watchdog requeue: job cpu has run 60 min")
    assert p.wait(timeout=5) == -signal.SIGTERM
    assert kinds(wd.store, "no_gpu_memory") == ["no_gpu_memory"]


def test_process_gone_and_pid_reused(wd, procs, tmp_path):
    gone = procs.spawn(env=job_env("gone"))
    add_running_job(wd.store, tmp_path, "gone", gone.pid, gpus=0, gpu_ids=())
    os.killpg(gone.pid, signal.SIGKILL)
    gone.wait()
    other = procs.spawn(env=job_env("someone-else"))
    add_running_job(wd.store, tmp_path, "reused", other.pid, gpus=0, gpu_ids=())
    wd.tick()
    evs = {e["job_id"]: e for e in finding_events(wd.store)}
    assert evs["gone"]["kind"] == "process_gone" and "its process is gone" in evs["gone"]["message"]
    assert evs["reused"]["data"]["pid_reused"] is True


def test_cgroup_oom_kill_and_memory_pressure(wd, cgroup):
    wd.tick()  # baseline counter
    (cgroup / "memory.current").write_text(str(int(7.6 * GIB)))
    (cgroup / "memory.events").write_text("oom 1\noom_kill 1\n")
    wd.tick()
    evs = {e["kind"]: e for e in finding_events(wd.store)}
    assert evs["oom_kill"]["severity"] == "error" and evs["oom_kill"]["data"]["delta"] == 1
    assert "Killed" in evs["oom_kill"]["message"]
    assert evs["cgroup_memory_high"]["data"]["pct"] == 95.0
    wd.tick()  # the counter did not move again: no second oom event
    assert kinds(wd.store, "oom_kill") == ["oom_kill"]


def test_cgroup_v1_layout(tmp_path):
    from orchestrator.health.system import cgroup_memory

    mem = tmp_path / "cg" / "memory"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text(str(4 * GIB))
    (mem / "memory.usage_in_bytes").write_text(str(GIB))
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    got = cgroup_memory(str(tmp_path / "cg"))
    assert got == {"version": 1, "limit_bytes": 4 * GIB, "usage_bytes": GIB, "pct": 25.0, "oom_kill": 3, "oom": None}
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712")
    assert cgroup_memory(str(tmp_path / "cg"))["limit_bytes"] is None


def test_disk_and_inode_full_on_every_tier(wd, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    wd.ctx.config["watchdog"]["paths"] = [str(scratch)]
    wd.disks["/"] = fs(pct=96.5)
    wd.disks[str(scratch)] = fs(pct=34, inodes_pct=100, total_blocks=2_000_000)
    wd.tick()
    evs = {(e["kind"], e["data"]["path"]): e for e in finding_events(wd.store)}
    assert evs[("disk_full", "/")]["data"]["pct"] == 96.5
    assert evs[("inodes_full", str(scratch))]["data"]["pct"] == 34.0
    assert ("disk_full", str(scratch)) not in evs
    wd.disks["/"] = fs(pct=50)
    wd.tick()
    cleared = [e for e in wd.store.events() if e["kind"] == "cleared"]
    assert [c["data"]["code"] for c in cleared] == ["disk_full"]


def test_reboot_detected(wd):
    wd.store.kv_set(watchdog_hook.STATE_KEY, {"boot_id": "an-older-boot"})
    wd.tick()
    (ev,) = finding_events(wd.store)
    assert ev["kind"] == "reboot" and ev["data"]["previous"] == "an-older-boot"
    wd.tick()
    assert kinds(wd.store, "reboot") == ["reboot"]


def test_gpu_xid_79_and_ecc_become_findings(wd):
    wd.nvml.set([healthy_gpu(0, xid=[79]), healthy_gpu(1, ecc_volatile_uncorrected=2)])
    wd.ctx.config["expect_gpus"] = 3
    wd.tick()
    evs = finding_events(wd.store)
    msgs = sorted(e["message"] for e in evs if e["kind"] == "gpu_fail")
    assert len(msgs) == 3
    assert any("Xid 79" in m for m in msgs) and any("uncorrected ECC" in m for m in msgs)
    assert any("2 GPU(s) visible, 3 expected" in m for m in msgs)


def test_watchdog_settings_validation():
    cfg = watchdog.settings({"watchdog": {"interval_s": 30, "policy": {"stalled": "requeue"}}})
    assert cfg["interval_s"] == 30 and cfg["policy"]["stalled"] == "requeue" and cfg["policy"]["oom_kill"] == "notify"
    with pytest.raises(ValueError, match=r"watchdog.policy.stalled: unknown action 'explode'"):
        watchdog.settings({"watchdog": {"policy": {"stalled": "explode"}}})
    with pytest.raises(ValueError, match=r"watchdog.policy.disk_full: kill applies to job findings only"):
        watchdog.settings({"watchdog": {"policy": {"disk_full": "kill"}}})
    with pytest.raises(ValueError, match=r"watchdog.stall_after: unknown key"):
        watchdog.settings({"watchdog": {"stall_after": 5}})
    with pytest.raises(ValueError, match=r"watchdog.interval_s: must be a positive number"):
        watchdog.settings({"watchdog": {"interval_s": -1}})


def test_bad_watchdog_config_is_an_event_not_a_crash(wd):
    wd.ctx.config["watchdog"]["policy"] = {"stalled": "explode"}
    assert wd.tick() == []
    (ev,) = [e for e in wd.store.events() if e["kind"] == "watchdog_config"]
    assert "unknown action 'explode'" in ev["message"]


def test_progress_is_read_from_log_lines_without_metrics(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("epoch 1 step 10 loss=3.2\nwarning: slow io\nepoch 1 step: 20 loss: 2.9\n")
    assert read_progress(None, str(log)) == (20, 2.9)
    assert read_progress(str(tmp_path / "missing.jsonl"), None) == (None, None)


def test_snapshot_verb_carries_findings_and_progress(wd, procs, tmp_path):
    from orchestrator.agent import verbs_health

    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"step": 42, "loss": 1.25}) + "\n")
    age(metrics, 2400)
    p = procs.spawn(hold=[wd.device / "nvidia0"], env=job_env("s"))
    add_running_job(wd.store, tmp_path, "s", p.pid, metrics=metrics)
    age(tmp_path / "runs" / "s" / "log.txt", 2400)
    wd.nvml.set([healthy_gpu(0, util_pct=0), healthy_gpu(1, xid=[79])])
    wd.tick()
    snap = verbs_health.v_snapshot(wd.ctx, {})
    assert snap["host"] == "testbox" and snap["gpu"]["status"] == "FAIL" and "_samples" not in snap["gpu"]
    (job,) = snap["jobs"]
    assert (job["id"], job["state"], job["step"], job["loss"]) == ("s", "running", 42, 1.25)
    assert job["runtime_s"] >= 3599
    assert {f["code"] for f in snap["findings"]} == {"stalled", "gpu_fail"}
    assert any(e["kind"] == "stalled" for e in snap["events"])
    json.dumps(snap)  # the reply must be plain JSON


def test_admission_reports_and_opt_in_reaps_zombies(wd, procs, monkeypatch):
    monkeypatch.setenv("GPURUN_FAKE_DEVICE_GLOB", str(wd.device / "nvidia*"))
    z = procs.spawn(hold=[wd.device / "nvidia0"])
    wd.nvml.set([healthy_gpu(0, mem_used_mib=71559, processes=[{"pid": z.pid, "used_mib": 70000}]), healthy_gpu(1)])
    wd.ctx.config["reap"] = {"min_age_s": 0}
    res = admission.admission(wd.ctx, [0], need_mib=40000)
    assert res["zombies"] == [z.pid] and res["reaped"] == [] and res["ok"] is True
    assert res["free_mib"][0] == pytest.approx(80000)
    assert z.poll() is None  # reaping is opt-in
    wd.ctx.config["reap"]["auto"] = True
    wd.ctx.config["reap"]["grace_s"] = 2
    res = admission.admission(wd.ctx, [0])
    assert res["reaped"] == [{"pid": z.pid, "outcome": "terminated"}]
    assert z.wait(timeout=5) == -signal.SIGTERM


def test_broken_probe_is_reported_not_raised(wd):
    wd.nvml.path.write_text("{not json")
    gpus._PROBES.clear()
    rep = gpus.gpu_report(wd.ctx.config)
    assert rep["available"] is False and "cannot read fake NVML file" in rep["no_driver"]
    assert wd.tick() == []
