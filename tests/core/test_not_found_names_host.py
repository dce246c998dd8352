"""A job the agent does not have: the user's message names the host from the reply's ``job``
field, not by rewriting the agent's words; an agent from before the field still reads well.

The agent cannot know the name the controller has for its host, so it says "this host". The
client used to replace those words in the message: an agent that worded it otherwise left
"this host" (or worse) on the user's screen. The agent's real reply is read here from the
agent process; the older and the re-worded agents answer from canned envelopes, as
``tests/agent/test_protocol.py`` does for other builds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent import protocol as P
from orchestrator.agent.framing import frame, unframe
from orchestrator.core.client import AgentClient
from orchestrator.errors import JobNotFound


def test_the_agent_says_which_job_in_a_field(tmp_path: Path):
    res = subprocess.run([sys.executable, "-m", "orchestrator.agent", "logs", "--state-dir", str(tmp_path)],
                         input='{"job": "nosuch", "offset": -1, "tail_bytes": 100}', capture_output=True,
                         text=True, timeout=60)
    err = unframe(res.stdout)["error"]
    assert err["kind"] == P.NOT_FOUND and err["job"] == "nosuch", err
    assert err["message"] == "no job 'nosuch' on this host"   # for any other reader


class _Reply:
    def __init__(self, stdout: str):
        self.stdout, self.stderr, self.exit_code = stdout, "", 0


class _Box:
    """A transport whose agent answers every verb with one error object."""

    def __init__(self, error: dict, protocol: int):
        self.envelope = {"ok": False, "error": error, "agent": "x", "protocol": protocol}

    def run(self, cmd: str, input: str | None = None, timeout: float | None = None) -> _Reply:
        return _Reply(frame(self.envelope))

    def close(self) -> None:
        pass


def _logs_error(error: dict, protocol: int = P.PROTOCOL_VERSION) -> JobNotFound:
    client = AgentClient({"name": "box", "kind": "ssh", "profile": "generic-ssh"}, _Box(error, protocol))
    client.ensured = True
    with pytest.raises(JobNotFound) as got:
        client.logs("nosuch")
    return got.value


@pytest.mark.parametrize("message", ["no job 'nosuch' on this host", "job nosuch: unknown on this machine"])
def test_the_message_is_built_from_the_field(message: str):
    err = _logs_error({"kind": "not_found", "message": message, "hint": "anything", "job": "nosuch"})
    assert err.message == "no job 'nosuch' on box"
    assert err.hint == "see `gpurun queue status --host box` for job names, ids and numbers"


def test_an_agent_without_the_field_still_names_the_host():
    err = _logs_error({"kind": "not_found", "message": "no job 'nosuch' on this host",
                       "hint": "see `gpurun queue status` for job names, ids and numbers"}, protocol=4)
    assert err.message == "box: no job 'nosuch' on this host"
    assert "`gpurun queue status --host box`" in (err.hint or "")
