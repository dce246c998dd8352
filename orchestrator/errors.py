"""The one error tree of gpurun.

Every error carries a ``code`` (a stable snake_case string, unique per class: scripts match on
it, it never changes once shipped), a ``hint`` (what the user can do), an ``exit_code`` (2 for
bad input, 1 for operational failures, 3 for a refusing safety gate) and ``retryable`` (whether
trying again may help). The CLI is the only place that turns these into messages and exit codes
(``gpurun: error: ...`` on stderr, or ``{"error": {"code", "message", "hint"}}`` on stdout
under ``--json``); tracebacks are for bugs.

The tree (``code``, exit code)::

    GpurunError                     error           1
    +-- BadInput                    bad_input       2
    |   +-- QueueFileError          queue_file      2
    |   +-- ProfileError            profile         2
    |   +-- HostError               host            2
    |   +-- ConfigError             config          2
    |   +-- JobNotFound             job_not_found   2
    |   +-- MetricsSourceError      metrics_source  2
    +-- OperationalError            operational     1
        +-- TransportError          transport       1  (retryable)
        |   +-- ConnectError        connect         1  (retryable)
        |       +-- HostKeyError    host_key        1
        +-- AgentError              agent           1
        |   +-- AgentProtocolError  agent_protocol  1
        |   +-- AgentStartError     agent_start     1  (retryable)
        |   +-- AgentStoreTooNew    store_too_new   1
        +-- Conflict                conflict        1  (retryable)
        +-- ProviderError           provider        1
        |   +-- CredentialError     credential      2
        |   +-- CapacityError       capacity        1  (retryable)
        +-- Unsupported             unsupported     2
        +-- VerificationError       verification    1
        +-- DiskFull                disk_full       1
        +-- GateRefused             gate_refused    3

``CLI_CODES`` lists the few codes that come from the CLI itself rather than from a class
(usage errors, Ctrl-C, bugs). ``from_agent`` turns an agent reply's error ``kind`` into the
right class, so the controller has one place for that mapping.
"""

from __future__ import annotations


class GpurunError(Exception):
    """Base of every expected failure. ``str(err)`` is one line, never a secret."""

    code = "error"
    exit_code = 1
    retryable = False

    def __init__(self, message: str, hint: str | None = None, *, retryable: bool | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict:
        """The ``--json`` error body: ``{"code", "message", "hint"}`` (hint may be null)."""
        return {"code": self.code, "message": str(self.message),
                "hint": None if self.hint is None else str(self.hint)}


# --- bad input: exit code 2 -------------------------------------------------------------

class BadInput(GpurunError):
    """The user gave something we cannot use; nothing was changed."""

    code = "bad_input"
    exit_code = 2


class QueueFileError(BadInput):
    """A queue file line is malformed; the message names ``file:line``."""

    code = "queue_file"


class ProfileError(BadInput):
    """A provider profile is missing or invalid; the message names file, line and key."""

    code = "profile"


class HostError(BadInput):
    """A host name or spec is unknown or malformed."""

    code = "host"


class ConfigError(BadInput):
    """The user config (``config.yaml``) is invalid."""

    code = "config"


class JobNotFound(BadInput):
    """A job reference matches no job on the host."""

    code = "job_not_found"


class FleetError(BadInput):
    """A fleet name is unknown or malformed, or ``fleets.json`` cannot be used (the message
    names the file, line and key)."""

    code = "fleet"


class MetricsSourceError(BadInput):
    """``gpurun check SOURCE``: the path does not exist, cannot be read, or is in no known
    metrics format; the message names the path (and the formats tried)."""

    code = "metrics_source"


# --- operational failures: exit code 1 --------------------------------------------------

class OperationalError(GpurunError):
    """Something outside the user's input failed (network, host, provider, disk)."""

    code = "operational"


class TransportError(OperationalError):
    """A command could not be run on the host (connection lost, timeout)."""

    code = "transport"
    retryable = True


class ConnectError(TransportError):
    """The host could not be reached or refused us; no command ran."""

    code = "connect"


class HostKeyError(ConnectError):
    """The host's SSH key differs from the one recorded: possible impersonation."""

    code = "host_key"
    retryable = False


class AgentError(OperationalError):
    """The on-host agent answered with an error or an unreadable reply."""

    code = "agent"


class AgentProtocolError(AgentError):
    """Controller and agent builds disagree: an unknown verb, or a reply of the wrong shape.

    The message names both versions; the hint says which side to upgrade."""

    code = "agent_protocol"


class AgentStartError(AgentError):
    """The agent daemon did not start (or answer) in time; the hint says where to look."""

    code = "agent_start"
    retryable = True


class AgentStoreTooNew(AgentError):
    """The agent's state on the host was written by a newer gpurun; this build will not touch it."""

    code = "store_too_new"


class Conflict(OperationalError):
    """The thing changed under us (a job moved state while we acted on it); trying again may help."""

    code = "conflict"
    retryable = True


class ProviderError(OperationalError):
    """A provider API call failed; ``status`` holds the HTTP status when known."""

    code = "provider"

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None,
                 retryable: bool | None = None):
        super().__init__(message, hint, retryable=retryable)
        self.status = status


class CredentialError(ProviderError):
    """The credential env var named by the profile is missing or rejected."""

    code = "credential"
    exit_code = 2


class CapacityError(ProviderError):
    """The provider has no capacity for the requested offer."""

    code = "capacity"
    retryable = True


class Unsupported(OperationalError):
    """The provider or host cannot do this; the message says why in plain words."""

    code = "unsupported"
    exit_code = 2


class SchedulerError(OperationalError):
    """The host's batch scheduler (Slurm: ``sbatch``, ``squeue``, ``scancel``) refused or
    failed; the message carries its own words."""

    code = "scheduler"


class VerificationError(OperationalError):
    """A pulled artifact does not match its manifest (size, hash, load check)."""

    code = "verification"


class DiskFull(OperationalError):
    """Out of space (or quota): the local destination of a pull (what arrived is kept for a
    resume), or the box's agent state dir (``from_agent`` kind ``disk_full``: nothing changed)."""

    code = "disk_full"


class GateRefused(OperationalError):
    """A safety gate (teardown, resume) refused to proceed; the hint says what is missing."""

    code = "gate_refused"
    exit_code = 3


# --- codes that come from the CLI, not from a class ---------------------------------------

#: code -> (meaning, exit code). ``main`` uses these for failures that are not a GpurunError.
CLI_CODES: dict[str, tuple[str, int]] = {
    "usage": ("the command line itself is wrong (unknown option, missing argument, bad value)", 2),
    "aborted": ("a confirmation prompt was aborted", 1),
    "interrupted": ("interrupted by Ctrl-C (SIGINT)", 130),
    # `queue submit --wait`: a job was judged STOP by the quality check (10/11 are `gpurun check`'s)
    "quality_stop": ("queue submit --wait: a job was judged STOP by the training-quality check", 12),
    "internal": ("a bug in gpurun; the traceback is on stderr", 1),
}


# --- agent replies -------------------------------------------------------------------------

_AGENT_BUG_HINT = ("please report it with the output of `gpurun queue status --json` and the agent log")
_AGENT_PROTOCOL_HINT = "the controller and the agent builds differ: upgrade gpurun so both match"


def from_agent(kind: str | None, message: str, hint: str | None = None, *,
               host: str | None = None) -> GpurunError:
    """The error for an agent reply ``{"ok": false, "error": {"kind", "message", "hint"}}``.

    ``not_found`` -> JobNotFound, ``bad_input`` -> BadInput, ``conflict`` -> Conflict,
    ``store_too_new`` -> AgentStoreTooNew, ``agent_start`` -> AgentStartError,
    ``gate_refused`` -> GateRefused (exit 3), ``disk_full`` -> DiskFull, ``unknown_verb``/``protocol`` ->
    AgentProtocolError,
    ``internal`` -> AgentError (an agent bug: the message says so, once, and the hint asks for
    a report unless one is given), anything else (or no kind) -> AgentError. ``host`` names the
    host in bug reports.
    The error is returned, not raised, so the caller writes ``raise from_agent(...)``.
    """
    message = message or "agent error"
    hint = hint or None
    if kind == "not_found":
        return JobNotFound(message, hint)
    if kind == "bad_input":
        return BadInput(message, hint)
    if kind == "conflict":
        return Conflict(message, hint)
    if kind == "store_too_new":
        return AgentStoreTooNew(message, hint)
    if kind == "agent_start":
        return AgentStartError(message, hint)
    if kind == "gate_refused":
        return GateRefused(message, hint)
    if kind == "disk_full":  # the box's state dir is full: the agent refused, changing nothing
        return DiskFull(message, hint)
    if kind == "scheduler":  # the host's batch scheduler (sbatch, squeue, scancel) said no
        return SchedulerError(message, hint)
    if kind in ("unknown_verb", "protocol"):
        return AgentProtocolError(message, hint or _AGENT_PROTOCOL_HINT)
    if kind == "internal":
        if not message.startswith("agent bug"):
            message = f"agent bug{f' on {host}' if host else ''}: {message}"
        return AgentError(message, hint or _AGENT_BUG_HINT)
    return AgentError(message, hint)
