"""Queue file parsing: formats that must work and lines that must be refused with file:line."""

from __future__ import annotations

import pytest

from orchestrator.errors import QueueFileError
from orchestrator.queuefile import duration, parse_file, parse_text, select


def test_crlf_bom_tabs_unicode_and_no_final_newline(tmp_path):
    p = tmp_path / "q.txt"
    p.write_bytes("\ufeff# comment\r\n\r\n[name=\"ünï run\"]\tpython train.py --tag 'α β' | tee \"out $X\".log\r\n"
                  "  echo done; ls -l && false || true".encode("utf-8"))
    specs = parse_file(p)
    assert [s.line for s in specs] == [3, 4]
    assert specs[0].name == "ünï run"
    assert specs[0].command == "python train.py --tag 'α β' | tee \"out $X\".log"
    assert specs[1].command == "echo done; ls -l && false || true"


def test_option_block_values_and_quotes():
    (s,) = parse_text('[name="my run" gpus=2 retries=3 timeout=90m cwd=/data env.SEED=7 env.MSG="a b" '
                      'metrics=m.jsonl checkpoints=ck] python t.py')
    assert (s.name, s.gpus, s.retries, s.timeout_s, s.cwd) == ("my run", 2, 3, 5400.0, "/data")
    assert s.env == {"SEED": "7", "MSG": "a b"}
    assert (s.metrics, s.checkpoints, s.command) == ("m.jsonl", "ck", "python t.py")


def test_command_starting_with_bracket_is_a_command():
    (s,) = parse_text("[ -f data.bin ] && python t.py")
    assert s.command == "[ -f data.bin ] && python t.py" and s.name is None


def test_identity_is_stable_and_distinct():
    a = parse_text("python t.py --lr 1\npython t.py --lr 2\n[name=x] python t.py --lr 1")
    again = parse_text("python t.py --lr 1\npython t.py --lr 2\n[name=x] python t.py --lr 1")
    assert [s.id for s in a] == [s.id for s in again]
    assert len({s.id for s in a}) == 3


@pytest.mark.parametrize("line,needle,hint", [
    ("[name=x gpus=two] python t.py", "q.txt:2: option gpus='two'", "whole number"),
    ("[name=x python t.py", "q.txt:2: option block", "[name=x gpus=1]"),
    ("[nmae=x] python t.py", "unknown option 'nmae'", "did you mean 'name'"),
    ("[name=x]", "no command", "same line"),
    ("[timeout=soon] echo", "timeout='soon'", "duration"),
    ("[env.1X=a] echo", "bad environment variable", "letters"),
    ("[name='x] echo", "q.txt:2", "quote"),
])
def test_malformed_lines_name_file_and_line(line, needle, hint):
    with pytest.raises(QueueFileError) as ei:
        parse_text("echo ok\n" + line + "\necho later\n", "q.txt")
    assert needle in str(ei.value)
    assert hint in (ei.value.hint or "")
    assert ei.value.exit_code == 2


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(QueueFileError, match="no such queue file"):
        parse_file(tmp_path / "nope.txt")
    with pytest.raises(QueueFileError, match="is a directory"):
        parse_file(tmp_path)


def test_invalid_utf8_names_the_line(tmp_path):
    p = tmp_path / "q.txt"
    p.write_bytes(b"echo a\necho \xff\n")
    with pytest.raises(QueueFileError, match=r"q.txt:2: not valid UTF-8"):
        parse_file(p)


def test_from_counts_jobs_not_lines():
    specs = parse_text("# c\necho 1\n\n# c\necho 2\necho 3\necho 4\n")
    assert [s.command for s in select(specs, 3)] == ["echo 3", "echo 4"]
    assert select(specs, 1) == specs


def test_durations():
    assert duration("90") == 90 and duration("2h") == 7200 and duration("1.5m") == 90 and duration("1d") == 86400
    with pytest.raises(ValueError):
        duration("-1h")
