"""The runner: reconciles the store with reality, places queued jobs on free GPUs or slots,
notices exits, enforces cancel and timeouts, and applies retry budgets and the resume gate.

Only the runner writes ``running`` and terminal states. Every placement is one compare-and-set
(queued -> running) before the process starts; a process that started but whose pid was never
recorded is found again by its marker, so a crash at any moment neither loses nor doubles a job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, Optional

from orchestrator.agent import diskfull, failures, jobwrap, procs, spawn
from orchestrator.agent import cleanup  # a job's leftover processes end with it
from orchestrator.agent import states as S
from orchestrator.agent.gpus import visible_gpus
from orchestrator.agent.store import Store

KILL_GRACE_S = 10.0
SCHEDULE_PAGE = 32  # queued rows read at a time when placing jobs
QUALITY_STOP_PREFIX = "stopped by quality check"  # human text only; the cause is ``stop_cause``

# Why a running job was asked to stop (the store's ``stop_cause``), written by whoever asks,
# and the state its attempt ends in when it exits non-zero. None: the retry budget decides.
STOP_QUALITY, STOP_WATCHDOG, STOP_USER, STOP_TIMEOUT = "quality", "watchdog", "user", "timeout"
STOP_WATCHDOG_REQUEUE = "watchdog_requeue"
STOP_OUTCOME = {STOP_QUALITY: S.QUALITY_STOPPED, STOP_WATCHDOG: S.CANCELLED, STOP_USER: S.CANCELLED,
                STOP_TIMEOUT: None, STOP_WATCHDOG_REQUEUE: None}


def exit_path(job: dict, attempt: int) -> str:
    return os.path.join(job["run_dir"], "exit.%d" % attempt)


def started_path(job: dict, attempt: int) -> str:
    return os.path.join(job["run_dir"], "started.%d" % attempt)


def read_exit(job: dict, attempt: int) -> Optional[int]:
    try:
        with open(exit_path(job, attempt)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def stop_cause(job: dict) -> Optional[str]:
    """Why the job's current attempt was asked to stop: the recorded cause, else a bare
    cancel flag (the cancel verb sets only the flag) counts as the user's."""
    return job.get("stop_cause") or (STOP_USER if job.get("cancel_requested") else None)


class Runner:
    def __init__(self, store: Store, state_dir: str, config: dict, agent_argv: List[str]):
        self.store = store
        self.state_dir = state_dir
        self.config = config
        self.agent_argv = agent_argv  # [python, agent.pyz] used to start job wrappers
        self.children: Dict[str, "subprocess.Popen | spawn.Child"] = {}
        # GPURUN_EXEC_WRAPPER=1: exec the wrapper as before agent/spawn (a before/after, a host where forks misbehave)
        self.fork_wrappers = os.environ.get("GPURUN_EXEC_WRAPPER", "") != "1"
        self.pids: Dict[str, int] = {}           # job id -> wrapper pid (children and adopted)
        self.kill_at: Dict[str, float] = {}      # job id -> when to escalate TERM to KILL
        self.boot = procs.boot_id()
        self.runs_scope = os.path.join(state_dir, "runs") + os.sep  # our jobs' run dirs (as verbs.v_submit makes them)
        self.gpus = visible_gpus(config)
        self.launched = 0  # jobs started by the current pass (step resets it)
        # forked wrappers tell this pipe when their job's process ends, before the exit code's
        # fsync: the slot is free at once; the settle still waits for the wrapper (agent/spawn)
        self.ended_pipe = spawn.Ended()
        self.ended: set = set()  # pids of our wrappers whose job has ended (until reaped)
        self.sweeper = cleanup.Sweeper(lambda: cleanup.grace_from(self.config), store=store)

    # --- reconcile ------------------------------------------------------------------
    def reconcile(self) -> None:
        """Adopt live jobs by marker; settle the ones whose process is gone."""
        marked = procs.find_marked(scope=self.runs_scope)
        for job in self.store.jobs([S.RUNNING]):
            tok = procs.token(job["id"], job["attempt"])
            pid = cleanup.attempt_pid(started_path(job, job["attempt"]), tok, marked.get(tok))  # never a leftover
            if pid is None and job["boot_id"] == self.boot and procs.alive_with_token(job["pid"], tok):
                pid = job["pid"]
            if pid is not None:
                self.pids[job["id"]] = pid
                if pid != job["pid"]:
                    self.store.update_fields(job["id"], [S.RUNNING], pid=pid)
                self.store.add_event(job["id"], "adopted", "info", "re-adopted live pid %d after agent restart" % pid)
            else:
                self._settle(job)

    # --- one pass ---------------------------------------------------------------------
    def step(self, yield_to_start: bool = False, defer: bool = False) -> None:
        """One pass. ``yield_to_start``: a pass that starts a job leaves the leftovers' sweep (a
        /proc scan) to a later one, soon after (``daemon.YIELD_S``), off the new job's CPU; so does
        a ``defer`` one (a job started a moment ago)."""
        self.launched = 0
        self.ended.update(set(self.ended_pipe.read()) & {p.pid for p in self.children.values()})  # ours till reaped
        self._reap_children()
        now = time.time()
        marked = None  # /proc scan, done at most once per pass and only when needed
        still = []
        for job in self.store.jobs([S.RUNNING]):
            jid = job["id"]
            tok = procs.token(jid, job["attempt"])
            pid = self.pids.get(jid)
            if pid is None:
                # a running row we do not track (claimed by a previous daemon): find it by marker
                marked = procs.find_marked(scope=self.runs_scope) if marked is None else marked
                pid = cleanup.attempt_pid(started_path(job, job["attempt"]), tok, marked.get(tok))
                if pid is None:
                    self._settle(job)
                    continue
                self.pids[jid] = pid
            if jid not in self.children and not procs.alive_with_token(pid, tok):
                self._settle(job)
                continue
            still.append(job)
            if job["cancel_requested"] and jid not in self.kill_at:
                self.signal_job(jid, pid, "cancel")
            elif job["timeout_s"] and job["started_at"] and now - job["started_at"] > job["timeout_s"] \
                    and jid not in self.kill_at and not cleanup.holding_exit(pid):  # a held code is no timeout
                self.store.update_fields(jid, [S.RUNNING], reason="timeout after %ss" % int(job["timeout_s"]),
                                         stop_cause=STOP_TIMEOUT)
                self.signal_job(jid, pid, "timeout")
            if jid in self.kill_at and now >= self.kill_at[jid]:
                cleanup.signal_job(pid, signal.SIGKILL, tok)  # the group and every process with its marker
                self.kill_at[jid] = now + 3600
        self._schedule([j for j in still if self.pids.get(j["id"]) not in self.ended])  # ended: no slot or GPU
        if not (yield_to_start and self.launched or defer):
            self.sweeper.tick()  # ended attempts' leftovers: TERM, KILL after the grace (after placing: off the gap)

    def signal_job(self, jid: str, pid: int, why: str) -> None:
        """TERM the job's process group now and KILL it after the grace period."""
        cleanup.signal_job(pid, signal.SIGTERM)  # the group, and setsid ones by the wrapper's marker
        self.kill_at[jid] = time.time() + float(self.config.get("kill_grace_s", KILL_GRACE_S))
        self.store.add_event(jid, why, "info", "sent TERM to process group %d (%s)" % (pid, why))

    def stop_for_quality(self, job: dict, summary: str) -> None:
        """TERM a running job the periodic quality check judged STOP (opt-in action)."""
        self.store.update_fields(job["id"], [S.RUNNING], reason="%s: %s" % (QUALITY_STOP_PREFIX, summary),
                                 stop_cause=STOP_QUALITY)
        pid = self.pids.get(job["id"])
        if pid and job["id"] not in self.kill_at:
            self.signal_job(job["id"], pid, "quality_stop")

    def _reap_children(self) -> None:
        for jid, proc in list(self.children.items()):
            if proc.poll() is not None:
                del self.children[jid]
                self.ended.discard(proc.pid)
                job = self.store.get_job(jid)
                if job is not None and job["state"] == S.RUNNING:
                    self._settle(job)

    # --- ending an attempt ------------------------------------------------------------
    def _settle(self, job: dict) -> None:
        """The attempt's process is gone: record how it ended and decide what comes next."""
        jid = job["id"]
        self.pids.pop(jid, None)
        self.kill_at.pop(jid, None)
        self.children.pop(jid, None)
        code = read_exit(job, job["attempt"]) if job["attempt"] else None
        now = time.time()
        if code is None and job["attempt"] and not os.path.exists(started_path(job, job["attempt"])):
            # The agent died between claiming the job and starting it: nothing ran, so this
            # attempt costs no retry. Nor is it swept: its number (and marker) is used again by
            # the next start, whose processes a sweep of this token would TERM.
            if self.store.transition(jid, [S.RUNNING], S.QUEUED, attempt=job["attempt"] - 1, pid=None):
                self.store.add_event(jid, "requeued", "info", "attempt %d never started; requeued" % job["attempt"])
            return
        self.sweeper.start(procs.token(jid, job["attempt"]), job["run_dir"])  # what it left running goes too
        cause = stop_cause(job)
        if job["cancel_requested"] and STOP_OUTCOME.get(cause or "") is None:
            cause = STOP_USER  # a cancel outranks a timeout or a requeue asked for earlier
        outcome = STOP_OUTCOME.get(cause or "")
        if code == 0 and outcome is None:
            self.store.transition(jid, [S.RUNNING], S.SUCCEEDED, exit_code=0, ended_at=now, pid=None,
                                  failure_class=None, failure_hint=None)
            return
        fail = failures.judge(job, code, cause, self.boot, now)  # classified before any retry
        tag = {"failure_class": fail.cls, "failure_hint": fail.hint}
        # a stop that was asked for wins over exit 0: a trainer that saves and exits cleanly on
        # SIGTERM after diverging is still quality_stopped, and a cancelled one still cancelled
        if outcome == S.QUALITY_STOPPED:
            self.store.transition(jid, [S.RUNNING], S.QUALITY_STOPPED, exit_code=code, ended_at=now, pid=None,
                                  stop_cause=cause, **tag)
            return
        if outcome == S.CANCELLED:
            why = job.get("reason") if cause == STOP_WATCHDOG and job.get("reason") else "cancelled by user"
            self.store.transition(jid, [S.RUNNING], S.CANCELLED, exit_code=code, ended_at=now, pid=None,
                                  reason=why, stop_cause=cause, **tag)
            return
        reason = job.get("reason") or ("exit code %d" % code if code is not None else fail.label)
        used = job["attempt"] - job["attempt_base"]
        free = failures.free_retry(fail, job)  # preemption, reboot: the budget is not spent
        if fail.retryable and (free or used <= job["retries"]):
            if self.store.transition(jid, [S.RUNNING], S.QUEUED, exit_code=code, pid=None, reason=reason,
                                     stop_cause=None, attempt_base=job["attempt_base"] + int(free), **tag):
                self.store.add_event(jid, "retry", "warn", failures.retry_message(job, reason, fail, used - int(free)),
                                     failures.event_data(fail, code, job["attempt"]))
            return
        if fail.holds:  # an OOM or a full disk would fail the same way: wait for the user
            reason = failures.held_reason(fail, job["name"])
        if self.store.transition(jid, [S.RUNNING], S.FAILED, exit_code=code, ended_at=now, pid=None, reason=reason,
                                 stop_cause=cause, **tag):  # the `failed` event (a notification) only if it did
            self.store.add_event(jid, "failed", "error", failures.failed_message(job["name"], reason, fail),
                                 failures.event_data(fail, code, job["attempt"]))

    # --- placing jobs -------------------------------------------------------------------
    def _capacity(self, running: List[dict]) -> tuple:
        if self.gpus:
            busy = {g for j in running for g in (j["gpu_ids"] or [])}
            return [g for g in self.gpus if g not in busy], None
        slots = int(self.config.get("slots") or 1)
        return None, slots - len(running)

    def _schedule(self, running: List[dict]) -> None:
        """Cancel the queued jobs being cancelled, then place queued jobs in order while there
        is room. The queue is read a page at a time and only as far as placing needs, so a
        pass costs the same with 10 or 50,000 jobs queued behind the ones it starts."""
        free_gpus, free_slots = self._capacity(running)
        for job in self.store.queued_cancelled():  # a partial index: as many rows as there are cancels
            self.store.transition(job["id"], [S.QUEUED], S.CANCELLED, ended_at=time.time(),
                                  reason="cancelled by user", stop_cause=STOP_USER)
        after = 0
        # the first page as long as what is free (a row decodes in ~25 us), doubling as jobs are passed over
        size = max(1, min(SCHEDULE_PAGE, len(free_gpus) if free_gpus is not None else free_slots or 1))
        while (free_gpus is None or free_gpus) and (free_slots is None or free_slots > 0):
            page = self.store.queued_page(size, after)
            if not page:
                return
            after = page[-1]["seq"]
            size = min(SCHEDULE_PAGE, 2 * size)
            for job in page:
                if free_gpus is not None and not free_gpus or free_slots is not None and free_slots <= 0:
                    return
                free_gpus, free_slots = self._place(job, free_gpus, free_slots)

    def _place(self, job: dict, free_gpus: Optional[List[int]], free_slots: Optional[int]) -> tuple:
        """Try to start one queued job on what is free; returns what is still free."""
        if job["cancel_requested"]:  # flagged after this pass's cancel sweep
            self.store.transition(job["id"], [S.QUEUED], S.CANCELLED, ended_at=time.time(),
                                  reason="cancelled by user", stop_cause=STOP_USER)
            return free_gpus, free_slots
        if free_gpus is not None:
            need = max(1, job["gpus"] or 1)
            if need > len(self.gpus):
                self.store.transition(job["id"], [S.QUEUED], S.FAILED, ended_at=time.time(),
                                      reason="needs %d GPUs, host has %d" % (need, len(self.gpus)))
                return free_gpus, free_slots
            if need > len(free_gpus):
                return free_gpus, free_slots
            ids, rest = free_gpus[:need], free_gpus[need:]
            if not self._admit(job, ids):
                return rest, free_slots  # GPUs short of VRAM are not offered to the next job either
        else:
            ids, rest = [], None
        if not self._workdir_ready(job) or not self._resume_gate(job):
            return free_gpus, free_slots
        if self._launch(job, ids) and free_slots is not None:
            free_slots -= 1
        return rest, free_slots

    def _admit(self, job: dict, gpu_ids: List[int]) -> bool:
        """VRAM admission before placing a job, when the profile asks for it (auto-reap of
        zombies or a minimum of free MiB): the same plan as ``gpurun reap``."""
        reap = self.config.get("reap") or {}
        need = self.config.get("min_free_mib")
        if not reap.get("auto") and need is None:
            return True
        # loaded on first use: most profiles never ask for admission, and it brings the GPU probe
        from orchestrator.agent.admission import admission
        from orchestrator.agent.context import AgentContext
        res = admission(AgentContext(self.state_dir, self.store, self.config, self), gpu_ids, need)
        if not res["ok"]:
            key = "admission_wait:%s" % job["id"]
            if not self.store.kv_get(key):
                self.store.kv_set(key, True)
                self.store.add_event(job["id"], "admission", "warn", "waiting for VRAM on GPU %s: free %s MiB, need %s"
                                     % (gpu_ids, res["free_mib"], need))
        return bool(res["ok"])

    def _workdir_ready(self, job: dict) -> bool:
        """The job's working directory exists, or is made when it is the host's own workdir.

        A fresh box has no workdir until ``push`` or ``setup`` makes one, and a queue that needs
        neither must still run there: gpurun's directories are the agent's to create. A user's
        ``cwd=`` is never created (a typo would silently run in an empty dir): a missing one
        fails the job with the path in its reason, without spending an attempt."""
        cwd = job.get("cwd")
        if not cwd or os.path.isdir(cwd):
            return True
        workdir = self.config.get("workdir")
        if workdir and os.path.normpath(os.path.expanduser(workdir)) == os.path.normpath(cwd):
            try:
                os.makedirs(cwd, exist_ok=True)
                return True
            except OSError as exc:
                why = "could not create the host's working directory %s: %s" % (cwd, exc.strerror or exc)
        else:
            why = "working directory %s does not exist" % cwd
        if self.store.transition(job["id"], [S.QUEUED], S.FAILED, ended_at=time.time(), reason=why):
            self.store.add_event(job["id"], "failed", "error", "job %s failed: %s" % (job["name"], why))
            try:  # `gpurun queue logs` says it too
                os.makedirs(job["run_dir"], exist_ok=True)
                with open(job["log"], "a") as f:
                    f.write("--- gpurun: not started: %s\n" % why)
            except OSError:
                pass
        return False

    def _resume_gate(self, job: dict) -> bool:
        """Judge a job's metrics before any restart; a STOP verdict ends it as quality_stopped."""
        if job["attempt"] == 0:
            return True
        if job["force_resume"]:
            self.store.update_fields(job["id"], [S.QUEUED], force_resume=0)
            self.store.add_event(job["id"], "gate", "warn", "resume gate overridden with --force")
            return True
        from orchestrator.agent.quality_hook import gate_refusal  # the metric readers, only on a resume
        refused = gate_refusal(job, self.config, self.state_dir, on_error=lambda exc: self.store.add_event(
            job["id"], "gate", "warn", "resume gate could not judge: %s" % exc))
        if refused is None:
            return True
        why, data = refused
        if self.store.transition(job["id"], [S.QUEUED], S.QUALITY_STOPPED, ended_at=time.time(), reason=why,
                                 stop_cause=STOP_QUALITY):
            self.store.add_event(job["id"], "quality_stopped", "error", why, data)
        return False

    def _secrets(self, job: dict) -> Optional[tuple]:
        """``(secrets to export, secret names to drop from the inherited environment)``: the
        secrets the job asked for by name, read from the box's 0600 file at launch (a ``stat``
        when unchanged); a job that asked for none inherits none. A secret that is not set fails
        the job, naming it (never a value), without spending an attempt; None then."""
        from orchestrator.agent import secrets
        found, gone, hide = secrets.for_job(self.state_dir, job.get("secrets") or [])
        if not gone:
            return found, hide
        import shlex
        host = shlex.quote(str(self.config.get("host") or "HOST"))
        why = "secret%s %s %s not set on this host; set %s with %s, then `gpurun queue retry %s`" % (
            "s" if len(gone) > 1 else "", ", ".join(gone), "are" if len(gone) > 1 else "is",
            "them" if len(gone) > 1 else "it",
            " and ".join("`gpurun secret set %s --host %s`" % (n, host) for n in gone), shlex.quote(job["name"]))
        if self.store.transition(job["id"], [S.QUEUED], S.FAILED, ended_at=time.time(), reason=why):
            self.store.add_event(job["id"], "failed", "error", "job %s failed: %s" % (job["name"], why))
        return None

    def _wrapper_argv(self) -> List[str]:
        """How to start ``jobwrap``. The daemon's ``[python, agent]`` gets ``-S``: the wrapper
        imports only the stdlib and the agent next to it, and skipping site-packages (every
        ``.pth`` of a big environment) is most of a wrapper's start, which lies between one
        job's end and the next one's start."""
        argv = list(self.agent_argv)
        if len(argv) == 2 and os.path.exists(argv[1]) and not argv[1].startswith("-"):
            argv.insert(1, "-S")
        return argv

    def _launch(self, job: dict, gpu_ids: List[int]) -> bool:
        attempt = job["attempt"] + 1
        now = time.time()
        secret_env = self._secrets(job)
        if secret_env is None:
            return False
        secret_env, hidden = secret_env
        if not self.store.transition(job["id"], [S.QUEUED], S.RUNNING, attempt=attempt, gpu_ids=gpu_ids,
                                     started_at=now, ended_at=None, exit_code=None, pid=None,
                                     boot_id=self.boot, reason=None, stop_cause=None):
            return False
        os.makedirs(job["run_dir"], exist_ok=True)
        # a secret the job did not ask for, inherited by the daemon, stays out (hidden)
        env = jobwrap.job_env(os.environ, job, attempt, self.state_dir, secret_env, hidden,
                              (procs.MARKER, procs.token(job["id"], attempt)))
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
        args = [started_path(job, attempt), exit_path(job, attempt), job["log"], job["cwd"] or "", job["command"]]
        try:
            # forked: no interpreter start between one job's end and the next one's (agent/spawn)
            proc = spawn.start(args, env, procs.MARKER, self.ended_pipe.w) if self.fork_wrappers else None
            if proc is None:
                proc = subprocess.Popen(self._wrapper_argv() + ["jobwrap"] + args, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, close_fds=True)
        except OSError as exc:
            if diskfull.is_full(exc):
                raise  # the daemon backs off; the claim is requeued as never started (no started file)
            self.store.transition(job["id"], [S.RUNNING], S.FAILED, ended_at=time.time(),
                                  reason="could not start job wrapper: %s" % exc)
            return False
        failures.note_start(job["run_dir"], attempt)  # the OOM counter, read off the gap (after the fork)
        self.children[job["id"]] = proc
        self.launched += 1
        self.pids[job["id"]] = proc.pid
        self.store.update_fields(job["id"], [S.RUNNING], pid=proc.pid)
        return True
