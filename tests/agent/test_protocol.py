"""The typed agent protocol: one table of verbs, one dispatch, one client, version-naming errors.

Drives the real agent (a local transport runs the real zipapp in a subprocess) and checks the
seams the protocol exists for: every verb has a handler and a client method, every reply
carries its shape's keys, and a mismatch between builds is a clear error, never a KeyError.
"""

from __future__ import annotations

import ast
import inspect
import json
import pathlib
import subprocess
import sys

import pytest

from orchestrator.agent import AGENT_VERSION
from orchestrator.agent import protocol as P
from orchestrator.agent.framing import frame
from orchestrator.agent.handlers import HANDLERS
from orchestrator.core.client import AgentClient
from orchestrator.errors import AgentProtocolError, BadInput, JobNotFound

PKG = pathlib.Path(__file__).resolve().parents[2] / "orchestrator"


def test_every_verb_has_one_handler_and_one_client_method():
    assert set(HANDLERS) == set(P.VERBS)
    for name in P.VERBS:
        method = getattr(AgentClient, name, None)
        assert callable(method), f"AgentClient has no method for verb {name!r}"
        assert inspect.signature(method).return_annotation.endswith("Reply")


def test_no_verb_is_called_by_string_outside_the_client():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "client.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("call", "_call")
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in P.VERBS):
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert offenders == []


def _agent_imports(path: pathlib.Path) -> set[str]:
    """Modules of ``orchestrator.agent`` that ``path`` imports at runtime (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module == "orchestrator.agent":
            out |= {a.name for a in node.names}
        elif node.module.startswith("orchestrator.agent."):
            out.add(node.module.split(".")[2])
    return out - {path.stem}


def test_no_import_circle_inside_the_agent():
    mods = {p.stem: p for p in (PKG / "agent").glob("*.py")}
    graph = {m: _agent_imports(p) & set(mods) for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, "import circle: " + " -> ".join(trail + [d])
            if d not in state:
                visit(d, trail + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_agent_rooms_ship_stdlib_only():
    """The protocol and every module shipped to the box import no controller package."""
    banned = ("click", "fabric", "invoke", "paramiko", "yaml", "boto3", "rich", "orchestrator.core",
              "orchestrator.cli", "orchestrator.sync", "orchestrator.transport", "orchestrator.providers")
    for room in ("agent", "health", "quality"):
        for path in (PKG / room).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                for n in names:
                    assert not any(n == b or n.startswith(b + ".") for b in banned), f"{path}: imports {n}"


def test_replies_of_the_real_agent_have_their_shapes(local_client: AgentClient, tmp_path: pathlib.Path):
    job = {"id": "p1", "name": "proto", "command": "echo hello", "cwd": str(tmp_path), "gpus": 0}
    sub = local_client.submit([job])
    assert sub["added"] == ["p1"]
    replies = {
        "status": local_client.status(["p1"]),
        "logs": local_client.logs("proto"),
        "events": local_client.events("p1", newest=True),
        "gpu": local_client.gpu(),
        "snapshot": local_client.snapshot(),
        "manifest": local_client.manifest(["p1"], 0.0),
        "mark_pulled": local_client.mark_pulled("p1", []),
        "check": local_client.check({"job": "p1"}),
        "reap": local_client.reap({"kill": False}),
        "cancel": local_client.cancel(["p1"]),
    }
    for name, rep in replies.items():
        assert P.VERBS[name].missing_keys(rep) == [], name
    wire = replies["status"]["jobs"][0]
    assert tuple(wire) == P.JOB_KEYS and wire["name"] == "proto"


def test_not_found_and_bad_input_map_to_the_error_tree(local_client: AgentClient):
    with pytest.raises(JobNotFound) as err:
        local_client.logs("no-such-job")
    assert "no-such-job" in err.value.message and "queue status" in (err.value.hint or "")
    with pytest.raises(BadInput):
        local_client.check({"job": "no-such-job"})


def test_unknown_verb_names_both_builds(local_client: AgentClient):
    local_client.status()  # the daemon is ensured; the next call is a plain verb
    with pytest.raises(AgentProtocolError) as err:
        local_client._call(P.Verb("frobnicate", P.StatusRequest, P.StatusReply), {})
    msg = err.value.message
    assert "frobnicate" in msg and AGENT_VERSION in msg and f"protocol {P.PROTOCOL_VERSION}" in msg
    assert err.value.code == "agent_protocol"


class _Reply:
    def __init__(self, stdout: str):
        self.stdout, self.stderr, self.exit_code = stdout, "", 0


class _CannedTransport:
    """A transport whose host answers with a fixed envelope: an older or newer agent build."""

    def __init__(self, envelope: dict):
        self.envelope = envelope

    def run(self, cmd: str, input: str | None = None, timeout: float | None = None) -> _Reply:
        return _Reply("motd noise\n" + frame(self.envelope))

    def close(self) -> None:
        pass


def test_reply_of_the_wrong_shape_is_a_protocol_error(home: pathlib.Path):
    old = {"ok": True, "result": {"jobs": []}, "agent": "0.0.9-old", "protocol": 1}  # status without 'daemon'
    client = AgentClient({"name": "oldbox", "kind": "ssh", "profile": "generic-ssh"}, _CannedTransport(old))
    client.ensured = True
    with pytest.raises(AgentProtocolError) as err:
        client.status()
    msg = err.value.message
    assert "daemon" in msg and "0.0.9-old" in msg and "protocol 1" in msg and AGENT_VERSION in msg


def test_agent_process_answers_an_unknown_verb_with_a_framed_error(tmp_path: pathlib.Path):
    res = subprocess.run([sys.executable, "-m", "orchestrator.agent", "frobnicate", "--state-dir", str(tmp_path)],
                         input="{}", capture_output=True, text=True, timeout=60)
    from orchestrator.agent.framing import unframe
    env = unframe(res.stdout)
    assert env["ok"] is False and env["error"]["kind"] == P.UNKNOWN_VERB
    assert env["agent"] == AGENT_VERSION and env["protocol"] == P.PROTOCOL_VERSION
    assert "Traceback" not in res.stdout + res.stderr
    json.dumps(env)  # strict JSON


@pytest.fixture
def local_client(home: pathlib.Path):
    from orchestrator.core.session import open_session
    host = {"name": "local", "kind": "local", "profile": "local", "state_dir": str(home / "state"), "slots": 1}
    with open_session(host=host) as client:
        yield client
