"""VRAM zombie reaper against real processes holding a stand-in device file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from healthrig import add_running_job, healthy_gpu, job_env

from orchestrator.agent import verbs_health
from orchestrator.health import reaper
from orchestrator.health.base import GpuSample

LATER = 600.0  # look at the processes as if 10 minutes had passed, so they pass the age threshold


def glob_of(device):
    return [str(device / "nvidia*")]


def plan_for(device, **kw):
    kw.setdefault("now", time.time() + LATER)
    return reaper.plan(device_glob=glob_of(device), **kw)


def by_pid(rows):
    return {r["pid"]: r for r in rows}


def test_zombie_is_found_and_reaped_only_with_execute(device, procs):
    z = procs.spawn(hold=[device / "nvidia0"])
    p = plan_for(device)
    cand = by_pid(p["candidates"])
    assert z.pid in cand and cand[z.pid]["devices"] == [str(device / "nvidia0")]
    assert cand[z.pid]["user"] == "root" and cand[z.pid]["age_s"] >= LATER - 5
    assert z.poll() is None  # planning killed nothing
    res = reaper.execute(p, grace=5)
    assert {"pid": z.pid, "outcome": "terminated"} in res
    assert z.wait(timeout=5) == -signal.SIGTERM


def test_live_job_tree_is_never_a_candidate(device, procs):
    job = procs.spawn(hold=[device / "nvidia0"], env=job_env("job-live"))
    child_of_job = subprocess.Popen(["/bin/sh", "-c", 'exec 3<"$1"; exec sleep 300', "sh", str(device / "nvidiactl")],
                                    env={"PATH": os.environ["PATH"]}, start_new_session=True)
    procs.procs.append(child_of_job)
    time.sleep(0.2)
    # the second process is protected through the recorded job pid, not its env
    p = plan_for(device, live_job_ids=["job-live"], protected_pids=[child_of_job.pid])
    skipped = by_pid(p["skipped"])
    assert job.pid not in by_pid(p["candidates"]) and child_of_job.pid not in by_pid(p["candidates"])
    assert skipped[job.pid]["reason"] == "part of live job job-live"
    # a finished job's leftover is a zombie again
    p2 = plan_for(device, live_job_ids=[])
    assert job.pid in by_pid(p2["candidates"]) and by_pid(p2["candidates"])[job.pid]["job_id"] == "job-live"


def test_descendants_of_a_live_job_are_protected(device, procs):
    parent = procs.spawn(env=job_env("job-tree"), hold=[device / "nvidiactl"])
    kid = subprocess.Popen(["/bin/sh", "-c", 'exec 3<"$1"; exec sleep 300', "sh", str(device / "nvidia0")],
                           env={"PATH": os.environ["PATH"]}, preexec_fn=None)
    procs.procs.append(kid)
    time.sleep(0.2)
    # a real tree: the recorded job pid is a shell whose child holds the device
    holder = subprocess.Popen(["/bin/sh", "-c", 'sh -c \'exec 3<"$0"; echo ok; exec sleep 300\' "$1"', "sh",
                               str(device / "nvidia0")], stdout=subprocess.PIPE, start_new_session=True)
    procs.procs.append(holder)
    assert holder.stdout.readline().strip() == b"ok"
    p = plan_for(device, live_job_ids=["job-tree"], protected_pids=[holder.pid])
    cands = by_pid(p["candidates"])
    assert parent.pid not in cands and kid.pid in cands
    grandchild = [r for r in p["skipped"] if r["reason"].startswith("part of live job") and r["pid"] != parent.pid]
    assert grandchild, "the holder below the protected shell must be protected too"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_other_users_process_needs_all_users(device, procs):
    other = procs.spawn(hold=[device / "nvidia0"], user=65534)
    p = plan_for(device)
    assert other.pid not in by_pid(p["candidates"])
    assert by_pid(p["skipped"])[other.pid]["reason"].startswith("another user's process")
    p_all = plan_for(device, all_users=True)
    assert by_pid(p_all["candidates"])[other.pid]["uid"] == 65534
    res = reaper.execute(p_all, grace=5)
    assert {"pid": other.pid, "outcome": "terminated"} in res


def test_young_processes_and_system_daemons_are_skipped(device, procs, tmp_path):
    daemon_exe = tmp_path / "nvidia-persistenced"
    shutil.copy(shutil.which("sleep"), daemon_exe)
    d = subprocess.Popen(["/bin/sh", "-c", 'exec 3<"$1"; exec "$2" 300', "sh", str(device / "nvidia0"), str(daemon_exe)],
                         start_new_session=True)
    procs.procs.append(d)
    young = procs.spawn(hold=[device / "nvidia0"])
    time.sleep(0.2)
    p = plan_for(device)
    assert by_pid(p["skipped"])[d.pid]["reason"] == "system daemon"
    now_plan = reaper.plan(device_glob=glob_of(device))  # real clock: everything is seconds old
    assert by_pid(now_plan["skipped"])[young.pid]["reason"] == "younger than 120 s"
    assert now_plan["candidates"] == []


def test_execute_escalates_to_kill_and_never_hits_a_reused_pid(device, procs):
    stubborn = subprocess.Popen(["/bin/sh", "-c", 'trap "" TERM; exec 3<"$1"; echo ok; while :; do sleep 0.1; done',
                                 "sh", str(device / "nvidia0")], stdout=subprocess.PIPE, start_new_session=True)
    procs.procs.append(stubborn)
    assert stubborn.stdout.readline().strip() == b"ok"
    p = plan_for(device)
    row = by_pid(p["candidates"])[stubborn.pid]
    fake = dict(row, start_ticks=row["start_ticks"] + 1)  # same pid, different process
    assert reaper.execute({"candidates": [fake]}, grace=0.2) == [{"pid": stubborn.pid, "outcome": "gone"}]
    assert stubborn.poll() is None
    res = reaper.execute({"candidates": [row]}, grace=0.5)
    assert res == [{"pid": stubborn.pid, "outcome": "killed"}]
    assert stubborn.wait(timeout=5) == -signal.SIGKILL


def test_admission_free_vram_after_reap(device, procs):
    z = procs.spawn(hold=[device / "nvidia0"])
    p = plan_for(device)
    samples = [GpuSample.from_dict(healthy_gpu(0, mem_used_mib=71559, processes=[{"pid": z.pid, "used_mib": 70000}])),
               GpuSample.from_dict(healthy_gpu(1))]
    assert reaper.orphans_by_gpu(p, samples) == {0: [z.pid]}
    free = reaper.free_after_reap(p, samples)
    assert free[0] == pytest.approx(80000) and free[1] == pytest.approx(80535)


def test_reap_verb_lists_by_default_and_kills_when_asked(agent, device, procs, fake_nvml, tmp_path):
    live = procs.spawn(hold=[device / "nvidia0"], env=job_env("j1"))
    add_running_job(agent.store, tmp_path, "j1", live.pid)
    z = procs.spawn(hold=[device / "nvidia0"])
    agent.config["watchdog"] = {"device_glob": glob_of(device)}
    rep = verbs_health.v_reap(agent, {"min_age_s": 0})
    assert [c["pid"] for c in rep["plan"]["candidates"]] == [z.pid] and rep["executed"] is None
    assert z.poll() is None
    rep = verbs_health.v_reap(agent, {"min_age_s": 0, "kill": True, "grace": 3})
    assert rep["executed"] == [{"pid": z.pid, "outcome": "terminated"}]
    assert live.poll() is None, "the live job must survive a reap"
    assert [e["kind"] for e in agent.store.events() if e["kind"] == "reaped"] == ["reaped"]
