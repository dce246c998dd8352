"""Slurm as the host's scheduler: the batch script, ``sbatch``, ``scancel``, and reading
``squeue`` / ``scontrol``. Used by the verb processes on a login node whose config says
``scheduler: slurm`` (no daemon runs there: Slurm is the scheduler and the durable queue),
through the hooks of ``agent/backend.SlurmBackend``.

A queued row without a ``backend_id`` is submitted by the next verb: its ``runs/<id>/spec.json``
(everything the in-allocation wrapper ``agent/slurmjob`` needs, since the compute node never
opens the store) and ``runs/<id>/job.sbatch`` are written, then ``sbatch --parsable`` gives the
Slurm job id, stored by compare-and-set. An sbatch that fails leaves the row queued without an
id (the next verb tries again) and is reported as a ``scheduler`` error in sbatch's own words.
What the scheduler and the run dir say is turned into store states by ``slurm_reconcile``.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import re
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from orchestrator.agent import states as S
from orchestrator.agent.protocol import SCHEDULER, VerbError

SPEC = "spec.json"
SCRIPT = "job.sbatch"
OPT_KEYS = ("partition", "account", "qos", "constraint")  # config, then the queue line's options
CMD_TIMEOUT_S = 60.0
# Slurm states (squeue %T, scontrol JobState) that end a job; anything else is still in Slurm's hands
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING",
                     "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING"})
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")
NAME_PREFIX = "gpurun-"  # every sbatch's --job-name starts so
ARRAY_MIN = 16    # this many jobs with the same sbatch options go in as one --array
ARRAY_MAX = 1000  # tasks per array (Slurm's MaxArraySize is 1001 by default)
_PER_JOB = ("--job-name=", "--output=", "--chdir=")  # the options an array sets for all its tasks


def write_json(path: str, obj: Any, sync: bool = True) -> None:
    """Whole or absent: a temp file, fsync, rename (a reader on another node sees one or the other)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=str)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run(argv: List[str], timeout: float = CMD_TIMEOUT_S) -> Tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of a Slurm command; a missing command is 127."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, "", "%s: command not found (is Slurm's client installed on this login node?)" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "", "%s did not answer within %ds" % (argv[0], timeout)
    return p.returncode, p.stdout, p.stderr


# --- the job's spec and batch script ---------------------------------------------------------
def job_options(job: Dict[str, Any], config: Dict[str, Any], line_opts: Dict[str, str]) -> Dict[str, str]:
    """partition/account/qos/constraint: the queue line's options win over the host config."""
    base = (config or {}).get("slurm") or {}
    out = {k: str(base[k]) for k in OPT_KEYS if base.get(k)}
    out.update({k: str(v) for k, v in (line_opts or {}).items() if k in OPT_KEYS and v})
    return out


def time_limit(job: Dict[str, Any], config: Dict[str, Any]) -> Optional[str]:
    """``--time`` in minutes: the job's timeout, else ``slurm.time_default`` (a duration or
    Slurm's own form), else None (the partition's default)."""
    secs = job.get("timeout_s")
    if secs:
        return str(max(1, int(math.ceil(float(secs) / 60.0))))
    raw = ((config or {}).get("slurm") or {}).get("time_default")
    if not raw:
        return None
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|min|h|d)?\s*$", str(raw))
    if not m:
        return str(raw)  # Slurm's own form (e.g. 1-12:00:00): sbatch judges it
    mult = {None: 60, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[m.group(2)]
    return str(max(1, int(math.ceil(float(m.group(1)) * mult / 60.0))))


def sbatch_options(job: Dict[str, Any], config: Dict[str, Any], line_opts: Dict[str, str]) -> List[str]:
    """The ``#SBATCH`` options of one job (see ``batch_script``)."""
    cfg = (config or {}).get("slurm") or {}
    name = _NAME_BAD.sub("_", str(job.get("name") or job["id"]))[:60]
    opts = ["--job-name=%s%s" % (NAME_PREFIX, name), "--output=%s" % os.path.join(job["run_dir"], "slurm-%j.out"),
            "--chdir=%s" % job["run_dir"], "--requeue", "--open-mode=append"]
    gpus = int(job.get("gpus") or 0)
    if gpus > 0:
        opts.append("--gres=%s:%d" % (cfg.get("gres") or "gpu", gpus))
    else:
        opts.append("--cpus-per-task=1")
    limit = time_limit(job, config)
    if limit:
        opts.append("--time=%s" % limit)
    for k, v in sorted(job_options(job, config, line_opts).items()):
        opts.append("--%s=%s" % (k, v))
    opts.extend(str(x) for x in cfg.get("extra") or [])
    return opts


def batch_script(options: List[str], python: str, agent: str, state_dir: str, ids: List[str]) -> str:
    """A POSIX sh batch script whose one command is gpurun's wrapper (``slurmjob``): the user's
    command is in spec.json, never pasted into the script. Several ``ids``: an array, task i
    runs ``ids[i]``."""
    import shlex
    lines = ["#!/bin/sh"] + ["#SBATCH %s" % o for o in options]
    lines.append("# written by gpurun: the wrapper runs the job's command (runs/<id>/spec.json)")
    ref = shlex.quote(ids[0])
    if len(ids) > 1:
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        lines.extend("%d) J=%s ;;" % (i, shlex.quote(jid)) for i, jid in enumerate(ids))
        lines.append('*) echo "gpurun: no job for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;')
        lines.append("esac")
        ref = '"$J"'
    lines.append("exec %s --job %s" % (" ".join(shlex.quote(a) for a in (python, agent, "slurmjob", "--state-dir",
                                                                          state_dir)), ref))
    return "\n".join(lines) + "\n"


def job_spec(job: Dict[str, Any], config: Dict[str, Any], line_opts: Dict[str, str]) -> Dict[str, Any]:
    """What the wrapper reads in the allocation (the store's row at submit, and the host
    config's quality and watchdog sections); ``attempt_base``: the attempts before this sbatch."""
    keys = ("id", "name", "command", "cwd", "env", "gpus", "timeout_s", "metrics", "checkpoints", "run_dir", "log",
            "secrets", "source")
    spec = {k: job.get(k) for k in keys}
    spec.update(attempt_base=int(job.get("attempt") or 0), force_resume=bool(job.get("force_resume")),
                slurm=dict(line_opts or {}), submitted_at=time.time(),
                config={k: config[k] for k in ("quality", "watchdog", "kill_grace_s", "host") if k in (config or {})})
    return spec


# --- submit and cancel -------------------------------------------------------------------
def agent_argv() -> Tuple[str, str]:
    """The interpreter and agent entry this verb runs under; the compute node runs the same
    (the agent's state dir is on the shared filesystem)."""
    return sys.executable or "python3", os.path.abspath(sys.argv[0])


def sbatch(script: str) -> str:
    """Submit ``script``; the Slurm job id, or a ``scheduler`` error with sbatch's words."""
    rc, out, err = run(["sbatch", "--parsable", script])
    jid = out.strip().split(";")[0].strip()
    if rc != 0 or not jid.isdigit():
        words = (err.strip() or out.strip() or "exit %d" % rc).splitlines()
        raise VerbError("sbatch refused the job: %s" % " ".join(words)[:600], SCHEDULER,
                        "check the partition/account/qos/constraint (profile `slurm:`, the host's `slurm:` or "
                        "the queue line) with `sinfo` and `sacctmgr show assoc user=$USER`; the job stays "
                        "queued and the next gpurun command submits it again")
    return jid


def submit_pending(ctx: Any, only: Optional[Iterable[str]] = None) -> List[str]:
    """sbatch every queued row without a Slurm job id (``only``: these ids); returns the
    ids submitted. Jobs with the same sbatch options go in as one ``--array`` when there are
    ``ARRAY_MIN`` of them (one sbatch for a 1,000-job sweep). An sbatch failure is raised after
    the jobs before it kept their ids."""
    store, config = ctx.store, ctx.config
    wanted = set(only) if only is not None else None
    python, agent = agent_argv()
    groups: Dict[tuple, List[Tuple[Dict[str, Any], List[str]]]] = {}
    for job in store.jobs([S.QUEUED]):
        if job.get("backend_id") or (wanted is not None and job["id"] not in wanted):
            continue
        if job.get("cancel_requested"):
            store.transition(job["id"], [S.QUEUED], S.CANCELLED, ended_at=time.time(), reason="cancelled by user",
                             stop_cause="user")
            continue
        if not prepare(ctx, job):
            continue  # failed with its reason (a missing workdir or secret), as the runner does
        os.makedirs(job["run_dir"], exist_ok=True)
        spec_file = os.path.join(job["run_dir"], SPEC)
        line_opts = (read_json(spec_file) or {}).get("slurm") or {}
        # no fsync: sbatch comes after the close, and a shared filesystem shows a closed file to
        # every node (close-to-open); a login node that crashed before sbatch leaves the row queued
        write_json(spec_file, job_spec(job, config, line_opts), sync=False)
        opts = sbatch_options(job, config, line_opts)
        groups.setdefault(tuple(o for o in opts if not o.startswith(_PER_JOB)), []).append((job, opts))
    done: List[str] = []
    for key, members in groups.items():
        while len(members) >= ARRAY_MIN:
            chunk, members = members[:ARRAY_MAX], members[ARRAY_MAX:]
            done += _submit_array(ctx, list(key), [j for j, _ in chunk], python, agent)
        for job, opts in members:
            script = os.path.join(job["run_dir"], SCRIPT)
            with open(script, "w") as f:
                f.write(batch_script(opts, python, agent, ctx.state_dir, [job["id"]]))
            if _record(ctx, job, sbatch(script)):
                done.append(job["id"])
    return done


def _submit_array(ctx: Any, common: List[str], jobs: List[Dict[str, Any]], python: str, agent: str) -> List[str]:
    """One ``sbatch --array=0-(n-1)`` for ``jobs``; task i runs ``jobs[i]`` (backend id ``A_i``)."""
    runs = os.path.join(ctx.state_dir, "runs")
    name = _NAME_BAD.sub("_", str(jobs[0].get("name") or jobs[0]["id"]))[:50]
    opts = ["--job-name=%s%s+%d" % (NAME_PREFIX, name, len(jobs) - 1),
            "--output=%s" % os.path.join(runs, "slurm-%A_%a.out"), "--chdir=%s" % runs,
            "--array=0-%d" % (len(jobs) - 1)] + common
    script = os.path.join(runs, "array-%s-%d.sbatch" % (jobs[0]["id"], int(time.time() * 1000)))
    with open(script, "w") as f:
        f.write(batch_script(opts, python, agent, ctx.state_dir, [j["id"] for j in jobs]))
    aid = sbatch(script)
    return [j["id"] for i, j in enumerate(jobs) if _record(ctx, j, "%s_%d" % (aid, i))]


def _record(ctx: Any, job: Dict[str, Any], bid: str) -> bool:
    """Keep the Slurm id on the row (compare-and-set on queued); a row cancelled or moved
    while sbatch ran gets its Slurm job cancelled instead: it must not run."""
    if ctx.store.update_fields(job["id"], [S.QUEUED], backend_id=bid, force_resume=0):
        ctx.store.add_event(job["id"], "slurm", "info", "submitted as Slurm job %s" % bid, {"backend_id": bid})
        return True
    cancel([bid])
    return False


def output_file(job: Dict[str, Any]) -> str:
    """Slurm's own output file of the job's current Slurm job (``--output``)."""
    bid = str(job.get("backend_id") or "")
    if "_" in bid:  # an array task: beside the run dirs
        return os.path.join(os.path.dirname(job["run_dir"]), "slurm-%s.out" % bid)
    return os.path.join(job["run_dir"], "slurm-%s.out" % bid)


def prepare(ctx: Any, job: Dict[str, Any]) -> bool:
    """The checks the runner makes before a launch: a workdir that exists (the host's own is
    created), the secrets it asked for set on the host. A job that fails one is failed with
    its reason, spending no attempt; False then."""
    cwd, why = job.get("cwd"), None
    if cwd and not os.path.isdir(cwd):
        workdir = ctx.config.get("workdir")
        if workdir and os.path.normpath(os.path.expanduser(workdir)) == os.path.normpath(cwd):
            try:
                os.makedirs(cwd, exist_ok=True)
            except OSError as exc:
                why = "could not create the host's working directory %s: %s" % (cwd, exc.strerror or exc)
        else:
            why = "working directory %s does not exist" % cwd
    if why is None and job.get("secrets"):
        from orchestrator.agent import secrets
        gone = secrets.for_job(ctx.state_dir, job["secrets"])[1]
        if gone:
            why = "secret%s %s not set on this host; set %s with `gpurun secret set NAME --host %s`" % (
                "s" if len(gone) > 1 else "", ", ".join(gone), "them" if len(gone) > 1 else "it",
                ctx.config.get("host") or "HOST")
    if why is None:
        return True
    if ctx.store.transition(job["id"], [S.QUEUED], S.FAILED, ended_at=time.time(), reason=why):
        ctx.store.add_event(job["id"], "failed", "error", "job %s failed: %s" % (job["name"], why))
    return False


def remember_options(run_dir: str, line_opts: Dict[str, str]) -> None:
    """Keep a job's queue-line sbatch options in its spec.json (rows have no column for them)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, SPEC)
    spec = read_json(path) or {}
    spec["slurm"] = dict(line_opts or {})
    write_json(path, spec, sync=False)  # read back by this login node's next sbatch


def cancel(ids: List[str]) -> Tuple[bool, str]:
    """``scancel`` the Slurm jobs ``ids`` (one call); ``(ok, its words)``. A job Slurm has
    finished already is not an error."""
    ids = [i for i in ids if i]
    if not ids:
        return True, ""
    rc, out, err = run(["scancel"] + ids)
    words = (err.strip() or out.strip())
    return rc == 0 or "already completing or completed" in words or "Invalid job id" in words, words


def cancel_or_raise(ids: List[Optional[str]]) -> None:
    """``cancel``, or a ``scheduler`` error in scancel's words (the store is left as it was)."""
    ok, words = cancel([i for i in ids if i])
    if not ok:
        raise VerbError("scancel failed: %s" % words[:600], SCHEDULER,
                        "nothing was cancelled; is slurmctld reachable from this login node? (`squeue`)")


# --- what Slurm says -------------------------------------------------------------------------
def user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def parse_squeue(text: str) -> Dict[str, Tuple[str, str]]:
    """``squeue -h -o '%i|%T|%r|%j'`` -> ``{job id: (state, reason)}`` (array tasks under their
    own id). With the name column, only gpurun's jobs (``gpurun-...``): an id the cluster gave
    again after a reset, to someone's own job, is never taken for one of ours."""
    out: Dict[str, Tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) < 2 or not parts[0] or (len(parts) > 3 and not parts[3].startswith(NAME_PREFIX)):
            continue
        out[parts[0].strip()] = (parts[1].strip(), parts[2].strip() if len(parts) > 2 else "")
    return out


def squeue() -> Dict[str, Tuple[str, str]]:
    """Every gpurun job of this user that the controller still holds, ended ones included
    (``-t all``), array tasks one per line as ``A_T`` (``-r``): one call, whatever the number of
    jobs. Raises a ``scheduler`` error when squeue fails."""
    rc, out, err = run(["squeue", "-h", "-r", "-t", "all", "-u", user(), "-o", "%i|%T|%r|%j"])
    if rc != 0:
        raise VerbError("squeue failed: %s" % (err.strip() or "exit %d" % rc)[:600], SCHEDULER,
                        "is slurmctld reachable from this login node? (`sinfo`)")
    return parse_squeue(out)


def parse_scontrol(text: str) -> Dict[str, str]:
    """``scontrol show job -o ID`` (one line of ``Key=Value`` words) -> a dict; ``{}`` when empty.
    Values never hold spaces except the last keys' (Command=, WorkDir= ...), which are not read."""
    out: Dict[str, str] = {}
    for word in text.split():
        if "=" in word:
            k, v = word.split("=", 1)
            out.setdefault(k, v)
    return out


def scontrol_job(bid: str) -> Dict[str, str]:
    """What the controller remembers of a job squeue no longer lists; ``{}`` when it forgot it."""
    rc, out, _ = run(["scontrol", "show", "job", "-o", bid])
    info = parse_scontrol(out) if rc == 0 else {}
    return info if info.get("JobName", NAME_PREFIX).startswith(NAME_PREFIX) else {}


def exit_code_of(word: str) -> Tuple[Optional[int], Optional[int]]:
    """Slurm's ``ExitCode=3:0`` -> ``(3, None)``; ``0:9`` -> ``(None, 9)`` (killed by signal 9)."""
    m = re.match(r"^(\d+):(\d+)$", word or "")
    if not m:
        return None, None
    code, sig = int(m.group(1)), int(m.group(2))
    return (None, sig) if sig else (code, None)
