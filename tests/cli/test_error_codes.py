"""Stable error codes: every class in the tree has a unique one, the README lists every code with
its exit code (and every exit code gpurun uses), agent replies map to the right class, and
``--json`` failures come out as ``{"error": {"code", "message", "hint"}}`` on stdout with the
usual exit code while the human form is one ``gpurun: error:`` line and a hint, usage errors and
names holding control characters included."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from rigs.agents import gpurun

from orchestrator import errors as E

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _all_classes() -> list[type]:
    out, todo = [], [E.GpurunError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _json_error(res) -> dict:
    """The one strict JSON document on stdout, with nothing on stdout besides it."""
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message", "hint"}
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]
    return doc["error"]


# --- the tree --------------------------------------------------------------------------------

def test_codes_are_unique_non_empty_snake_case():
    classes = _all_classes()
    assert len(classes) >= 22
    seen: dict[str, str] = {}
    for cls in classes:
        assert "code" in vars(cls), f"{cls.__name__} inherits its code; give it its own"
        code = cls.code
        assert isinstance(code, str) and re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", code), (cls, code)
        assert code not in seen, f"{cls.__name__} and {seen[code]} share code {code!r}"
        seen[code] = cls.__name__
    clash = set(seen) & set(E.CLI_CODES)
    assert not clash, f"CLI codes clash with class codes: {clash}"
    for code in E.CLI_CODES:
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", code)


def test_documented_codes_and_exit_codes():
    expect = {
        "GpurunError": ("error", 1), "BadInput": ("bad_input", 2), "QueueFileError": ("queue_file", 2),
        "ProfileError": ("profile", 2), "HostError": ("host", 2), "ConfigError": ("config", 2),
        "JobNotFound": ("job_not_found", 2), "OperationalError": ("operational", 1),
        "TransportError": ("transport", 1), "ConnectError": ("connect", 1), "HostKeyError": ("host_key", 1),
        "AgentError": ("agent", 1), "AgentProtocolError": ("agent_protocol", 1),
        "AgentStartError": ("agent_start", 1), "AgentStoreTooNew": ("store_too_new", 1),
        "Conflict": ("conflict", 1), "ProviderError": ("provider", 1), "CredentialError": ("credential", 2),
        "CapacityError": ("capacity", 1), "Unsupported": ("unsupported", 2),
        "VerificationError": ("verification", 1), "GateRefused": ("gate_refused", 3),
        "MetricsSourceError": ("metrics_source", 2), "DiskFull": ("disk_full", 1),
        "FleetError": ("fleet", 2), "SchedulerError": ("scheduler", 1),
    }
    for name, (code, exit_code) in expect.items():
        cls = getattr(E, name)
        assert (cls.code, cls.exit_code) == (code, exit_code), name
    assert issubclass(E.AgentProtocolError, E.AgentError) and issubclass(E.AgentStartError, E.AgentError)
    assert issubclass(E.AgentStoreTooNew, E.AgentError) and issubclass(E.Conflict, E.OperationalError)
    assert E.Conflict.retryable and E.AgentStartError.retryable and not E.AgentProtocolError.retryable
    err = E.HostError("unknown host 'x'", "add it")
    assert err.to_dict() == {"code": "host", "message": "unknown host 'x'", "hint": "add it"}


@pytest.mark.parametrize("kind,cls", [
    ("not_found", E.JobNotFound), ("bad_input", E.BadInput), ("conflict", E.Conflict),
    ("store_too_new", E.AgentStoreTooNew), ("unknown_verb", E.AgentProtocolError),
    ("protocol", E.AgentProtocolError), ("internal", E.AgentError), ("something_new", E.AgentError),
    (None, E.AgentError), ("", E.AgentError),
])
def test_from_agent_maps_kinds(kind, cls):
    err = E.from_agent(kind, "the message", "the hint")
    assert type(err) is cls
    assert "the message" in err.message and err.hint == "the hint"


def test_from_agent_details():
    bug = E.from_agent("internal", "KeyError: 'x'", None, host="box1")
    assert bug.message == "agent bug on box1: KeyError: 'x'" and "report" in bug.hint
    assert E.from_agent("conflict", "job a changed state while retrying; try again", None).retryable
    proto = E.from_agent("unknown_verb", "agent 0.9 does not know 'sync'; controller 1.2", None)
    assert proto.code == "agent_protocol" and proto.hint  # a default hint says what to do
    assert E.from_agent("bad_input", "x", "").hint is None
    assert E.from_agent("internal", "", None).message.startswith("agent bug")
    pre = E.from_agent("internal", "agent bug on box1: boom", "report it")   # already prefixed: kept once
    assert pre.message == "agent bug on box1: boom" and pre.hint == "report it"


# --- the CLI ---------------------------------------------------------------------------------

def test_bad_queue_file_json(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("echo ok\n[name=x gpus=two] python t.py\n")
    res = gpurun("queue", "submit", str(q), "--json")
    assert res.returncode == 2
    err = _json_error(res)
    assert err["code"] == "queue_file" and "q.txt:2: option gpus='two'" in err["message"]
    assert err["hint"]
    assert res.stderr == ""
    res = gpurun("queue", "submit", str(tmp_path / "nope.txt"), "--json")
    assert res.returncode == 2 and _json_error(res)["code"] == "queue_file"


def test_unknown_host_json(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("echo hi\n")
    res = gpurun("queue", "submit", str(q), "--json", "--host", "gpu-box-7")
    assert res.returncode == 2
    err = _json_error(res)
    assert err["code"] == "host" and "unknown host 'gpu-box-7'" in err["message"]
    assert "gpurun host add" in err["hint"]
    res = gpurun("watch", "--once", "--json", "--host", "gpu-box-7")
    assert res.returncode == 2 and _json_error(res)["code"] == "host"
    res = gpurun("queue", "status", "--json", "--host", "nope")
    assert res.returncode == 2 and _json_error(res)["code"] == "host"


def test_human_output_unchanged_without_json(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("echo ok\n[name=x gpus=two] python t.py\n")
    res = gpurun("queue", "submit", str(q))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (f"gpurun: error: {q}:2: option gpus='two' is not valid\n"
                          "  hint: gpus must be a whole number >= 0\n")
    res = gpurun("queue", "submit", str(q), "--host", "gpu-box-7")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("gpurun: error: ") and "\n  hint: " in res.stderr
    # a --json after `--` is not ours
    res = gpurun("queue", "submit", "--", str(q))
    assert res.returncode == 2 and res.stdout == "" and res.stderr.startswith("gpurun: error: ")


def test_usage_errors_json(home, tmp_path):
    res = gpurun("queue", "submit", "--json")                  # missing FILE
    assert res.returncode == 2
    err = _json_error(res)
    assert err["code"] == "usage" and "FILE" in err["message"] and "gpurun queue submit --help" in err["hint"]
    res = gpurun("queue", "status", "--json", "--bogus")
    assert res.returncode == 2 and _json_error(res)["code"] == "usage"
    res = gpurun("queue", "submit", str(tmp_path / "q.txt"), "--from", "zero", "--json")
    assert res.returncode == 2 and _json_error(res)["code"] == "usage"
    res = gpurun("queu", "status", "--json")                   # a typo in the command still asked for JSON
    assert res.returncode == 2 and _json_error(res)["code"] == "usage"


@pytest.mark.parametrize("args", [
    ("--json",),                     # the root takes no --json: a plain usage error
    ("--json", "queue", "status"),
    ("host", "add", "b1", "--json"),  # a command without --json
])
def test_json_not_requested_stays_human(home, args):
    res = gpurun(*args)
    assert res.returncode == 2 and res.stdout == ""
    assert "No such option: --json" in res.stderr or "No such option '--json'" in res.stderr


def test_interrupt_and_bug_json(home, monkeypatch, capsys):
    from orchestrator.cli import main as M

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(M.cli, "main", interrupted)
    with pytest.raises(SystemExit) as exc:
        M.main(["watch", "--once", "--json"])
    assert exc.value.code == 130
    out = capsys.readouterr()
    assert json.loads(out.out)["error"]["code"] == "interrupted" and out.err == ""
    with pytest.raises(SystemExit) as exc:
        M.main(["watch", "--once"])
    out = capsys.readouterr()
    assert exc.value.code == 130 and out.out == "" and out.err == "gpurun: interrupted\n"

    def bug(*a, **k):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(M.cli, "main", bug)
    with pytest.raises(ZeroDivisionError):                       # the traceback still reaches stderr
        M.main(["queue", "status", "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["code"] == "internal" and "ZeroDivisionError: oops" in err["message"]

    def gate(*a, **k):
        raise E.GateRefused("2 artifacts not verified at home", "run `gpurun pull` first")

    monkeypatch.setattr(M.cli, "main", gate)
    with pytest.raises(SystemExit) as exc:
        M.main(["down", "box1", "--json"])
    assert exc.value.code == 3
    assert json.loads(capsys.readouterr().out) == {"error": {
        "code": "gate_refused", "message": "2 artifacts not verified at home", "hint": "run `gpurun pull` first"}}


def test_json_requested_detection():
    from orchestrator.cli.main import _json_requested as J
    assert J(["queue", "submit", "f", "--json"])
    assert J(["watch", "--once", "--json"])
    assert J(["queue", "status", "--json", "--host", "x"])
    assert not J(["--json"])
    assert not J(["--json", "queue", "status"])
    assert not J(["queue", "submit", "f"])
    assert not J(["queue", "submit", "--", "f", "--json"])
    assert not J(["host", "add", "b1", "--json"])


def test_a_command_that_printed_its_document_keeps_stdout_to_it(home, monkeypatch, capsys):
    """``down --json`` prints its refused decision, then raises GateRefused: stdout stays that one
    document and the error goes to stderr in the human form, as before."""
    import click

    from orchestrator.cli import main as M

    def refused(*a, **k):
        click.echo(json.dumps({"decision": "refused"}))
        raise E.GateRefused("1 job has no verified pull", "run `gpurun pull` first")

    monkeypatch.setattr(M.cli, "main", refused)
    with pytest.raises(SystemExit) as exc:
        M.main(["down", "box1", "--yes", "--json"])
    out = capsys.readouterr()
    assert exc.value.code == 3 and json.loads(out.out) == {"decision": "refused"}
    assert out.err == "gpurun: error: 1 job has no verified pull\n  hint: run `gpurun pull` first\n"
    assert not isinstance(sys.stdout, M._StdoutWatch)           # stdout is given back


# --- the README's tables ---------------------------------------------------------------------

def _readme_table(after: str, head: str) -> list[list[str]]:
    """The rows of the first table whose header line is ``head`` after the heading ``after``."""
    text = README[README.index(after):]
    lines = text[text.index(head):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def test_readme_lists_every_error_code_with_its_exit_code():
    rows = _readme_table("## Errors", "| code | meaning | exit |")
    listed = {}
    for code, meaning, exit_code in rows:
        assert re.fullmatch(r"`[a-z_]+`", code) and meaning, (code, meaning)
        assert code.strip("`") not in listed, f"{code} listed twice"
        listed[code.strip("`")] = int(exit_code)
    actual = {cls.code: cls.exit_code for cls in _all_classes()}
    actual.update({code: exit_code for code, (_, exit_code) in E.CLI_CODES.items()})
    missing = sorted(set(actual) - set(listed))
    assert not missing, f"codes in orchestrator/errors.py the README's errors table does not list: {missing}"
    stale = sorted(set(listed) - set(actual))
    assert not stale, f"the README lists codes that no longer exist: {stale}"
    wrong = {c: (listed[c], actual[c]) for c in actual if listed[c] != actual[c]}
    assert not wrong, f"README exit code != the class's (readme, code): {wrong}"
    assert listed["quality_stop"] == 12 and listed["metrics_source"] == 2 and listed["disk_full"] == 1


def test_readme_exit_code_table_has_every_exit_code():
    rows = _readme_table("### Exit codes", "| exit | meaning |")
    table = {int(code.strip("`")): meaning for code, meaning in rows}
    used = {0, 10, 11} | {cls.exit_code for cls in _all_classes()} | {x for _, x in E.CLI_CODES.values()}
    assert set(table) == used, (sorted(table), sorted(used))
    assert "queue submit --wait" in table[12] and "STOP" in table[12]
    assert "WAIT" in table[10] and "STOP" in table[11] and "Ctrl-C" in table[130] and "gate" in table[3]


# --- one clean line --------------------------------------------------------------------------

@pytest.mark.parametrize("args,message,hint", [
    (["queu", "status"], "gpurun: error: No such command 'queu'. Did you mean 'queue'?", "see `gpurun --help`"),
    (["queue", "status", "--bogus"], "gpurun: error: No such option '--bogus'. Did you mean '--host'?",
     "see `gpurun queue status --help`"),
    (["queue", "submit"], "gpurun: error: Missing argument 'FILE'.", "see `gpurun queue submit --help`"),
    (["queue", "cancle", "x"], "gpurun: error: No such command 'cancle'. (Did you mean one of: 'balance', 'cancel'?)",
     "see `gpurun queue --help`"),
    (["watch", "--intervall", "2"], "gpurun: error: No such option '--intervall'. Did you mean '--interval'?",
     "see `gpurun watch --help`"),
    (["recover", "--policy", "wiat", "box"], ("gpurun: error: Invalid value for '--policy': 'wiat' is not one of "
                                              "'wait', 'restart', 'replace'."), "see `gpurun recover --help`"),
    # click raises this one without a context: the command is found from the line
    (["queue", "status", "--host"], "gpurun: error: Option '--host' requires an argument.",
     "see `gpurun queue status --help`"),
    (["check", "--jbo", "x"], "gpurun: error: No such option '--jbo'. Did you mean '--job' or '--json'?",
     "see `gpurun check --help`"),
    (["-H"], "gpurun: error: No such option '-H'.", "see `gpurun --help`"),
])
def test_usage_errors_are_one_line_and_a_hint(isolated_home, args, message, hint):
    res = gpurun(*args, env={**__import__("os").environ, "COLUMNS": "80"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == f"{message}\n  hint: {hint}\n"


def test_cancel_all_with_nothing_to_cancel_names_the_host(home):
    res = gpurun("queue", "cancel", "--all", "--yes")
    assert res.returncode == 0 and res.stdout == "local: nothing to cancel\n", res.stdout


def test_a_group_alone_still_shows_its_help(isolated_home):
    res = gpurun("queue")
    assert res.returncode == 2 and "Usage: gpurun queue" in res.stderr + res.stdout
    assert "Commands:" in res.stderr + res.stdout and "gpurun: error" not in res.stderr


def test_control_characters_in_an_error_are_escaped(home, monkeypatch, capsys):
    from orchestrator.cli import main as M

    def odd(*a, **k):
        raise E.QueueFileError("q\nx.txt: no such queue file", "check \x1b[31mthe path")

    monkeypatch.setattr(M.cli, "main", odd)
    with pytest.raises(SystemExit) as exc:
        M.main(["queue", "submit", "q\nx.txt"])
    out = capsys.readouterr()
    assert exc.value.code == 2
    assert out.err == "gpurun: error: q\\nx.txt: no such queue file\n  hint: check \\x1b[31mthe path\n"
    with pytest.raises(SystemExit):
        M.main(["queue", "submit", "q\nx.txt", "--json"])           # JSON carries the name as it is
    assert json.loads(capsys.readouterr().out)["error"]["message"] == "q\nx.txt: no such queue file"


def test_down_blocking_lines_escape_odd_file_names(home, tmp_path):
    """A checkpoint named with a newline or an escape sequence is one ``blocking:`` line each, and
    the terminal never receives the raw escape."""
    writer = tmp_path / "w.py"
    writer.write_text("import os\nos.makedirs('ck', exist_ok=True)\n"
                      "for n in ('new\\nline.pt', 'esc\\x1b[31mred.pt', 'plain.pt'):\n"
                      "    open(os.path.join('ck', n), 'w').write(n)\n")
    q = tmp_path / "q.txt"
    q.write_text(f"[name=odd checkpoints=ck] python3 {writer}\n")
    assert gpurun("queue", "submit", str(q), "--wait", cwd=str(tmp_path)).returncode == 0
    res = gpurun("down", "local", "--dry-run", "--dest", str(tmp_path / "nothing-pulled"))
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    blocking = [ln for ln in res.stderr.splitlines() if ln.startswith("  blocking: ")]
    assert any(ln.endswith("/checkpoints/new\\nline.pt'") for ln in blocking), blocking
    assert any(ln.endswith("/checkpoints/esc\\x1b[31mred.pt'") for ln in blocking), blocking
    assert any(ln.endswith("/checkpoints/plain.pt") for ln in blocking), blocking   # a plain name stays plain
    assert "\x1b" not in res.stderr and "line.pt" not in [ln.strip() for ln in res.stderr.splitlines()]
    assert all(ln.startswith(("  ", "gpurun: error: ")) for ln in res.stderr.splitlines()), res.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["profiles", "ls"], ["profiles", "ls", "--json"], ["--help"], ["--version"]])
def test_stdout_on_a_full_disk_is_one_line(isolated_home, args):
    import subprocess
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=60, check=False)
    assert res.returncode == 1, res.stderr
    assert res.stderr == ("gpurun: error: cannot write the output: No space left on device\n"
                          "  hint: free space where stdout goes, or send it elsewhere\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_json_error_that_stdout_cannot_take_goes_to_stderr(isolated_home):
    import subprocess
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "orchestrator.cli", "queue", "status", "--json", "--host", "nope"],
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert res.returncode == 2 and res.stderr.startswith("gpurun: error: unknown host 'nope'\n  hint: ")
    assert "Traceback" not in res.stderr and len(res.stderr.splitlines()) == 2
