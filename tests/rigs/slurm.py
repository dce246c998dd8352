"""A real one-node Slurm cluster (Debian ``slurm-wlm`` 22.05 + ``munge``) for tests and benches.

``SlurmRig`` runs munged (as the munge user, on its own socket), ``slurmctld -i`` and ``slurmd``
with a generated ``/etc/slurm/slurm.conf`` (the default path, so an ordinary user's ``sbatch``
over the loopback sshd finds it without ``SLURM_CONF``) on free ports, and waits until the node
is idle. The node has CPUs=2 and two fake GPUs (``Gres=gpu:2``; gres.conf points at two
character devices under the rig dir that are /dev/null), so ``--gres=gpu:N`` is scheduled for
real and Slurm sets ``CUDA_VISIBLE_DEVICES``.

One cluster serves every test process on the machine: /etc/slurm/slurm.conf is a single path,
and helpers run pytest in parallel here. ``start()`` attaches to a healthy running rig (a state
file under a flock records its pids, ports and holders) or starts a fresh one; ``close()``
detaches and the last holder stops the daemons and restores the slurm.conf/gres.conf that were
there before. Tests must therefore find their own jobs by id, never assume an empty queue.

Settings worth knowing (``rigs/slurm_files.py`` writes them): ``MinJobAge=30`` (a finished job leaves ``squeue``
after its state is final but ``scontrol show job ID`` still answers for ~30 s, like a real
cluster; accounting is off, so ``sacct`` has nothing), ``KillWait=5`` (scancel / time limit:
SIGTERM, SIGKILL 5 s later; real clusters use 30), ``sched/backfill`` with
``batch_sched_delay=0`` (job-to-job gap ~0.5 s instead of Slurm's 3 s cycle). A requeued job
(``scontrol requeue``) is held back ~120 s by Slurm itself; ``start_now(id)`` lifts that.

``python tests/rigs/slurm.py up|down [--force]|status`` starts or stops the rig by hand (as
root): ``up`` holds it until ``down``, which stops it once no test session holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

if not __package__:  # run as a script (`python tests/rigs/slurm.py up`): make `rigs` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rigs.slurm_files import (ETC, GPUS, GRES_CONF, KILL_WAIT, MIN_JOB_AGE,  # noqa: F401 (re-exported)
                               PARTITION, SLURM_CONF, alive, atomic_write, fake_gpu, free_port,
                               is_ours, render_conf, render_gres, wait_gone)

ROOT = Path("/var/tmp/gpurun-slurm-rig")  # shared by all rig users on the machine; mode 755

_BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel", "munged")


def slurm_available() -> str | None:
    """None if the rig can run here, else the reason it cannot."""
    missing = [b for b in _BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return f"Slurm not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the Slurm rig needs root (slurmd launches jobs as other users; munged runs as munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (reinstall the munge package)"
    return None


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmRig:
    """The machine's shared one-node cluster. ``start()`` / ``close()``; ``node``, ``partition``,
    ``run(argv)`` (a Slurm command as root), ``job_state(id)``, ``wait_state(id, states)``."""

    def __init__(self, root: Path = ROOT):
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.partition = PARTITION
        self.gpus = GPUS
        self.state: dict = {}
        self._attached = False

    # -- files -------------------------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.root / "rig.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        with open(self.root / "rig.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                self.state = json.loads(self._state_file.read_text()) if self._state_file.exists() else {}
            except ValueError:
                self.state = {}
            try:
                yield
            finally:
                tmp = self._state_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.state, indent=1))
                os.replace(tmp, self._state_file)
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> str:
        return str(self._munge_dir() / "munge.socket.2")

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> "SlurmRig":
        why = slurm_available()
        if why:
            raise RuntimeError(why)
        with self._locked():
            holders = [p for p in self.state.get("holders", []) if alive(p)]
            running = self._running()
            # a changed conf (a newer rig) restarts the cluster only when no one else uses it:
            # a restart would kill the jobs of a test session running beside this one
            if not running or (not holders and not self._conf_current()):
                self._stop_daemons()
                self._start_fresh(timeout)
            self.state["holders"] = holders + [os.getpid()]
        self._attached = True
        return self

    def close(self) -> None:
        if not self._attached:
            return
        self._attached = False
        with self._locked():
            holders = [p for p in self.state.get("holders", []) if alive(p)]
            if os.getpid() in holders:
                holders.remove(os.getpid())
            self.state["holders"] = holders
            if not holders:
                self._stop_daemons()

    def _running(self) -> bool:
        st = self.state
        if not st.get("ctld_port") or not all(alive(st.get(k)) for k in ("munged", "slurmctld", "slurmd")):
            return False
        return self.node_state() in ("idle", "mix", "alloc", "comp")

    def _conf_current(self) -> bool:
        st = self.state
        want = render_conf(self.node, self.root, st["ctld_port"], st["slurmd_port"], self.munge_socket)
        try:
            return SLURM_CONF.read_text() == want and GRES_CONF.read_text() == render_gres(self.node, self.root)
        except OSError:
            return False

    def _start_fresh(self, timeout: float) -> None:
        r = self.root
        for log in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            (r / log).unlink(missing_ok=True)
        for sub in ("state", "spool", "dev"):
            shutil.rmtree(r / sub, ignore_errors=True)
            (r / sub).mkdir(parents=True)
            os.chmod(r / sub, 0o755)  # jobs of ordinary users exec their script from the spool
        self.state["gpu_devices"] = all([fake_gpu(r / "dev" / f"gpu{i}") for i in range(GPUS)])
        self._start_munged()
        ctld, slurmd = free_port(), free_port()
        while slurmd == ctld:
            slurmd = free_port()
        ETC.mkdir(parents=True, exist_ok=True)
        backups = self.state.get("backups") or {}
        for path in (SLURM_CONF, GRES_CONF):
            # keep the machine's own file once; a crashed earlier rig left ours in place
            if str(path) not in backups:
                backups[str(path)] = path.read_text() if path.exists() and not is_ours(path) else None
        self.state["backups"] = backups
        atomic_write(SLURM_CONF, render_conf(self.node, self.root, ctld, slurmd, self.munge_socket))
        atomic_write(GRES_CONF, render_gres(self.node, self.root))
        self.state.update(ctld_port=ctld, slurmd_port=slurmd, node=self.node)
        self.state["slurmctld"] = self._spawn([_sbin("slurmctld"), "-D", "-i"], "slurmctld.out")
        self.state["slurmd"] = self._spawn([_sbin("slurmd"), "-D", "-N", self.node], "slurmd.out")
        deadline = time.monotonic() + timeout
        while self.node_state() != "idle":
            for name in ("slurmctld", "slurmd"):
                if not alive(self.state[name]):
                    raise RuntimeError(f"{name} exited; see {r}/{name}.log and {r}/{name}.out")
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.node} not idle after {timeout:.0f}s "
                                   f"(sinfo says {self.node_state()!r}); see {r}/*.log")
            time.sleep(0.2)

    def _start_munged(self) -> None:
        pid = self.state.get("munged")
        if alive(pid) and self._munge_works():
            return
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
        mdir = self._munge_dir()
        shutil.rmtree(mdir, ignore_errors=True)
        mdir.mkdir(parents=True)
        pw = pwd.getpwnam("munge")
        os.chown(mdir, pw.pw_uid, pw.pw_gid)
        os.chmod(mdir, 0o755)  # clients (any user's sbatch) connect to the socket inside
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "-c"], check=True,
                           capture_output=True)
        logf = open(self.root / "munged.out", "ab")
        proc = subprocess.Popen(
            ["runuser", "-u", "munge", "--", _sbin("munged"), "-F", f"--socket={self.munge_socket}",
             f"--pid-file={mdir}/munged.pid", f"--log-file={mdir}/munged.log",
             f"--seed-file={mdir}/munged.seed"],
            stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        self.state["munged"] = proc.pid
        deadline = time.monotonic() + 15
        while not self._munge_works():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start; see {self.root}/munged.out")
            time.sleep(0.1)

    def _munge_works(self) -> bool:
        try:
            cred = subprocess.run(["munge", "-n", "-S", self.munge_socket], capture_output=True,
                                  timeout=5)
            if cred.returncode:
                return False
            return subprocess.run(["unmunge", "-S", self.munge_socket], input=cred.stdout,
                                  capture_output=True, timeout=5).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _spawn(self, argv: list[str], out: str) -> int:
        logf = open(self.root / out, "ab")
        proc = subprocess.Popen(argv, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        logf.close()
        return proc.pid

    def _stop_daemons(self) -> None:
        """Cancel the cluster's jobs, stop slurmd, slurmctld and munged (those the state file
        names), restore the machine's own slurm.conf / gres.conf."""
        st = self.state
        if alive(st.get("slurmctld")):
            # the job steps outlive slurmd: end them through Slurm (SIGTERM, SIGKILL after KillWait)
            ids = self.run("squeue", "-h", "-o", "%A", timeout=10, check=False).stdout.split()
            if ids:
                self.run("scancel", *ids, timeout=30, check=False)
                deadline = time.monotonic() + KILL_WAIT + 10
                while time.monotonic() < deadline and self.run(
                        "squeue", "-h", "-t", "running,completing", "-o", "%A", timeout=10, check=False).stdout.strip():
                    time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = st.pop(name, None)
            # runuser forks munged: the recorded pid is runuser's, munged is in its session
            if alive(pid):
                try:
                    os.killpg(pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
                wait_gone(pid, 10)
        for path, text in (st.pop("backups", None) or {}).items():
            p = Path(path)
            if text is None:
                if p.exists() and is_ours(p):
                    p.unlink()
            else:
                atomic_write(p, text)
        st.pop("ctld_port", None)
        st.pop("slurmd_port", None)

    # -- what tests use ------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command as root (``rig.run("squeue", "-h")``)."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check)

    @property
    def fake_gpu_devices(self) -> bool:
        """True when the fake GPUs are devices (Slurm then sets CUDA_VISIBLE_DEVICES)."""
        return bool(self.state.get("gpu_devices"))

    def node_state(self) -> str:
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%t", timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.strip().splitlines()[0].strip() if out.strip() else ""

    def job_info(self, job_id: str | int) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict ({} once Slurm forgot the job)."""
        res = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if res.returncode:
            return {}
        info: dict[str, str] = {}
        for tok in res.stdout.split():
            key, sep, val = tok.partition("=")
            if sep and key not in info:
                info[key] = val
        return info

    def job_state(self, job_id: str | int) -> str:
        return self.job_info(job_id).get("JobState", "")

    def wait_state(self, job_id: str | int, states: set[str] | tuple[str, ...],
                   timeout: float = 60) -> str:
        """Poll ``scontrol`` until the job reaches one of ``states``; returns it."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} still {state!r} after {timeout}s, wanted {sorted(states)}")

    def start_now(self, job_id: str | int) -> None:
        """Make a requeued job eligible at once: Slurm holds a requeued batch job back ~120 s
        (EligibleTime = requeue time + 121 s here), too long for a test."""
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def requeue_now(self, job_id: str | int, requeue, timeout: float = 60) -> None:
        """``requeue()`` an ended job and make it eligible at once. It waits for the job to leave
        COMPLETING first: a requeue during it is deferred to the end, and a ``StartTime=now``
        sent before then is overwritten by the requeue's own +121 s (a CI run waited it out)."""
        self.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                 "OUT_OF_MEMORY"}, timeout)
        requeue()
        state = self.wait_state(job_id, {"PENDING", "REQUEUED", "REQUEUE_HOLD", "RUNNING"}, timeout)
        if state != "RUNNING":
            self.start_now(job_id)

    def log_tail(self, n: int = 40) -> str:
        """The last lines of the daemons' logs (for assertion messages)."""
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = self.root / name
            if p.exists():
                out.append(f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)


def ssh_as(sshd, user: str, script: str, timeout: float = 60,
           check: bool = True) -> subprocess.CompletedProcess:
    """Run ``script`` (bash) as ``user`` over an ``SshdRig``; stdout/stderr as text. With
    ``check``, a non-zero exit raises AssertionError with both streams."""
    quoted = "'" + script.replace("'", "'\"'\"'") + "'"
    res = subprocess.run(sshd.ssh_argv(user, "bash", "-c", quoted), capture_output=True,
                         text=True, timeout=timeout)
    if check and res.returncode:
        raise AssertionError(f"ssh {user}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else "status"
    rig = SlurmRig()
    if verb == "up":
        # a holder that outlives this command: the rig stays up until `down`
        rig.start()
        with rig._locked():
            rig.state["holders"] = [p for p in rig.state["holders"] if p != os.getpid()] + [1]
        print(f"up: node {rig.node} {rig.node_state()}, conf {SLURM_CONF}, logs {rig.root}")
    elif verb == "down":
        # drop the by-hand holder; the cluster stops now unless a test session still holds it
        # (then the last one out stops it); `down --force` stops it whoever holds it
        with rig._locked():
            force = "--force" in sys.argv
            left = [p for p in rig.state.get("holders", []) if p != 1 and alive(p)]
            rig.state["holders"] = [] if force else left
            if force or not left:
                rig._stop_daemons()
        print("down" if force or not left else f"released; still held by pids {left}")
    else:
        with rig._locked():
            pass
        print(json.dumps(rig.state, indent=1), rig.node_state())
