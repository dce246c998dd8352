"""A bad config.yaml through the real CLI (issue 14, bug 6): wrong types, non-finite numbers,
unknown keys, bad UTF-8, a FIFO, and 80 fuzzed files (random bytes, truncations, flipped
bytes) give `pull`, `down` and `recover` one line naming file, line and key (exit 2, no
traceback, the same as {"error": ...} under --json), and `recover` refuses before it rents."""

from __future__ import annotations

import io
import json
import os
import random

import pytest

from orchestrator import paths
from orchestrator.cli.main import main
from rigs.agents import gpurun
from rigs.agents import one_error as _one_error

VALID = ("# gpurun config ✓\npull:\n  dest: ~/gpurun-artifacts   # ünïcode comment\n  keep_latest: 3\n"
         "  best: {metric: eval_loss, mode: min}\n  interval_s: 30\n  settle_s: 0.5\n"
         "s3:\n  endpoint_url: https://r2.example.com\n  bucket: my-runs\n  prefix: gpurun/\n"
         "  access_key_env: R2_KEY\n  secret_key_env: R2_SECRET\n").encode()


def _config(content: bytes):
    f = paths.config_home() / "config.yaml"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(content)
    return f


@pytest.mark.parametrize("content,needle", [
    (b"pull: {dest: 5}\n", "config.yaml:1: key 'pull.dest': expected text, got a number 5"),
    (b"pull: {dest: ~nosuchuser9/runs}\n", "key 'pull.dest': '~nosuchuser9/runs' is not a directory path"),
    (b"pull:\n  interval_s: abc\n", "config.yaml:2: key 'pull.interval_s': expected a number"),
    (b"pull:\n  interval_s: .nan\n", "config.yaml:2: key 'pull.interval_s': nan is not a finite number"),
    (b"pull: {settle_s: .inf}\n", "key 'pull.settle_s': inf is not a finite number"),
    (b"pull: {keep_latest: many}\n", "key 'pull.keep_latest': expected a whole number"),
    (b"pull: {best: {metric: loss, mode: avg}}\n", "key 'pull.best.mode': 'avg' is not one of min, max"),
    (b"pull: [1, 2]\n", "key 'pull': expected a mapping of keys, got a list"),
    (b"s3: {bucket: 7}\n", "key 's3.bucket': expected text, got a number 7"),
    (b"pul: {dest: x}\n", "config.yaml:1: key 'pul': unknown key"),
    (b"- pull\n", "key '(top level)': expected a mapping of keys, got a list"),
    (b"pull:\n  dest: caf\xe9\n", "config.yaml:2: not valid UTF-8 (byte 0xe9)"),
    (b"pull: {dest: " + b"[" * 60_000 + b"}\n", "nested deeper than 64 levels"),   # libyaml: SIGSEGV
    (b"pull: {keep_latest: 1" + b"0" * 5000 + b"}\n", "cannot read a value"),
], ids=["dest-number", "dest-unknown-user", "interval-text", "interval-nan", "settle-inf", "keep-text", "best-mode", "pull-list",
        "bucket-number", "typo-section", "top-list", "latin1", "deep-nesting", "5000-digits"])
def test_bad_config_is_one_clear_line_for_pull_and_down(home, tmp_path, content, needle):
    _config(content)
    for args in (["pull"], ["down", "local"]):
        assert needle in _one_error(gpurun(*args)), args
    res = gpurun("down", "local", "--json")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["code"] == "config" and needle in err["message"] and err["hint"]


def test_config_fifo_and_directory_are_refused(home):
    f = paths.config_home() / "config.yaml"
    f.parent.mkdir(parents=True)
    os.mkfifo(f)
    assert "config.yaml: is not a regular file" in _one_error(gpurun("pull", timeout=30))
    f.unlink()
    f.mkdir()
    assert "config.yaml: is a directory" in _one_error(gpurun("pull", timeout=30))


def _fuzz_cases(n: int = 80) -> list[bytes]:
    rnd = random.Random(20261123)
    cases: list[bytes] = []
    for _ in range(n // 2):                      # truncations, often inside a UTF-8 character
        cases.append(VALID[:rnd.randrange(1, len(VALID))])
    for _ in range(n // 4):                      # a few bytes flipped or inserted
        b = bytearray(VALID)
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(b))
            b[i:i + rnd.randint(0, 1)] = bytes([rnd.randrange(256)])
        cases.append(bytes(b))
    while len(cases) < n:                        # random bytes
        cases.append(bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 200))))
    return cases


def test_fuzzed_configs_never_give_a_traceback(home, tmp_path, capsys, monkeypatch):
    """Each case through the CLI in this process (80 subprocesses would take minutes): exit 0,
    or exit 2 with one `config` error line; never a traceback (`internal`, exit 1)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    # `pull` leaves its Ctrl-C note in a module global; monkeypatch puts None back afterwards
    monkeypatch.setattr("orchestrator.cli.render._interrupt_note", None)
    outcomes = {0: 0, 2: 0}
    for i, content in enumerate(_fuzz_cases()):
        _config(content)
        with pytest.raises(SystemExit) as ex:
            main(["pull", "--json"])
        out = capsys.readouterr()
        assert "Traceback" not in out.err, (i, content, out.err)
        assert ex.value.code in (0, 2), (i, content, out.err)
        if ex.value.code == 2:
            assert json.loads(out.out)["error"]["code"] == "config", (i, content, out.out)
        outcomes[ex.value.code] += 1
    assert outcomes[2] >= 40 and outcomes[0] >= 3, outcomes   # both sides of the line are exercised


def test_recover_refuses_a_bad_config_before_renting(home, monkeypatch):
    from orchestrator import hosts
    from orchestrator.providers import PROVIDERS, env_url_var
    from rigs.fake_providers import KEY, start_fake

    fake = start_fake("runpod", ssh=("127.0.0.1", 9), boot_polls=0)
    try:
        monkeypatch.setenv(PROVIDERS["runpod"][2], KEY)
        monkeypatch.setenv(env_url_var("runpod"), fake.url)
        inst = fake.new_instance("RTX 4090", 1, True, "box")
        fake.preempt(inst["id"])
        hosts.add_host({"name": "box", "profile": "runpod", "kind": "ssh",
                        "ssh": {"user": "root", "hostname": "127.0.0.1", "port": 9},
                        "instance": {"provider": "runpod", "id": inst["id"], "gpu": "RTX 4090", "count": 1}})
        _config(b"pull: {dest: 5}\n")
        res = gpurun("recover", "box", "--policy", "replace", "--yes", "--json", timeout=60)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert "key 'pull.dest'" in json.loads(res.stdout)["error"]["message"]
        assert len(fake.instances) == 1 and fake.requests == 0   # nothing rented, nothing asked
    finally:
        fake.close()


@pytest.mark.parametrize("content,needle", [
    (b"pull:\n  reverify: -1\n", "config.yaml:2: key 'pull.reverify': -1 is below the minimum 0"),
    (b"pull:\n  bwlimit_kbps: true\n", "config.yaml:2: key 'pull.bwlimit_kbps': expected a whole number"),
    (b"pull:\n  method: ftp\n", "config.yaml:2: key 'pull.method': 'ftp' is not one of auto, rsync, sftp"),
    (b"pull:\n  best: {mode: min}\n", "config.yaml:2: key 'pull.best.metric': missing required key"),
    (b"pull:\n  keep_latest: -2\n", "config.yaml:2: key 'pull.keep_latest': -2 is below the minimum 0"),
    (b"pull:\n  desst: /tmp\n", "config.yaml: unknown key 'pull.desst'"),
    (b"pull:\n  streams: 0\n", "config.yaml:2: key 'pull.streams': 0 is below the minimum 1"),
], ids=["reverify-negative", "bwlimit-bool", "method", "best-no-metric", "keep-negative", "unknown-key", "streams-zero"])
def test_pull_section_is_checked_once_with_its_line(home, content, needle):
    """Types and ranges of `pull:` are the schema's (userconfig), with file:line:key; core/pull
    only refuses keys the pull engine does not know."""
    from orchestrator.core.pull import pull_config
    from orchestrator.errors import ConfigError

    _config(content)
    with pytest.raises(ConfigError) as ex:
        pull_config()
    assert needle in ex.value.message and ex.value.hint


def test_a_key_pasted_into_config_yaml_is_never_printed(home):
    """`s3.secret_key_env: <the secret itself>`, the usual slip: one line naming the key, and the
    value on neither stream (a CI log would keep it), with or without --json."""
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    _config(f"s3:\n  bucket: runs\n  secret_key_env: '{secret}'\n".encode())
    line = _one_error(gpurun("pull"))
    assert "config.yaml:3: key 's3.secret_key_env'" in line and "not shown" in line
    res = gpurun("pull", "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["error"]["code"] == "config"
    for text in (line, res.stdout, res.stderr):
        assert secret[:10] not in text
    _config(b"s3:\n  bucket: runs\n  access_key_env: AKIAIOSFODNN7EXAMPLE\n")   # a recognisable key id
    line = _one_error(gpurun("pull"))
    assert "looks like a secret" in line and "AKIAIOSF" not in line
