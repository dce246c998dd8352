"""The one error tree of gpurun.

Every error carries a ``hint`` (what the user can do), an ``exit_code`` (2 for bad input,
1 for operational failures) and ``retryable`` (whether trying again may help). The CLI is
the only place that turns these into messages and exit codes; tracebacks are for bugs.
"""

from __future__ import annotations


class GpurunError(Exception):
    """Base of every expected failure. ``str(err)`` is one line, never a secret."""

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


# --- bad input: exit code 2 -------------------------------------------------------------

class BadInput(GpurunError):
    """The user gave something we cannot use; nothing was changed."""

    exit_code = 2


class QueueFileError(BadInput):
    """A queue file line is malformed; the message names ``file:line``."""


class ProfileError(BadInput):
    """A provider profile is missing or invalid; the message names file, line and key."""


class HostError(BadInput):
    """A host name or spec is unknown or malformed."""


class ConfigError(BadInput):
    """The user config (``config.yaml``) is invalid."""


class JobNotFound(BadInput):
    """A job reference matches no job on the host."""


# --- operational failures: exit code 1 --------------------------------------------------

class OperationalError(GpurunError):
    """Something outside the user's input failed (network, host, provider, disk)."""


class TransportError(OperationalError):
    """A command could not be run on the host (connection lost, timeout)."""

    retryable = True


class ConnectError(TransportError):
    """The host could not be reached or refused us; no command ran."""


class HostKeyError(ConnectError):
    """The host's SSH key differs from the one recorded: possible impersonation."""

    retryable = False


class AgentError(OperationalError):
    """The on-host agent answered with an error or an unreadable reply."""


class ProviderError(OperationalError):
    """A provider API call failed; ``status`` holds the HTTP status when known."""

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None,
                 retryable: bool | None = None):
        super().__init__(message, hint, retryable=retryable)
        self.status = status


class CredentialError(ProviderError):
    """The credential env var named by the profile is missing or rejected."""

    exit_code = 2


class CapacityError(ProviderError):
    """The provider has no capacity for the requested offer."""

    retryable = True


class Unsupported(OperationalError):
    """The provider or host cannot do this; the message says why in plain words."""

    exit_code = 2


class VerificationError(OperationalError):
    """A pulled artifact does not match its manifest (size, hash, load check)."""


class GateRefused(OperationalError):
    """A safety gate (teardown, resume) refused to proceed; the hint says what is missing."""

    exit_code = 3
