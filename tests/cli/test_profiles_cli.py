"""``gpurun profiles ls|show`` driven through the real command, in a temp HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def gpurun(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / "data"),
               XDG_CONFIG_HOME=str(home / "config"))
    env.pop("RUNPOD_API_KEY", None)
    return subprocess.run([sys.executable, "-c", "from orchestrator.cli.main import main; main()",
                           *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def test_ls_json_contract(home: Path) -> None:
    r = gpurun("profiles", "ls", "--json", home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["errors"] == []
    rows = {p["name"]: p for p in doc["profiles"]}
    assert set(rows) == {"autodl", "generic-ssh", "lambda", "local", "paperspace", "runpod",
                         "slurm", "vastai"}
    assert set(rows["runpod"]) == {
        "name", "kind", "description", "source", "layers", "meter_stop",
        "meter_stop_irreversible", "destroy", "bills_when_stopped", "danger_clocks", "spot",
        "detach", "boot_hook", "credential_env", "checked"}
    assert rows["autodl"]["danger_clocks"] == ["auto-release: after 15 days powered off"]
    assert rows["lambda"]["meter_stop_irreversible"] is True
    assert rows["runpod"]["credential_env"] == "RUNPOD_API_KEY"


def test_ls_table_names_every_profile(home: Path) -> None:
    r = gpurun("profiles", "ls", home=home)
    assert r.returncode == 0, r.stderr
    for name in ("autodl", "runpod", "vastai", "lambda", "local", "generic-ssh"):
        assert name in r.stdout
    assert "irreversible" in r.stdout
    # piped: one plain line per profile, the header first, no drawn box
    lines = r.stdout.splitlines()
    assert lines[0].split()[:2] == ["profile", "kind"] and not any(ch in r.stdout for ch in "│┃━")
    assert any(ln.startswith("lambda ") and "(irreversible)" in ln for ln in lines), r.stdout


def test_show_speaks_plain_words(home: Path) -> None:
    r = gpurun("profiles", "show", "autodl", home=home)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "To stop the meter: 关机 (power off) (reversible)" in out
    assert "To destroy: 释放 (release) (IRREVERSIBLE)" in out
    assert "Danger clock 'auto-release' (after 15 days powered off)" in out
    assert "Still bills when stopped: the data disk's storage fee (small)" in out
    assert "network filesystem" in out and "credential from env var AUTODL_TOKEN" in out
    r = gpurun("profiles", "show", "runpod", home=home)
    assert "Wiped on stop: container-disk (/)" in r.stdout
    assert "RUNPOD_API_KEY (NOT set here)" in r.stdout


def test_show_json_is_the_merged_profile(home: Path) -> None:
    d = home / "config" / "gpurun" / "profiles"
    d.mkdir(parents=True)
    (d / "vastai.yaml").write_text("watchdog:\n  stall_after_s: 420\n")
    r = gpurun("profiles", "show", "vastai", "--json", home=home)
    doc = json.loads(r.stdout)
    assert set(doc) == {"name", "source", "layers", "profile", "plain"}
    assert doc["profile"]["watchdog"]["stall_after_s"] == 420
    assert doc["profile"]["watchdog"]["disk_pct"] == 95
    assert doc["layers"][-1] == str(d / "vastai.yaml")


def test_unknown_profile_is_one_line_exit_2(home: Path) -> None:
    r = gpurun("profiles", "show", "runpdo", home=home)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "gpurun: error: unknown profile 'runpdo'"
    assert lines[1].startswith("  hint: did you mean 'runpod'?")


def test_a_broken_user_profile_fails_ls_but_lists_the_rest(home: Path) -> None:
    d = home / "config" / "gpurun" / "profiles"
    d.mkdir(parents=True)
    (d / "runpod.yaml").write_text("spot:\n  grace_s: [\n")
    r = gpurun("profiles", "ls", "--json", home=home)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert "runpod" not in [p["name"] for p in doc["profiles"]] and len(doc["profiles"]) == 7
    assert doc["errors"][0]["name"] == "runpod"
    assert f"{d / 'runpod.yaml'}:3: YAML syntax error" in r.stderr
