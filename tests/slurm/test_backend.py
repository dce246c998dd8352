"""A Slurm cluster as a gpurun host, end to end (issue 13, "Done when"), through the real CLI,
the loopback sshd and the one-node cluster: a 12-job queue becomes 12 Slurm jobs; status shows
their states and exit codes; the wrapper's quality check stops a job whose loss goes NaN, and a
``scontrol requeue`` of it is refused by the resume gate (its command does not start again);
``queue cancel`` reaches ``scancel``; logs and pull work; no agent daemon ever runs on the login
node, and ``down`` stops nothing there and says so."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, job_events
from rigs.slurm import SlurmRig, ssh_as
from rigs.sshd import CLEAN_USER, SshdRig

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

OK = 8
QUEUE = "\n".join([
    # loss falls for 30 steps, then NaN: the check in the allocation stops it (it would sleep 300 s)
    '[name=diverge gpus=0 metrics=nan.jsonl] echo start >> starts-diverge.txt; '
    'for s in $(seq 1 30); do echo "{\\"step\\": $s, \\"loss\\": 2.$((70 - s))}"; done >> nan.jsonl; '
    'for s in $(seq 31 36); do echo "{\\"step\\": $s, \\"loss\\": NaN}"; done >> nan.jsonl; sleep 300',
    "[name=long gpus=0] echo long-started; sleep 300",
    *["[name=ok-%d gpus=0 checkpoints=ck-%d] mkdir -p ck-%d && echo weights-%d > ck-%d/step_%d.pt && echo done %d"
      % ((i,) * 7) for i in range(OK)],
    '[name=gpu gpus=1] echo "gpus=$CUDA_VISIBLE_DEVICES"',
    "[name=exit3 gpus=0] echo failing; exit 3",
]) + "\n"


def jobs(host: str = "cluster") -> dict:
    res = gpurun("queue", "status", "--host", host, "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    return {j["name"]: j for j in json.loads(res.stdout)["jobs"]}


def wait_for(what: str, pred, timeout: float = 120.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(every)


def squeue_states(sshd: SshdRig, ids: list) -> dict:
    out = ssh_as(sshd, CLEAN_USER, "squeue -h -t all -o '%i|%T'").stdout
    rows = dict(line.split("|", 1) for line in out.split())
    return {i: rows.get(i) for i in ids}


def test_twelve_jobs_on_slurm(slurm_ssh_host: dict, sshd: SshdRig, slurm_cluster: SlurmRig,
                              tmp_path: Path) -> None:
    host = slurm_ssh_host
    state_dir, work = Path(host["state_dir"]), Path(host["workdir"])
    q = tmp_path / "q.txt"
    q.write_text(QUEUE)
    res = gpurun("queue", "submit", str(q), "--host", "cluster", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    first = jobs()
    assert len(first) == 12 and all(j["backend_id"] and j["backend_id"].isdigit() for j in first.values()), first
    seen = squeue_states(sshd, [j["backend_id"] for j in first.values()])
    assert all(seen.values()), seen  # squeue lists every one of them
    bid = {n: j["backend_id"] for n, j in first.items()}

    # queue cancel reaches scancel: the running job is gone from Slurm's queue, the row cancelled
    wait_for("long to run", lambda: jobs()["long"]["state"] == "running", 120)
    res = gpurun("queue", "cancel", "long", "--host", "cluster")
    assert res.returncode == 0, res.stderr
    assert slurm_cluster.wait_state(bid["long"], {"CANCELLED", "COMPLETED", "FAILED"}) == "CANCELLED"
    assert squeue_states(sshd, [bid["long"]])[bid["long"]] not in ("PENDING", "RUNNING")
    assert wait_for("long cancelled", lambda: jobs()["long"]["state"] == "cancelled", 60)

    # the NaN run is stopped by the wrapper's check inside the allocation
    diverge = wait_for("diverge stopped", lambda: (lambda j: j if j["state"] == "quality_stopped" else None)(
        jobs()["diverge"]), 150)
    assert diverge["quality"]["verdict"] == "STOP" and diverge["quality"]["rule"], diverge["quality"]
    assert diverge["attempt"] == 1
    run_dir = state_dir / "runs" / diverge["id"]
    assert json.loads((run_dir / "exit.1").read_text())["stop_cause"] == "quality"
    assert (work / "starts-diverge.txt").read_text() == "start\n"

    # scontrol requeue of it: the wrapper's resume gate refuses, the command does not start again
    slurm_cluster.requeue_now(bid["diverge"],
                              lambda: ssh_as(sshd, CLEAN_USER, "scontrol requeue %s" % bid["diverge"]))

    def refused_yet() -> bool:
        if (run_dir / "exit.2").exists():
            return True
        if slurm_cluster.job_info(bid["diverge"]).get("Reason") == "BeginTime":
            slurm_cluster.start_now(bid["diverge"])  # a requeue that landed after our StartTime=now
        return False
    wait_for("the gate's refusal", refused_yet, 90)
    gate = json.loads((run_dir / "gate.2").read_text())
    assert "quality" in gate["why"]
    refused = wait_for("the refusal event", lambda: [e for e in job_events("diverge", "cluster")
                                                     if "requeue refused by the resume gate" in e["message"]], 30)
    assert len(refused) == 1
    assert (work / "starts-diverge.txt").read_text() == "start\n"  # one start only
    assert jobs()["diverge"]["state"] == "quality_stopped"

    # everything ends; states and exit codes as the commands made them
    final = wait_for("all terminal", lambda: (lambda js: js if all(
        j["state"] not in ("queued", "running") for j in js.values()) else None)(jobs()), 240, every=1.0)
    for i in range(OK):
        j = final["ok-%d" % i]
        assert (j["state"], j["exit_code"]) == ("succeeded", 0), j
        started = json.loads((state_dir / "runs" / j["id"] / "started.1").read_text())
        assert started["slurm_job_id"] == j["backend_id"]  # it ran as that Slurm job
    assert (final["exit3"]["state"], final["exit3"]["exit_code"]) == ("failed", 3), final["exit3"]
    assert final["gpu"]["state"] == "succeeded"
    assert final["diverge"]["state"] == "quality_stopped" and final["long"]["state"] == "cancelled"
    assert len({j["backend_id"] for j in final.values()}) == 12

    # logs: the job's own output, through the same verb as any host
    res = gpurun("queue", "logs", "gpu", "--host", "cluster")
    assert res.returncode == 0 and "gpus=0" in res.stdout, (res.stdout, res.stderr)  # Slurm's gres GPU
    res = gpurun("queue", "logs", "exit3", "--host", "cluster")
    assert res.returncode == 0 and "failing" in res.stdout, res.stderr

    # retry: the resume gate first (the NaN run is refused, exit 3), else a new sbatch
    refused = gpurun("queue", "retry", "diverge", "--host", "cluster")
    assert refused.returncode == 3 and "quality gate" in refused.stderr, refused.stderr
    assert gpurun("queue", "retry", "exit3", "--host", "cluster").returncode == 0
    again = wait_for("exit3 again", lambda: (lambda j: j if j["state"] == "failed" and j["attempt"] == 2 else None)(
        jobs()["exit3"]), 120)
    assert again["exit_code"] == 3 and again["backend_id"] != final["exit3"]["backend_id"]

    # pull: every artifact home, verified
    dest = tmp_path / "home"
    res = gpurun("pull", "--host", "cluster", "--dest", str(dest), "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {r["job"]: r for r in json.loads(res.stdout)["jobs"]}
    for i in range(OK):
        jid = final["ok-%d" % i]["id"]
        assert rows[jid]["verified"], rows[jid]
        got = list(dest.rglob("step_%d.pt" % i))
        assert len(got) == 1 and got[0].read_text() == "weights-%d\n" % i
    assert list(dest.rglob("PULL_VERIFIED.json"))

    # no agent daemon on the login node, at any point: Slurm is the queue
    assert not (state_dir / "agent.pid").exists()
    pg = subprocess.run(["pgrep", "-u", CLEAN_USER, "-f", "daemon --state-dir %s" % state_dir],
                        capture_output=True, text=True)
    assert pg.returncode == 1, pg.stdout
    res = gpurun("watch", "--host", "cluster", "--once", "--json")
    assert res.returncode == 0, res.stderr
    (watched,) = json.loads(res.stdout)["hosts"]
    assert watched["ok"] and watched["finished_total"] == 12, watched  # every job ended, seen through snapshot
    res = gpurun("agent", "status", "--host", "cluster")
    assert res.returncode == 0 and "no daemon (a Slurm host" in res.stdout, (res.stdout, res.stderr)

    # down: nothing to stop on a cluster (fairshare), and it says so
    res = gpurun("down", "cluster", "--yes", "--dest", str(dest))
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "no meter" in (res.stdout + res.stderr), (res.stdout, res.stderr)


def test_sbatch_refusal_is_a_scheduler_error_and_the_job_waits(slurm_ssh_host: dict, tmp_path: Path) -> None:
    q = tmp_path / "q.txt"
    q.write_text("[name=huge gpus=3] echo never\n")  # the node has 2 GPUs: sbatch refuses
    res = gpurun("queue", "submit", str(q), "--host", "cluster")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "sbatch refused the job" in res.stderr and "Requested node configuration is not available" in res.stderr
    (j,) = jobs().values()
    assert j["state"] == "queued" and j["backend_id"] is None  # the next command tries again
    assert "sbatch refused" in (j["reason"] or "")
    res = gpurun("queue", "cancel", "huge", "--host", "cluster")
    assert res.returncode == 0, res.stderr
    assert jobs()["huge"]["state"] == "cancelled"


def test_fleet_release_takes_back_only_what_slurm_has_not_started(slurm_ssh_host: dict, sshd: SshdRig,
                                                                   slurm_cluster: SlurmRig, tmp_path: Path) -> None:
    """A rebalance's ``release`` on a Slurm host: a pending Slurm job is held, scancel'd and
    moved; a running one is refused and runs on (a job never runs on two hosts)."""
    from orchestrator.core.session import open_session

    q = tmp_path / "q.txt"
    # the node runs two 1-CPU jobs at once: a third pends behind them
    q.write_text("".join("[name=r%d gpus=0 partition=debug] echo ran-%d >> ran.txt; sleep 20\n" % (i, i)
                         for i in range(3)))
    assert gpurun("queue", "submit", str(q), "--host", "cluster").returncode == 0
    running = wait_for("two running", lambda: (lambda js: js if sum(
        j["state"] == "running" for j in js.values()) == 2 else None)(jobs()), 120)
    (pending,) = [j for j in running.values() if j["state"] == "queued"]
    with open_session("cluster") as s:
        res = s.release([j["id"] for j in running.values()], "elsewhere")
    assert [r["id"] for r in res["released"]] == [pending["id"]]
    assert res["released"][0]["slurm"] == {"partition": "debug"}  # its queue line's options go with it
    assert sorted(r["id"] for r in res["refused"]) == sorted(j["id"] for j in running.values() if j is not pending)
    assert slurm_cluster.wait_state(pending["backend_id"], {"CANCELLED"}, timeout=30) == "CANCELLED"
    after = jobs()
    assert after[pending["name"]]["state"] == "moved" and after[pending["name"]]["backend_id"] is None
    ran = Path(slurm_ssh_host["workdir"]) / "ran.txt"
    assert pending["name"].replace("r", "ran-") not in ran.read_text()  # it never ran here
    # --yes: without it (no terminal) --all is refused, and the two sleep-20 jobs would hold the
    # node's two CPUs for the tests after this one
    res = gpurun("queue", "cancel", "--all", "--yes", "--host", "cluster")
    assert res.returncode == 0, res.stderr


def test_submit_wait_gets_each_jobs_last_word(slurm_ssh_host: dict, tmp_path: Path) -> None:
    """``--wait`` on a Slurm host: no daemon gives the final quality checks, the verbs do
    (reconcile); a job that logged metrics ends with a final record, and exit 1 says one failed."""
    q = tmp_path / "q.txt"
    q.write_text('[name=m gpus=0 metrics=m.jsonl] for s in $(seq 1 30); do echo "{\\"step\\": $s, '
                 '\\"loss\\": 2.$((70 - s))}"; done > m.jsonl\n'
                 "[name=f gpus=0] exit 4\n")
    started = time.monotonic()
    res = gpurun("queue", "submit", str(q), "--host", "cluster", "--wait", "--json", timeout=240)
    assert res.returncode == 1, (res.stdout, res.stderr)
    final = {j["name"]: j for j in json.loads(res.stdout)["jobs"]}
    assert (final["m"]["state"], final["f"]["state"], final["f"]["exit_code"]) == ("succeeded", "failed", 4)
    assert final["m"]["quality"]["final"] is True and final["m"]["quality"]["verdict"] == "CONTINUE", final["m"]
    assert time.monotonic() - started < 120  # judged by the verbs, not after the 60 s grace


def test_a_big_queue_goes_in_as_one_array(slurm_ssh_host: dict, sshd: SshdRig, slurm_cluster: SlurmRig,
                                          tmp_path: Path) -> None:
    """20 jobs with the same sbatch options: one ``sbatch --array``; each task runs its own job
    (ids ``A_0`` .. ``A_19``), is reconciled through ``squeue -r`` and can be cancelled alone."""
    n = 20
    q = tmp_path / "q.txt"
    q.write_text("".join("[name=t%02d gpus=0] echo task-%d\n" % (i, i) for i in range(n - 1))
                 + "[name=t19 gpus=0] sleep 300\n")
    assert gpurun("queue", "submit", str(q), "--host", "cluster").returncode == 0
    first = jobs()
    arrays = {j["backend_id"].split("_")[0] for j in first.values()}
    assert len(arrays) == 1, arrays  # one sbatch
    assert sorted(int(j["backend_id"].split("_")[1]) for j in first.values()) == list(range(n))
    res = gpurun("queue", "cancel", "t19", "--host", "cluster")
    assert res.returncode == 0, res.stderr
    final = wait_for("all terminal", lambda: (lambda js: js if all(
        j["state"] not in ("queued", "running") for j in js.values()) else None)(jobs()), 240, every=1.0)
    assert final["t19"]["state"] == "cancelled"
    res = gpurun("queue", "logs", "t00", "--host", "cluster")   # the CLI's logs of an array task
    assert "task-0\n" in res.stdout, res.stdout
    from orchestrator.core.session import open_session
    with open_session("cluster") as s:   # every task's own log, through the same verb on one connection
        for i in range(n - 1):
            j = final["t%02d" % i]
            assert (j["state"], j["exit_code"]) == ("succeeded", 0), j
            assert "task-%d\n" % i in s.logs(j["name"], -1, tail_lines=100)["data"], j
            started = json.loads((Path(slurm_ssh_host["state_dir"]) / "runs" / j["id"] / "started.1").read_text())
            assert started["slurm_job_id"] == j["backend_id"]
