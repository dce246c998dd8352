"""The agent protocol: every verb the controller may send, with its request and reply shapes.

This module is the one contract between ``orchestrator/core/client.py`` (controller) and the
agent's handlers (``orchestrator/agent/handlers.py``). It is stdlib only and ships inside the
agent zipapp, so both ends import the very same names. A verb is one JSON request on stdin
and one sentinel-framed envelope on stdout::

    {"ok": true,  "result": <Reply>,                      "agent": VERSION, "protocol": N}
    {"ok": false, "error": {"kind", "message", "hint"},   "agent": VERSION, "protocol": N}

An error may carry more keys, optional, each for one kind (``job`` for ``not_found``), so an
older peer simply does without them. ``kind`` is one of ``ERROR_KINDS``; the controller maps it to its error tree
(``orchestrator.errors.from_agent``). Replies are checked against their shape's required keys
(``missing_keys``), so a reply of the wrong shape is a protocol error naming both builds,
never a ``KeyError`` deep in a command.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, TypedDict

# Bumped when a verb, a request key or a required reply key changes meaning.
PROTOCOL_VERSION = 4  # 3: Job.quality, Job.failure_class, Job.failure_hint; 4: release, Job.moved_to/backend_id

# --- errors ---------------------------------------------------------------------------
NOT_FOUND = "not_found"
BAD_INPUT = "bad_input"
CONFLICT = "conflict"
UNKNOWN_VERB = "unknown_verb"
STORE_TOO_NEW = "store_too_new"
AGENT_START = "agent_start"
INTERNAL = "internal"
GATE_REFUSED = "gate_refused"  # a safety gate said no (the resume gate on retry); nothing changed
SCHEDULER = "scheduler"  # the host's batch scheduler (Slurm) refused or failed; its words in the message
ERROR_KINDS = (NOT_FOUND, BAD_INPUT, CONFLICT, UNKNOWN_VERB, STORE_TOO_NEW, AGENT_START, INTERNAL, GATE_REFUSED,
               SCHEDULER)


class VerbError(Exception):
    """A request the agent refuses; ``kind`` (one of ``ERROR_KINDS``) maps to the client's
    error tree, ``hint`` says what the user can do, ``fields`` go into the reply's error
    object beside them (``job`` for ``not_found``: see ``job_not_found``)."""

    def __init__(self, message: str, kind: str = BAD_INPUT, hint: str = "", **fields: Any):
        super().__init__(message)
        self.kind = kind
        self.hint = hint
        self.fields = fields


def job_not_found(ref: Any) -> VerbError:
    """The one not-found error for a job reference (id, name or number).

    Its error object carries ``"job": ref`` (the reference as the user gave it): the agent
    cannot know the name the controller has for its host, so the controller writes the user's
    message from the field ("no job 'x' on box"); the text here is for any other reader. An
    agent from before the field (protocol 4 without it) sends the message alone."""
    return VerbError("no job %r on this host" % str(ref), NOT_FOUND,
                     "see `gpurun queue status` for job names, ids and numbers", job=str(ref))

# --- the wire job -----------------------------------------------------------------------
class Job(TypedDict):
    """One job as it crosses the wire (a projection of the store's row)."""

    id: str
    seq: int
    name: str
    state: str
    exit_code: Optional[int]
    attempt: int
    gpus: int
    gpu_ids: List[int]
    command: str
    cwd: Optional[str]
    log: str
    run_dir: str
    metrics: Optional[str]
    checkpoints: Optional[str]
    retries: int
    timeout_s: Optional[float]
    pid: Optional[int]
    reason: Optional[str]
    stop_cause: Optional[str]
    secrets: List[str]  # the NAMES of the box's secrets exported to the job (never values)
    quality: Optional[Dict[str, Any]]  # the latest verdict: verdict, reason, step, checked_at, rule, final
    failure_class: Optional[str]  # why the last attempt ended (agent/failures: cuda_oom, host_oom, ...)
    failure_hint: Optional[str]
    moved_to: Optional[str]  # state "moved": the fleet host this queued job was released to
    backend_id: Optional[str]  # the batch scheduler's id for the job (Slurm's job id), when one runs it
    submitted_at: float
    started_at: Optional[float]
    ended_at: Optional[float]


JOB_KEYS: Tuple[str, ...] = tuple(Job.__annotations__)


def wire_job(row: Dict[str, Any]) -> Job:
    """The wire projection of a store row (missing columns travel as null)."""
    return {k: row.get(k) for k in JOB_KEYS}  # type: ignore[return-value]


class JobSpec(TypedDict, total=False):
    """A job as submitted: ``id``, ``name`` and ``command`` are required."""

    id: str
    name: str
    command: str
    cwd: Optional[str]
    env: Dict[str, str]
    gpus: int
    retries: int
    timeout_s: Optional[float]
    metrics: Optional[str]
    checkpoints: Optional[str]
    source: Optional[str]
    secrets: List[str]  # secret NAMES (``gpurun secret set``) the runner exports at launch
    attempt: int  # carried by a job moved from a lost box (`gpurun recover`)
    slurm: Dict[str, str]  # partition/account/qos/constraint for sbatch (a Slurm host; kept in spec.json)


# --- requests and replies, verb by verb ---------------------------------------------------
class SubmitRequest(TypedDict):
    jobs: List[JobSpec]


class SubmitReply(TypedDict):
    added: List[str]
    present: List[str]
    code: Optional[Dict[str, Any]]  # the record `gpurun push` left on the box, for the stale-code warning


class StatusRequest(TypedDict, total=False):
    jobs: Optional[List[str]]  # refs; all jobs when absent
    table: bool  # all jobs, each only with the columns of the status table (agent/store.TABLE_COLS)


class StatusReply(TypedDict):
    jobs: List[Job]
    daemon: Optional[Dict[str, Any]]


class LogsRequest(TypedDict, total=False):
    job: str
    offset: int  # -1: the tail (the last ``tail_lines`` lines, else the last ``tail_bytes``)
    tail_bytes: int  # an older client's tail; the start moves to the next line start
    tail_lines: int  # whole lines from the end, found reading backwards in chunks (wins over tail_bytes)
    limit: int


class LogsReply(TypedDict):
    job: Job
    data: str
    offset: int


class CancelRequest(TypedDict, total=False):
    jobs: List[str]
    all: bool


class CancelReply(TypedDict):
    cancelled: List[Dict[str, Any]]  # {id, name, result}


class RetryRequest(TypedDict, total=False):
    job: str
    force: bool


class RetryReply(TypedDict):
    job: Job
    next_attempt: int


class EventsRequest(TypedDict, total=False):
    job: Optional[str]
    since_id: int
    limit: int
    newest: bool


class EventsReply(TypedDict):
    events: List[Dict[str, Any]]  # {id, ts, job_id, kind, severity, message, data}


class GpuRequest(TypedDict, total=False):
    expect_gpus: int


class GpuReply(TypedDict):
    probe: str
    available: bool
    driver: Optional[str]
    no_driver: Optional[str]
    status: str
    reasons: List[Dict[str, Any]]
    gpus: List[Dict[str, Any]]


class ReapRequest(TypedDict, total=False):
    kill: bool
    grace: float
    all_users: bool
    min_age_s: float
    device_glob: str


class ReapReply(TypedDict):
    plan: Dict[str, Any]
    executed: Optional[List[Dict[str, Any]]]
    free_after_reap_mib: Dict[str, float]


class SnapshotRequest(TypedDict, total=False):
    finished: int


class SnapshotReply(TypedDict):
    host: str
    time: float
    gpu: GpuReply
    jobs: List[Dict[str, Any]]  # every active job, then the request's ``finished`` latest finished
    finished_total: int  # all finished jobs on the host (shown or not)
    findings: List[Dict[str, Any]]
    findings_at: Optional[float]
    system: Dict[str, Any]  # the tick's cgroup/disks/boot_id plus ``load`` (health.system.host_load), read now
    events: List[Dict[str, Any]]


class CheckRequest(TypedDict, total=False):
    job: str
    primary: Optional[List[str]]
    baseline: Optional[Dict[str, Any]]
    upto_checkpoint: bool
    # asked on an ambiguous verdict, over the host config's quality.reviewer / reviewer_command:
    # {base_url, model, key_env, timeout_s}: the key's NAME only; the box reads the key itself
    reviewer: Optional[Dict[str, Any]]
    reviewer_command: Optional[str]
    reviewer_timeout_s: Optional[float]


class CheckReply(TypedDict):
    verdict: str
    reason: str
    findings: List[Dict[str, Any]]
    job: Dict[str, Any]


class ManifestRequest(TypedDict, total=False):
    jobs: Optional[List[str]]  # refs; all jobs when null
    settle_s: float


class ManifestReply(TypedDict):
    schema: int
    host_time: float
    jobs: List[Dict[str, Any]]


class MarkPulledRequest(TypedDict, total=False):
    job: str
    files: List[Dict[str, str]]  # {path, sha256}
    at: float
    where: str


class MarkPulledReply(TypedDict):
    job: str
    files: int


class AgentInfoRequest(TypedDict, total=False):
    pass


class AgentInfoReply(TypedDict):
    daemon: Optional[Dict[str, Any]]  # {pid, build, started_at, uptime_s}; null when none runs
    agent: str                         # the version of the agent that answered
    state_dir: str
    jobs: Dict[str, int]               # {queued, running}
    running: List[Dict[str, Any]]      # {id, name, seq} of the running jobs
    idle_exit_minutes: Optional[float]  # null or 0: the daemon never exits on its own
    last_activity: Optional[float]     # when a verb last touched the agent (status, submit, ...)


class AgentStopRequest(TypedDict, total=False):
    force: bool        # stop even with running jobs (they keep running: they are detached)
    timeout_s: float


class AgentStopReply(TypedDict):
    stopped: bool      # False: no daemon was running
    pid: Optional[int]
    build: Optional[str]
    running: List[Dict[str, Any]]  # {id, name, seq}: still running, unwatched until the next start
    queued: int        # wait for the next command, which starts the agent again


class SecretSetRequest(TypedDict):
    name: str
    value: str  # travels only in this request body (stdin), never in argv, a log or the store


class SecretSetReply(TypedDict):
    name: str
    set_at: float


class SecretLsRequest(TypedDict, total=False):
    pass


class SecretLsReply(TypedDict):
    secrets: List[Dict[str, Any]]  # {name, set_at}: names only, never values


class SecretRmRequest(TypedDict):
    name: str


class SecretRmReply(TypedDict):
    name: str
    removed: bool  # False: no secret of that name was set


class ReleaseRequest(TypedDict):
    jobs: List[str]  # job ids
    to: str  # the fleet host they go to (recorded as moved_to)


class ReleaseRefusal(TypedDict):
    id: str
    state: Optional[str]  # None: no such job here
    reason: str


class ReleaseReply(TypedDict):
    # each released job's spec (what submit needs to add it elsewhere, attempt included); a job
    # already moved comes back again, so a controller that died mid-move can finish it
    released: List[JobSpec]
    refused: List[ReleaseRefusal]  # started, finished or unknown: it stays where it is


class Verb:
    """A verb's name, its request and reply shapes, and whether the client's first call of a
    session may start the daemon with it (``agent_info`` and ``agent_stop`` must not)."""

    __slots__ = ("name", "request", "reply", "starts_daemon")

    def __init__(self, name: str, request: Any, reply: Any, starts_daemon: bool = True):
        self.name = name
        self.request = request
        self.reply = reply
        self.starts_daemon = starts_daemon

    def missing_keys(self, reply: Any) -> List[str]:
        """Required reply keys that ``reply`` lacks (all of them when it is not an object)."""
        if not isinstance(reply, dict):
            return list(self.reply.__annotations__)
        return [k for k in self.reply.__annotations__ if k not in reply]


SUBMIT = Verb("submit", SubmitRequest, SubmitReply)
STATUS = Verb("status", StatusRequest, StatusReply)
LOGS = Verb("logs", LogsRequest, LogsReply)
CANCEL = Verb("cancel", CancelRequest, CancelReply)
RETRY = Verb("retry", RetryRequest, RetryReply)
EVENTS = Verb("events", EventsRequest, EventsReply)
GPU = Verb("gpu", GpuRequest, GpuReply)
REAP = Verb("reap", ReapRequest, ReapReply)
SNAPSHOT = Verb("snapshot", SnapshotRequest, SnapshotReply)
CHECK = Verb("check", CheckRequest, CheckReply)
MANIFEST = Verb("manifest", ManifestRequest, ManifestReply)
MARK_PULLED = Verb("mark_pulled", MarkPulledRequest, MarkPulledReply)
AGENT_INFO = Verb("agent_info", AgentInfoRequest, AgentInfoReply, starts_daemon=False)
AGENT_STOP = Verb("agent_stop", AgentStopRequest, AgentStopReply, starts_daemon=False)
SECRET_SET = Verb("secret_set", SecretSetRequest, SecretSetReply, starts_daemon=False)
SECRET_LS = Verb("secret_ls", SecretLsRequest, SecretLsReply, starts_daemon=False)
SECRET_RM = Verb("secret_rm", SecretRmRequest, SecretRmReply, starts_daemon=False)
RELEASE = Verb("release", ReleaseRequest, ReleaseReply)

VERBS: Dict[str, Verb] = {v.name: v for v in (SUBMIT, STATUS, LOGS, CANCEL, RETRY, EVENTS, GPU, REAP, SNAPSHOT,
                                               CHECK, MANIFEST, MARK_PULLED, AGENT_INFO, AGENT_STOP,
                                               SECRET_SET, SECRET_LS, SECRET_RM, RELEASE)}
