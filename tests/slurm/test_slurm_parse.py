"""The Slurm backend's pure parts, on output captured from the real 22.05 tools (``captured/``):
squeue and scontrol parsing, the batch script and its options, and where a job's options come
from (profile < host < queue line). The end-to-end path is ``test_backend.py``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from orchestrator.agent import slurm
from orchestrator.errors import QueueFileError
from orchestrator.queuefile import parse_text

CAPTURED = Path(__file__).parent / "captured"


def test_squeue_lines_become_states_and_reasons() -> None:
    rows = slurm.parse_squeue((CAPTURED / "squeue-all.txt").read_text())
    assert rows["24"] == ("PENDING", "Resources")
    assert rows["22"] == ("RUNNING", "None")
    assert rows["21"] == ("FAILED", "BadConstraints")
    assert rows["14"][0] == "COMPLETED" and "COMPLETED" in slurm.ENDED and "PENDING" in slurm.WAITING
    assert slurm.parse_squeue("") == {}


def test_scontrol_line_gives_state_and_exit_code() -> None:
    done = slurm.parse_scontrol((CAPTURED / "scontrol-completed.txt").read_text())
    assert done["JobId"] == "20" and done["JobState"] == "COMPLETED" and done["Requeue"] == "1"
    assert slurm.exit_code_of(done["ExitCode"]) == (0, None)
    cancelled = slurm.parse_scontrol((CAPTURED / "scontrol-cancelled.txt").read_text())
    assert cancelled["JobState"] == "CANCELLED"
    assert slurm.exit_code_of(cancelled["ExitCode"]) == (143, None)
    assert slurm.exit_code_of("0:9") == (None, 9)  # killed by SIGKILL
    assert slurm.parse_scontrol("") == {}


def _job(tmp_path: Path, **kw) -> dict:
    job = {"id": "abc123", "name": "lr 3e-4/seed=1", "run_dir": str(tmp_path / "runs/abc123"), "gpus": 0,
           "timeout_s": None, "command": "python train.py", "attempt": 0}
    job.update(kw)
    return job


def test_batch_script_carries_options_and_only_the_wrapper(tmp_path: Path) -> None:
    cfg = {"slurm": {"partition": "gpu", "account": "lab42", "gres": "gpu:a100", "extra": ["--mem=32G"],
                     "time_default": "4h"}}
    job = _job(tmp_path, gpus=2, timeout_s=90.0)
    opts = slurm.sbatch_options(job, cfg, {"partition": "debug", "qos": "short"})
    assert "--job-name=gpurun-lr_3e-4_seed_1" in opts
    assert "--gres=gpu:a100:2" in opts and "--cpus-per-task=1" not in opts
    assert "--time=2" in opts  # 90 s rounds up to whole minutes
    assert "--partition=debug" in opts and "--account=lab42" in opts and "--qos=short" in opts  # the line wins
    assert "--requeue" in opts and "--mem=32G" in opts
    assert "--output=%s/slurm-%%j.out" % job["run_dir"] in opts
    text = slurm.batch_script(opts, "/usr/bin/python3", "/st/bin/agent-x/__main__.py", "/st dir", ["abc123"])
    lines = text.splitlines()
    assert lines[0] == "#!/bin/sh" and all(ln.startswith("#SBATCH ") for ln in lines[1:len(opts) + 1])
    assert shlex.split(lines[-1]) == ["exec", "/usr/bin/python3", "/st/bin/agent-x/__main__.py", "slurmjob",
                                      "--state-dir", "/st dir", "--job", "abc123"]
    assert "python train.py" not in text  # the command lives in spec.json, never in the script


def test_an_array_script_runs_task_i_as_job_i(tmp_path: Path) -> None:
    import subprocess

    text = slurm.batch_script(["--array=0-2"], "echo", "agent", "/st", ["j0", "j1", "j'2"])
    script = tmp_path / "a.sbatch"
    script.write_text(text)
    for i, want in enumerate(["j0", "j1", "j'2"]):
        out = subprocess.run(["sh", str(script)], env={"SLURM_ARRAY_TASK_ID": str(i), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True)
        assert out.stdout.split() == ["agent", "slurmjob", "--state-dir", "/st", "--job", want]
    bad = subprocess.run(["sh", str(script)], env={"SLURM_ARRAY_TASK_ID": "7", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no job for array task 7" in bad.stderr


def test_time_limit_from_timeout_else_the_profile_default(tmp_path: Path) -> None:
    assert slurm.time_limit(_job(tmp_path, timeout_s=3600), {}) == "60"
    assert slurm.time_limit(_job(tmp_path), {"slurm": {"time_default": "4h"}}) == "240"
    assert slurm.time_limit(_job(tmp_path), {"slurm": {"time_default": "1-12:00:00"}}) == "1-12:00:00"
    assert slurm.time_limit(_job(tmp_path), {}) is None
    cpu = slurm.sbatch_options(_job(tmp_path), {}, {})
    assert "--cpus-per-task=1" in cpu and not any(o.startswith(("--time", "--gres", "--partition")) for o in cpu)


def test_queue_line_options_travel_in_the_spec() -> None:
    (spec,) = parse_text("[name=a partition=gpu account=lab42 qos=short constraint=a100|h100] python t.py\n")
    assert spec.slurm == {"partition": "gpu", "account": "lab42", "qos": "short", "constraint": "a100|h100"}
    with pytest.raises(QueueFileError, match=r"<queue>:1: option partition='gpu a' is not a Slurm name"):
        parse_text('[partition="gpu a"] python t.py\n')


def test_profile_then_host_then_line(tmp_path: Path, isolated_home: Path) -> None:
    from orchestrator.core.client import host_config

    cfg = host_config({"name": "c", "profile": "slurm", "kind": "ssh", "slurm": {"partition": "long"}})
    assert cfg["scheduler"] == "slurm" and cfg["slurm"]["partition"] == "long" and cfg["slurm"]["gres"] == "gpu"
    assert slurm.job_options(_job(tmp_path), cfg, {}) == {"partition": "long"}
    assert slurm.job_options(_job(tmp_path), cfg, {"partition": "debug"}) == {"partition": "debug"}
    assert "scheduler" not in host_config({"name": "b", "profile": "generic-ssh", "kind": "ssh"})


def test_host_add_slurm_keys_are_checked_and_kept(isolated_home: Path) -> None:
    import json as _json

    from orchestrator import hosts
    from rigs.agents import gpurun, one_error

    res = gpurun("host", "add", "c1", "--profile", "slurm", "--ssh", "u@127.0.0.1:22", "--insecure-host-key",
                 "--slurm", "partition=gpu", "--slurm", "account=lab42")
    assert res.returncode == 0, res.stderr
    entry = hosts.get_host("c1")
    assert entry["kind"] == "ssh" and entry["profile"] == "slurm"  # reached over SSH like any host
    assert entry["slurm"] == {"partition": "gpu", "account": "lab42"}
    assert "no meter" not in _json.dumps(entry)
    bad = one_error(gpurun("host", "add", "c2", "--profile", "slurm", "--ssh", "u@127.0.0.1:22",
                           "--insecure-host-key", "--slurm", "partition=a b"))
    assert "--slurm 'partition': 'a b' is not letters" in bad
    assert "is for Slurm hosts" in one_error(gpurun("host", "add", "c3", "--ssh", "u@127.0.0.1:22",
                                                    "--insecure-host-key", "--slurm", "partition=x"))


def test_only_gpurun_jobs_are_read_from_squeue() -> None:
    text = "7|RUNNING|None|gpurun-lr3\n8|PENDING|Priority|my-own-job\n9_2|PENDING|None|gpurun-a+19\n"
    assert slurm.parse_squeue(text) == {"7": ("RUNNING", "None"), "9_2": ("PENDING", "None")}


def test_setup_accepts_a_clusters_shared_home_for_a_slurm_host(isolated_home: Path) -> None:
    """The same probe that refuses an NFS state dir on a lab box passes on a Slurm host, whose
    compute nodes must share it (only the login node opens the store)."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from test_setup import checks_of, path_row, probe_doc  # the setup tests' probe doc

    from orchestrator.core.setup_checks import analyse
    from orchestrator.profiles import load_profile

    doc = probe_doc(paths=[path_row("~/.gpurun/state", "/data/shared/home")], nvidia_smi=None)
    lab = analyse(doc, load_profile("generic-ssh"), {"name": "lab"}, {"state_dir": "~/.gpurun/state"})
    assert lab["refusal"]
    hpc = analyse(doc, load_profile("slurm"), {"name": "hpc"}, {"state_dir": "~/.gpurun/state"})
    assert not hpc["refusal"] and checks_of(hpc)["state dir"]["status"] == "ok"
    assert "shared with the compute nodes" in checks_of(hpc)["state dir"]["detail"]
