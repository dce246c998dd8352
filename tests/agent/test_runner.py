"""The real agent on the local host: detached jobs, cancel, timeouts, retries, GPUs, stdin."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rigs.agents import gpurun, status_json, wait_terminal


def _write(tmp_path, text: str, name: str = "q.txt") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_job_environment_stdin_eof_and_exit_codes(home, tmp_path):
    q = _write(tmp_path, "[name=env] echo \"$GPURUN_JOB_ID|$GPURUN_RUN_DIR|${CUDA_VISIBLE_DEVICES-unset}\"; "
                         "read line; echo \"read-rc=$?\"\n[name=fails] exit 7\n")
    res = gpurun("queue", "submit", q, "--wait")
    assert res.returncode == 1, res.stderr          # one job failed -> --wait exits non-zero
    jobs = {j["name"]: j for j in status_json()["jobs"]}
    assert jobs["env"]["state"] == "succeeded" and jobs["fails"]["exit_code"] == 7
    log = open(jobs["env"]["log"]).read()
    jid, run_dir, cvd = log.splitlines()[1].split("|")
    assert jid == jobs["env"]["id"] and run_dir == jobs["env"]["run_dir"] and cvd == "unset"
    assert "read-rc=1" in log                          # stdin is /dev/null: EOF, never a hang


def test_cancel_running_job_terminates_its_process_group(home, tmp_path):
    marker = tmp_path / "child.pid"
    q = _write(tmp_path, f"[name=long] sleep 300 & echo $! > {marker}; wait\n")
    assert gpurun("queue", "submit", q).returncode == 0
    deadline = time.time() + 20
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.1)
    child = int(marker.read_text())
    res = gpurun("queue", "cancel", "long")
    assert res.returncode == 0 and "stopping" in res.stdout
    st = wait_terminal(timeout=30)
    assert st["jobs"][0]["state"] == "cancelled"
    time.sleep(0.2)
    assert not _alive(child), "the job's background child must die with its group"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


def test_timeout_and_retry_budget(home, tmp_path):
    q = _write(tmp_path, "[name=slow timeout=1 retries=1] sleep 30\n[name=flaky retries=2] "
                         "test -f $GPURUN_RUN_DIR/ok || { touch $GPURUN_RUN_DIR/ok; exit 3; }\n")
    res = gpurun("queue", "submit", q, "--wait", "--json")
    out = {j["name"]: j for j in json.loads(res.stdout)["jobs"]}
    assert out["slow"]["state"] == "failed" and out["slow"]["attempt"] == 2
    assert "timeout" in out["slow"]["reason"]
    assert out["flaky"]["state"] == "succeeded" and out["flaky"]["attempt"] == 2


def test_one_job_per_fake_gpu_with_cuda_visible_devices(home, tmp_path, monkeypatch):
    monkeypatch.setenv("GPURUN_FAKE_GPUS", "2")
    # each job prints its GPU and its own process's start and end (the store's started_at/ended_at
    # are whole seconds, and ended_at is when the exit code was settled, after the next job began)
    lines = "".join(f"[name=g{i}] echo gpu=$CUDA_VISIBLE_DEVICES t0=$(date +%s.%N); sleep 0.5; echo t1=$(date +%s.%N)\n"
                    for i in range(4))
    lines += "[name=big gpus=2] echo $CUDA_VISIBLE_DEVICES\n[name=huge gpus=3] echo never\n"
    res = gpurun("queue", "submit", _write(tmp_path, lines), "--wait", "--json")
    jobs = {j["name"]: j for j in json.loads(res.stdout)["jobs"]}
    for i in range(4):
        assert len(jobs[f"g{i}"]["gpu_ids"]) == 1
    assert jobs["big"]["gpu_ids"] == [0, 1] and "0,1" in open(jobs["big"]["log"]).read()
    assert jobs["huge"]["state"] == "failed" and "needs 3 GPUs" in jobs["huge"]["reason"]
    # never more than 2 GPU jobs at once, and two at once on different GPUs
    spans = []
    for i in range(4):
        got = dict(w.split("=", 1) for w in open(jobs[f"g{i}"]["log"]).read().split()
                   if w.startswith(("gpu=", "t0=", "t1=")))
        spans.append((float(got["t0"]), float(got["t1"]), got["gpu"]))
    for t, _, gpu in spans:
        running = [g for a, b, g in spans if a <= t < b]
        assert len(running) <= 2 and len(set(running)) == len(running), spans



def test_jobs_survive_the_cli_and_the_agent_restart(home, tmp_path):
    q = _write(tmp_path, "[name=a] sleep 2; echo finished\n")
    assert gpurun("queue", "submit", q).returncode == 0     # the CLI process has exited now
    time.sleep(0.5)
    state_dir = home / ".local/share/gpurun/hosts/local/agent"
    pid = int((state_dir / "agent.pid").read_text())
    os.kill(pid, 9)                                          # agent dies; the job must not
    st = wait_terminal(timeout=30)                           # the next CLI call re-ensures the agent
    job = st["jobs"][0]
    assert job["state"] == "succeeded" and job["attempt"] == 1   # re-adopted, not restarted
    assert "finished" in open(job["log"]).read()


def test_retry_and_resubmit_idempotent(home, tmp_path):
    q = _write(tmp_path, "[name=x] exit 1\n[name=y] true\n[name=z] true\n")
    gpurun("queue", "submit", q, "--wait")
    again = gpurun("queue", "submit", q, "--json")
    assert json.loads(again.stdout)["added"] == []
    res = gpurun("queue", "retry", "x")
    assert res.returncode == 0 and "attempt 2" in res.stdout
    st = wait_terminal()
    x = [j for j in st["jobs"] if j["name"] == "x"][0]
    assert x["state"] == "failed" and x["attempt"] == 2
    bad = gpurun("queue", "retry", "nope")
    assert bad.returncode == 2 and "no job 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_events_show_a_jobs_history_newest_last(home, tmp_path):
    q = _write(tmp_path, "[name=f retries=1] exit 2\n")
    gpurun("queue", "submit", q, "--wait")
    res = gpurun("queue", "events", "f", "--json")
    assert res.returncode == 0, res.stderr
    evs = json.loads(res.stdout)["events"]
    assert [e["data"].get("to") for e in evs if e["kind"] == "state"] == [
        "running", "queued", "running", "failed"]
    assert [e["kind"] for e in evs if e["severity"] in ("warn", "error")] == ["retry", "failed"]
    last = json.loads(gpurun("queue", "events", "f", "--limit", "1", "--json").stdout)["events"]
    assert len(last) == 1 and last[0]["id"] == evs[-1]["id"]
    text = gpurun("queue", "events", "f").stdout
    assert "retrying (1 of 1 retries used)" in text


def test_cuda_oom_is_held_with_its_class_in_status_events_and_json(home, tmp_path):
    """A CUDA OOM (a stand-in raising torch's real exception text) is not retried by itself:
    failed, "waiting for `gpurun queue retry`", its class on the wire, the table and events."""
    pkg = tmp_path / "standin" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("class OutOfMemoryError(RuntimeError):\n    pass\n")
    (tmp_path / "train.py").write_text(
        "import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 1.1 GiB is free.')\n")
    q = _write(tmp_path, f"[name=big retries=2 env.PYTHONPATH={tmp_path / 'standin'}] "
                         f"python3 {tmp_path / 'train.py'}\n")
    res = gpurun("queue", "submit", q, "--wait", "--json")
    out = json.loads(res.stdout)
    assert "jobs" in out, (res.returncode, res.stdout, res.stderr)  # an error object says why
    job = out["jobs"][0]
    assert job["state"] == "failed" and job["attempt"] == 1, job       # retries=2, yet held
    assert job["failure_class"] == "cuda_oom" and "Tried to allocate 2.00 GiB" in job["failure_hint"]
    assert "waiting for `gpurun queue retry big`" in job["reason"]
    line = gpurun("queue", "status").stdout.splitlines()[-1]             # piped: one plain line
    assert line.endswith("[cuda_oom]") and "waiting for `gpurun queue retry big`" in line
    failed = [e for e in json.loads(gpurun("queue", "events", "big", "--json").stdout)["events"]
              if e["kind"] == "failed"]
    assert failed[-1]["data"]["failure_class"] == "cuda_oom" and "batch size" in failed[-1]["message"]
    assert gpurun("queue", "retry", "big").returncode == 0                # the user's retry runs it again
    assert wait_terminal()["jobs"][0]["attempt"] == 2


def _wait_file(path, timeout: float = 20.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError("%s never written" % path)


def test_forked_wrapper_is_its_own_session_marked_and_outlives_the_agent(home, tmp_path):
    """The wrapper the daemon forks (no second Python start) is what an exec'd one was: a
    session leader whose /proc environ carries the marker, holding none of the daemon's
    files (its lock would keep the next daemon out), and it outlives a kill -9 of the agent,
    whose successor adopts it and records its exit code."""
    go = tmp_path / "go"
    q = _write(tmp_path, f"[name=w] while [ ! -e {go} ]; do sleep 0.05; done; exit 3\n")
    assert gpurun("queue", "submit", q).returncode == 0
    state_dir = home / ".local/share/gpurun/hosts/local/agent"
    job = status_json()["jobs"][0]
    wpid = int(_wait_file(Path(job["run_dir"]) / "started.1"))
    agent = int((state_dir / "agent.pid").read_text())
    assert os.getsid(wpid) == wpid and os.getsid(wpid) != os.getsid(agent)
    environ = open(f"/proc/{wpid}/environ", "rb").read().split(b"\0")
    assert f"GPURUN_JOB_TOKEN={job['id']}:1".encode() in environ
    assert f"GPURUN_RUN_DIR={job['run_dir']}".encode() in environ
    assert open(f"/proc/{wpid}/cmdline", "rb").read().startswith(b"gpurun-jobwrap\0")   # forked, not exec'd
    held = [os.readlink(f"/proc/{wpid}/fd/{fd}") for fd in os.listdir(f"/proc/{wpid}/fd")]
    assert not [p for p in held if p.startswith(str(state_dir)) and "/runs/" not in p], held
    os.kill(agent, 9)
    time.sleep(0.2)
    assert _alive(wpid)                                    # the job's wrapper lives on
    st = status_json()                                     # a new daemon: the lock was free
    assert int((state_dir / "agent.pid").read_text()) != agent
    assert st["jobs"][0]["state"] == "running"
    go.write_text("")
    done = wait_terminal(timeout=30)["jobs"][0]
    assert done["state"] == "failed" and done["exit_code"] == 3 and done["attempt"] == 1, done
