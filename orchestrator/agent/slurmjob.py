"""The wrapper inside a Slurm allocation: one attempt of one gpurun job, from its spec.json.

The batch script (``agent/slurm.batch_script``) execs ``__main__.py slurmjob --state-dir DIR
--job ID``. The compute node never opens the SQLite store (it belongs to the login node's verb
processes): everything is read from ``runs/<id>/spec.json`` and everything this wrapper says is
a file in the run dir, written whole (temp + fsync + rename) or appended a line at a time:

    started.<n>   {node, pid, slurm_job_id, time, restart_count}   attempt n began
    gate.<n>      {why, data, time}         the resume gate refused attempt n (nothing ran)
    exit.<n>      {code, signal, stop_cause, time}                 attempt n ended
    quality.json  the latest verdict (``agent/quality_record`` shape; -> jobs.quality)
    quality-state.json   the check cadence record; events.jsonl   events for the store

Attempt n = spec.attempt_base + ``SLURM_RESTART_COUNT`` + 1. An attempt after the first (a
``scontrol requeue``, a node failure's requeue, a retry) passes the runner's resume gate
(``quality_hook.gate_refusal``) before the command runs; a STOP verdict recorded by this Slurm
job's earlier attempt refuses too. The command runs in its own process group with the job's
env (+ the secrets it asked for); a quality thread judges it on the daemon's cadence
(``quality_cadence.due`` + ``quality_hook.periodic_check``) and on STOP TERMs the group, KILL
after the grace. A TERM from Slurm (scancel, the time limit) is passed on to the group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Optional

from orchestrator.agent import jobwrap, procs
from orchestrator.agent.slurm import read_json, write_json

KILL_GRACE_S = 10.0


class FileRecords:
    """What ``quality_hook.periodic_check`` writes, kept as run-dir files instead of store rows
    (the login node's ``slurm_reconcile`` copies them into the store)."""

    def __init__(self, run_dir: str, job_id: str, attempt: int):
        self.run_dir, self.job_id, self.path = run_dir, job_id, run_dir
        self.kv: Dict[str, Any] = {}
        self.lock = threading.Lock()
        st = read_json(os.path.join(run_dir, "quality-state.json"))
        if isinstance(st, dict) and st.get("attempt") == attempt:
            self.kv["quality:%s" % job_id] = st

    def kv_get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def kv_set(self, key: str, value: Any) -> None:
        self.kv[key] = value
        if key == "quality:%s" % self.job_id:
            write_json(os.path.join(self.run_dir, "quality-state.json"), value)

    def add_event(self, job_id: Optional[str], kind: str, severity: str, message: str,
                  data: Optional[dict] = None) -> int:
        line = json.dumps({"ts": time.time(), "kind": kind, "severity": severity, "message": message,
                           "data": data}, default=str) + "\n"
        with self.lock:  # one write per line, O_APPEND: a reader never sees half a line it keeps
            fd = os.open(os.path.join(self.run_dir, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        return 0

    def update_fields(self, job_id: str, in_states: Any, **fields: Any) -> bool:
        if "quality" in fields:
            write_json(os.path.join(self.run_dir, "quality.json"), fields["quality"])
        return True


class Wrapper:
    def __init__(self, state_dir: str, spec: Dict[str, Any], attempt: int, restart: int):
        self.state_dir, self.spec, self.attempt, self.restart = state_dir, spec, attempt, restart
        self.run_dir = spec["run_dir"]
        self.config = spec.get("config") or {}
        self.job = dict(spec, attempt=attempt, started_at=time.time(), state="running")
        self.records = FileRecords(self.run_dir, spec["id"], attempt)
        self.proc: Optional[subprocess.Popen] = None
        self.kill_at: Optional[float] = None
        self.stop_cause: Optional[str] = None
        self.done = threading.Event()

    def path(self, kind: str) -> str:
        return os.path.join(self.run_dir, "%s.%d" % (kind, self.attempt))

    def log(self, text: str) -> None:
        try:
            with open(self.spec["log"], "a") as f:
                f.write("--- gpurun: %s\n" % text)
        except OSError:
            pass

    def run(self) -> int:
        os.makedirs(self.run_dir, exist_ok=True)
        env = os.environ
        bid = "%s_%s" % (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) if env.get("SLURM_ARRAY_TASK_ID") \
            else env.get("SLURM_JOB_ID", "")  # as squeue -r names it: the row's backend_id
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        write_json(self.path("started"), {"node": node, "pid": os.getpid(), "slurm_job_id": bid,
                                          "time": self.job["started_at"], "restart_count": self.restart,
                                          "attempt": self.attempt})
        self.log("attempt %d started %s on %s (Slurm job %s)" % (
            self.attempt, time.strftime("%Y-%m-%dT%H:%M:%S%z"), node, bid))
        if self.attempt > 1 and not (self.spec.get("force_resume") and self.restart == 0):
            refused = self.gate()
            if refused is not None:
                why, data = refused
                write_json(self.path("gate"), {"why": why, "data": data, "time": time.time()})
                self.log("not run: %s" % why)
                self.finish(None, None, "quality")
                return 0
        from orchestrator.agent import secrets
        found, gone, hide = secrets.for_job(self.state_dir, self.spec.get("secrets") or [])
        if gone:
            why = "secret %s not set on this host" % ", ".join(gone)
            self.log("not run: %s" % why)
            self.finish(None, None, None, error=why)
            return 0
        return self.launch(found, hide)

    def gate(self) -> Optional[tuple]:
        """The runner's resume gate, and a STOP this Slurm job recorded in an earlier attempt."""
        rec = read_json(os.path.join(self.run_dir, "quality.json")) or {}
        if rec.get("verdict") == "STOP" and int(rec.get("attempt") or 0) > int(self.spec.get("attempt_base") or 0):
            return ("resume refused by quality gate: attempt %s was judged STOP: %s" % (rec.get("attempt"),
                                                                                        rec.get("reason")),
                    {"evidence": rec.get("evidence"), "verdict": "STOP"})
        from orchestrator.agent.quality_hook import gate_refusal
        prev = dict(self.job, attempt=self.attempt - 1)
        return gate_refusal(prev, self.config, self.state_dir, on_error=lambda exc: self.records.add_event(
            self.spec["id"], "gate", "warn", "resume gate could not judge: %s" % exc))

    def launch(self, found: Dict[str, str], hide: list) -> int:
        # the same environment as on any host; CUDA_VISIBLE_DEVICES is Slurm's (gres)
        env = jobwrap.job_env(os.environ, dict(self.spec, run_dir=self.run_dir), self.attempt, self.state_dir,
                              found, hide, (procs.MARKER, procs.token(self.spec["id"], self.attempt)))
        script = jobwrap.job_script(self.spec["command"], env)
        shell = jobwrap.shell()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)
        with open(self.spec["log"], "ab", buffering=0) as log:
            try:
                self.proc = subprocess.Popen([shell, "-c", script], cwd=self.spec.get("cwd") or self.run_dir, env=env,
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            except OSError as exc:
                self.log("could not start: %s" % exc)
                self.finish(127, None, None)
                return 127
            watcher = threading.Thread(target=self.watch, daemon=True)
            watcher.start()
            code = self.proc.wait()
        self.done.set()
        self.log("exit code %d at %s" % (code, time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        self.finish(code, -code if code < 0 else None, self.stop_cause)
        return code if code >= 0 else 128 - code

    def on_signal(self, signum: int, _frame: Any) -> None:
        """Slurm's TERM (scancel, the time limit; KILL follows after KillWait): to the group."""
        self.signal_group(signal.SIGTERM if signum != signal.SIGUSR1 else signal.SIGUSR1)
        limit = self.spec.get("timeout_s")
        if signum == signal.SIGTERM and self.stop_cause is None and limit and \
                time.time() - self.job["started_at"] >= float(limit) - 1.0:
            self.stop_cause = "timeout"  # Slurm's time limit (--time, from timeout=): retried as on any host
        if signum != signal.SIGUSR1 and self.kill_at is None:
            self.kill_at = time.time() + float(self.config.get("kill_grace_s", KILL_GRACE_S))
            self.records.add_event(self.spec["id"], "signal", "info", "Slurm sent %s; passed to the job's process group"
                                   % signal.Signals(signum).name)

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass

    def stop(self, summary: str) -> None:
        """A STOP verdict with ``quality.action: stop``: TERM now, KILL after the grace."""
        if self.stop_cause is None:
            self.stop_cause = "quality"
            self.log("stopped by quality check: %s" % summary)
            self.signal_group(signal.SIGTERM)
            self.kill_at = time.time() + float(self.config.get("kill_grace_s", KILL_GRACE_S))

    def watch(self) -> None:
        """The quality check on the daemon's cadence, a stall note, and the KILL after a grace."""
        from orchestrator.agent import quality_cadence as QC
        from orchestrator.agent import quality_hook as QH
        from orchestrator.quality.options import cadence
        qcfg = self.config
        cad = cadence(qcfg)
        stall_s = float((qcfg.get("watchdog") or {}).get("stall_after_s") or 1200)
        last_growth, last_size, stalled = time.time(), -1, False
        while not self.done.wait(min(cad["scan_s"], 1.0)):
            now = time.time()
            if self.kill_at is not None and now >= self.kill_at:
                self.signal_group(signal.SIGKILL)
                self.kill_at = now + 3600
            if self.stop_cause is None:
                try:
                    why = QC.due(self.records, self.job, now, cad)
                    if why:
                        res = QH.periodic_check(self.records, self.job, now, qcfg, self.state_dir, trigger=why)
                        QC._checked(self.job)
                        if res.get("stop"):
                            self.stop(str(res.get("summary") or res.get("verdict")))
                except Exception as exc:  # noqa: BLE001 - a bad source must never end the job
                    sys.stderr.write("gpurun quality check failed: %s\n" % exc)
            size = _size(self.spec["log"]) + _size(self.spec.get("metrics"))
            if size != last_size:
                last_growth, last_size, stalled = now, size, False
            elif not stalled and now - last_growth > stall_s:
                stalled = True
                self.records.add_event(self.spec["id"], "watchdog", "warn", "job %s: no new log or metrics output for "
                                       "%d s (stalled?)" % (self.spec.get("name"), int(now - last_growth)))

    def finish(self, code: Optional[int], sig: Optional[int], cause: Optional[str], error: str = "") -> None:
        rec = {"code": code, "signal": sig, "stop_cause": cause, "time": time.time()}
        if error:
            rec["error"] = error
        for _ in range(100):  # a full or flaky shared disk: the exit file is the attempt's one record
            try:
                write_json(self.path("exit"), rec)
                return
            except OSError:
                time.sleep(0.5)


def _size(path: Optional[str]) -> int:
    try:
        return os.stat(path).st_size if path else 0
    except OSError:
        return 0


def main(argv: list) -> int:
    def arg(flag: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else ""
    state_dir, job_id = os.path.abspath(os.path.expanduser(arg("--state-dir"))), arg("--job")
    spec = read_json(os.path.join(state_dir, "runs", job_id, "spec.json"))
    if not isinstance(spec, dict) or not spec.get("command"):
        sys.stderr.write("gpurun slurmjob: no readable spec.json for job %r under %s\n" % (job_id, state_dir))
        return 2
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    attempt = int(spec.get("attempt_base") or 0) + restart + 1
    return Wrapper(state_dir, spec, attempt, restart).run()
