"""What the Slurm test rig (``rigs/slurm.py``) writes and the process helpers it uses:
``slurm.conf`` and ``gres.conf`` text, the fake GPU devices, atomic writes, pid checks.

The settings and why: ``MinJobAge`` keeps a finished job in ``scontrol show job`` (and
``squeue -t all``) for 30 s after it left the pending/running list, as on a real cluster;
``KillWait=5`` (scancel and the time limit: SIGTERM, SIGKILL 5 s later; clusters use 30) keeps
tests short; ``CR_CPU`` makes each CPU a slot whatever the core layout; accounting is off.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import stat
import time
from pathlib import Path


ETC = Path("/etc/slurm")
SLURM_CONF = ETC / "slurm.conf"
GRES_CONF = ETC / "gres.conf"
PARTITION = "debug"
GPUS = 2
MIN_JOB_AGE = 30
KILL_WAIT = 5


def render_conf(node: str, r: Path, ctld_port: int, slurmd_port: int, munge_socket: str) -> str:
    """The rig's slurm.conf for node ``node`` with state, spool and logs under ``r`` (the first
    line marks the file as the rig's: a crashed rig's leftover is not backed up as the
    machine's own)."""
    return "\n".join([
        "# written by gpurun's test rig (tests/rigs/slurm.py); the previous file is restored",
        "ClusterName=gpurunrig",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={r}/spool",
        f"SlurmctldPidFile={r}/slurmctld.pid",
        f"SlurmdPidFile={r}/slurmd.pid",
        f"SlurmctldLogFile={r}/slurmctld.log",
        f"SlurmdLogFile={r}/slurmd.log",
        # no systemd, no cgroups in the sandbox
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        # CR_CPU: each CPU is a slot whatever the core/thread layout of the machine
        "SelectTypeParameters=CR_CPU",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        # a CI box with less memory or other CPUs than declared keeps the node usable
        "SlurmdParameters=config_overrides",
        f"MinJobAge={MIN_JOB_AGE}",
        f"KillWait={KILL_WAIT}",
        "InactiveLimit=0",
        "SchedulerType=sched/backfill",
        # schedule at each submit and job end instead of a 3 s cycle: the job-to-job gap goes
        # from 2.5 s to 0.5 s (tests wait less; a bench sees the wrapper's own cost), sbatch
        # costs ~1.5 ms more per job
        "SchedulerParameters=batch_sched_delay=0",
        "GresTypes=gpu",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 "
        f"Gres=gpu:{GPUS} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def render_gres(node: str, r: Path) -> str:
    """gres.conf: ``GPUS`` fake GPUs, the devices ``fake_gpu`` made under ``r/dev``."""
    last = GPUS - 1
    return (f"# written by gpurun's test rig\nAutoDetect=off\n"
            f"NodeName={node} Name=gpu File={r}/dev/gpu[0-{last}]\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own exited child) is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def fake_gpu(path: Path) -> bool:
    """A character device like /dev/null (major 1, minor 3): slurmd only sets
    CUDA_VISIBLE_DEVICES for gres files that are devices. A plain file where mknod is refused
    (the gres count is still scheduled, without the variable)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return True
    except OSError:
        path.touch()
        return False


def is_ours(path: Path) -> bool:
    try:
        return "gpurun's test rig" in path.read_text().split("\n", 1)[0]
    except OSError:
        return False


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def wait_gone(pid: int, timeout: float) -> None:
    deadline, killed = time.monotonic() + timeout, False
    while True:
        try:  # reap it if it is our own child (else it stays a zombie until we exit)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not alive(pid):
            return
        if time.monotonic() > deadline:
            if killed:
                return
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            deadline, killed = deadline + 5, True
        time.sleep(0.05)


def conf_digest() -> str:
    """A short digest of the current slurm.conf (for bench reports)."""
    try:
        return hashlib.sha256(SLURM_CONF.read_bytes()).hexdigest()[:12]
    except OSError:
        return "-"
