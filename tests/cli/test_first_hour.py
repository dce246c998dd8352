"""What a newcomer meets in the first hour, through the real CLI (issue 16): a status table that
stays readable at 80 columns and greps when piped, slots on a CPU host, named events with ISO
times, ``logs --tail`` in whole lines, Ctrl-C that says the jobs go on (exit 130), "did you
mean" for commands and hosts, ``host show``, ``--host/-H`` everywhere, ``host add`` checking
the name first, and shell completion of hosts and jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under, point_home, wait_terminal

LONG_REASON = ("resume gate: STOP: loss diverged at step 1200 (inf); the run is not restarted to burn more "
               "GPU hours; see `gpurun check --job toy-diverge-lr3` for the evidence and the hint")
NAMES = ["toy-lr0.05-seed0", "toy-lr0.05-seed1", "toy-diverge-lr3"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    for k in ("TTY_COMPATIBLE", "FORCE_COLOR", "COLUMNS", "GPURUN_HOST"):
        env.pop(k, None)
    env.update(extra)
    return env


def _store() -> Path:
    from orchestrator import paths
    return paths.local_state_dir("local") / "gpurun.db"


@pytest.fixture(scope="module")
def _finished_home(tmp_path_factory: pytest.TempPathFactory):
    """One home holding three finished jobs on ``local`` (no GPU here), one failed with a gate's
    long reason. Built once for the module: the tests that use it only read it (completion adds
    a host, which none of the others lists), and each run of the queue costs seconds."""
    home = tmp_path_factory.mktemp("finished") / "home"
    with pytest.MonkeyPatch.context() as mp:
        point_home(mp, home)
        q = home.parent / "q.txt"
        q.write_text(f"[name={NAMES[0]}] echo a\n[name={NAMES[1]}] echo b\n[name={NAMES[2]}] sh -c 'exit 3'\n")
        res = gpurun("queue", "submit", str(q), "--wait")
        assert res.returncode == 1, res.stderr           # one job failed
        st = wait_terminal()
        con = sqlite3.connect(str(_store()))             # the reason a resume gate would have left
        con.execute("UPDATE jobs SET reason=? WHERE name=?", (LONG_REASON, NAMES[2]))
        con.commit()
        con.close()
    yield home, st
    kill_agents_under(home)


@pytest.fixture
def finished(_finished_home, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The module's home of three finished jobs, as this test's home; their status document."""
    home, st = _finished_home
    point_home(monkeypatch, home)
    return st


# --- 1, 2: status on a terminal and piped; slots on a CPU host ---------------------------------
@pytest.mark.parametrize("columns", [80, 100])
def test_status_table_keeps_name_state_exit_at_terminal_width(finished, columns):
    res = gpurun("queue", "status", env=_env(TTY_COMPATIBLE="1", COLUMNS=str(columns)))
    assert res.returncode == 0, res.stderr
    lines = ANSI.sub("", res.stdout).splitlines()
    assert all(len(ln) <= columns for ln in lines), lines
    head = lines[1].split()
    assert head[:4] == ["#", "NAME", "STATE", "EXIT"]
    rows = {ln.split()[1]: ln.split() for ln in lines[2:] if ln[:1].strip()}
    assert rows[NAMES[0]][:4] == ["1", NAMES[0], "succeeded", "0"]
    assert rows[NAMES[2]][:4] == ["3", NAMES[2], "failed", "3"]
    assert rows[NAMES[0]][head.index("GPUS")] == "slot"
    reason = [ln for ln in lines if "resume gate" in ln]
    assert len(reason) == 1 and reason[0].rstrip().endswith("…")   # its own line, cut with an ellipsis
    assert "no GPU: 1 slot" in lines[0]                             # a CPU host's slots, in the header


def test_status_piped_is_one_plain_line_per_job(finished):
    res = gpurun("queue", "status", env=_env())
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 1 + 3 and "\x1b" not in res.stdout
    assert not set(res.stdout) & set("│┃─━┏┗╭")
    assert lines[0].split() == ["#", "NAME", "STATE", "EXIT", "TRY", "GPUS", "RUNTIME", "ID", "QUALITY", "REASON"]
    grep = [ln for ln in lines if "seed0" in ln]
    assert len(grep) == 1 and grep[0].split()[:6] == ["1", NAMES[0], "succeeded", "0", "1", "slot"]
    ids = {j["name"]: j["id"] for j in finished["jobs"]}
    assert grep[0].split()[7] == ids[NAMES[0]]                       # the full id when piped
    failed = [ln for ln in lines if NAMES[2] in ln][0]
    assert failed.endswith(LONG_REASON)                              # the reason last, whole
    awk = subprocess.run("gpurun queue status | awk '$3 == \"succeeded\" {print $2}'", shell=True,
                         capture_output=True, text=True, env=_env(), timeout=60)
    if awk.returncode == 0 and awk.stdout:                           # `gpurun` on PATH (pip install -e)
        assert awk.stdout.split() == NAMES[:2]
    js = json.loads(gpurun("queue", "status", "--json").stdout)      # --json unchanged
    assert {j["name"]: (j["gpus"], j["gpu_ids"]) for j in js["jobs"]} == {n: (1, []) for n in NAMES}


def test_host_ls_and_show_give_slots(home):
    from orchestrator import hosts
    hosts.update_host("local", slots=3)
    res = gpurun("host", "ls", env=_env(COLUMNS="120", TTY_COMPATIBLE="1"))  # a terminal: the drawn table
    assert res.returncode == 0 and re.search(r"local .*│ 3 ", res.stdout), res.stdout
    assert "slots: jobs at a time on a host without GPUs" in res.stdout
    piped = gpurun("host", "ls", env=_env(COLUMNS="120"))  # piped: plain columns, no box characters
    lines = piped.stdout.splitlines()
    assert lines[0].split() == ["name", "profile", "target", "state", "dir", "slots"], piped.stdout
    assert re.search(r"^local\s+local\s+this machine\s+\S+\s+3$", piped.stdout, re.M), piped.stdout
    assert not any(ch in piped.stdout for ch in "│┃━") and all(ln == ln.rstrip() for ln in lines)
    show = gpurun("host", "show", "local")
    assert show.returncode == 0 and re.search(r"^slots\s+3 ", show.stdout, re.M), show.stdout


# --- 3: events name their job, and --json times are ISO --------------------------------------
def test_events_name_the_job_and_json_ts_is_iso(finished):
    res = gpurun("queue", "events")
    assert res.returncode == 0, res.stderr
    moves = [ln for ln in res.stdout.splitlines() if "queued -> running" in ln or "-> running" in ln]
    assert moves and all(any(n in ln for n in NAMES) for ln in moves), res.stdout
    ids = {j["name"]: j["id"] for j in finished["jobs"]}
    assert f"{NAMES[0]} ({ids[NAMES[0]][:8]})" in res.stdout
    doc = json.loads(gpurun("queue", "events", NAMES[0], "--json").stdout)
    ev = doc["events"][0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ev["ts"])
    assert isinstance(ev["ts_unix"], float) and abs(ev["ts_unix"] - time.time()) < 600
    assert ev["job_id"] == ids[NAMES[0]] and ev["job_name"] == NAMES[0]


# --- 4: logs --tail counts whole lines ---------------------------------------------------------
def test_logs_tail_counts_lines_and_never_starts_mid_line(home, tmp_path):
    q = tmp_path / "q.txt"
    # 3000 lines of 60 bytes: a byte tail would start mid-line; a line tail cannot
    q.write_text("[name=chatty] python3 -c \"[print('line %05d ' % i + 'x' * 49) for i in range(3000)]\"\n")
    assert gpurun("queue", "submit", str(q), "--wait").returncode == 0
    everything = gpurun("queue", "logs", "chatty", "--tail", "100000").stdout.splitlines()
    assert everything[0].startswith("--- gpurun") and len(everything) > 3000   # the wrapper's lines too
    assert f"line 02999 {'x' * 49}" in everything
    for n in (1, 7, 100):
        out = gpurun("queue", "logs", "chatty", "--tail", str(n)).stdout
        assert out.splitlines() == everything[-n:], out[:200]
    default = gpurun("queue", "logs", "chatty").stdout.splitlines()
    assert default == everything[-100:]
    assert gpurun("queue", "logs", "chatty", "-n", "0").stdout == ""


def test_logs_verb_old_byte_tail_starts_at_a_line(home, tmp_path):
    """An older client still sends ``tail_bytes``: it gets whole lines too."""
    from orchestrator.core.session import open_session
    q = tmp_path / "q.txt"
    q.write_text("[name=chatty] python3 -c \"[print('line %05d ' % i + 'x' * 49) for i in range(300)]\"\n")
    assert gpurun("queue", "submit", str(q), "--wait").returncode == 0
    with open_session("local") as s:
        data = s.logs("chatty", -1, 1000)["data"]
        assert data.startswith("line ") and len(data) <= 1000 and data.endswith("\n")
        five = s.logs("chatty", -1, tail_lines=5)["data"].splitlines()
        assert len(five) == 5 and five == data.splitlines()[-5:]


# --- 5: Ctrl-C says the jobs go on, and exits 130 ---------------------------------------------
def _interrupt(args: list[str], cwd: Path, wait_for: str) -> tuple[int, str]:
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=str(cwd), env=_env())
    deadline = time.time() + 60
    while time.time() < deadline:                    # until the job runs (the command is blocking)
        st = json.loads(gpurun("queue", "status", "--json").stdout)
        if any(j["state"] == "running" for j in st["jobs"]):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert wait_for in err, err
    return p.returncode, err


def test_ctrl_c_in_wait_and_follow_says_jobs_keep_running(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("[name=sleeper] sleep 60\n")
    rc, err = _interrupt(["queue", "submit", str(q), "--wait"], tmp_path, "interrupted")
    assert rc == 130 and "jobs keep running on local" in err and "aborted" not in err
    assert "gpurun queue status --host local" in err
    rc, err = _interrupt(["queue", "logs", "sleeper", "-f"], tmp_path, "interrupted")
    assert rc == 130 and "job keeps running on local" in err
    st = json.loads(gpurun("queue", "status", "--json").stdout)
    assert [j["state"] for j in st["jobs"]] == ["running"]         # Ctrl-C left the job alone
    gpurun("queue", "cancel", "sleeper")


def test_ctrl_c_in_pull_says_jobs_keep_running(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("[name=sleeper] sleep 60\n")
    assert gpurun("queue", "submit", str(q)).returncode == 0
    rc, err = _interrupt(["pull", "--loop", "--interval", "1", "--dest", str(tmp_path / "dest")], tmp_path,
                         "interrupted")
    assert rc == 130 and "jobs keep running on local" in err and "pull stopped" in err
    gpurun("queue", "cancel", "sleeper")


# --- 6: did you mean ----------------------------------------------------------------------------
@pytest.mark.parametrize("typo,meant", [("queu", "'queue'"), ("chek", "'check'"), ("hosts", "'host'"),
                                        ("status", "'queue status'")])
def test_top_level_typo_gets_a_suggestion(home, typo, meant):
    res = gpurun(typo)
    assert res.returncode == 2 and f"Did you mean {meant}?" in res.stderr, res.stderr


def _add_box(name: str = "box") -> None:
    from orchestrator import hosts
    hosts.add_host({"name": name, "profile": "generic-ssh", "kind": "ssh", "python": "python3",
                    "ssh": {"user": "root", "hostname": "127.0.0.1", "port": 1}, "slots": 2,
                    "state_dir": "~/.gpurun", "workdir": "~/gpurun-work"})


def test_unknown_host_suggests_the_close_one(home):
    _add_box()
    res = gpurun("queue", "status", "--host", "bxo")
    assert res.returncode == 2 and "did you mean 'box'?" in res.stderr, res.stderr
    doc = json.loads(gpurun("queue", "status", "--host", "bxo", "--json").stdout)
    assert doc["error"]["code"] == "host" and "did you mean 'box'?" in doc["error"]["hint"]


# --- 7: host show ---------------------------------------------------------------------------------
def test_host_show(home):
    _add_box()
    res = gpurun("host", "show", "box")
    assert res.returncode == 0, res.stderr
    for needle in ("kind       ssh", "generic-ssh", "root@127.0.0.1:1", "slots      2", "~/.gpurun", "~/gpurun-work"):
        assert needle in res.stdout, res.stdout
    doc = json.loads(gpurun("host", "show", "box", "--json").stdout)
    assert {k: doc[k] for k in ("name", "kind", "profile", "target", "slots", "state_dir", "workdir")} == {
        "name": "box", "kind": "ssh", "profile": "generic-ssh", "target": "root@127.0.0.1:1", "slots": 2,
        "state_dir": "~/.gpurun", "workdir": "~/gpurun-work"}
    bad = gpurun("host", "show", "nope", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "host"


# --- 8: --host/-H everywhere ---------------------------------------------------------------------
CMDS_WITH_HOST = [["queue", "status"], ["queue", "submit", "x"], ["queue", "logs", "x"], ["queue", "cancel"],
                  ["queue", "retry", "x"], ["queue", "events"], ["gpu"], ["reap"], ["pull"], ["push"],
                  ["watch"], ["check"], ["down"], ["setup", "generic-ssh"], ["recover"]]


@pytest.mark.parametrize("cmd", CMDS_WITH_HOST, ids=lambda c: " ".join(c))
def test_every_command_takes_host_and_dash_h(home, cmd):
    helptext = gpurun(*[c for c in cmd if c not in ("x", "generic-ssh")], "--help").stdout
    assert re.search(r"-H, --host NAME", helptext), helptext


def test_positional_host_is_an_alias_of_the_option(home):
    _add_box()
    a = gpurun("down", "-H", "bxo", "--dry-run")
    b = gpurun("down", "bxo", "--dry-run")
    assert a.returncode == b.returncode == 2 and "unknown host 'bxo'" in a.stderr and "unknown host 'bxo'" in b.stderr
    both = gpurun("recover", "box", "--host", "other")
    assert both.returncode == 2 and "two hosts named" in both.stderr
    none = gpurun("setup", "generic-ssh")
    assert none.returncode == 2 and "name the host" in none.stderr
    assert gpurun("queue", "status", "-H", "local").returncode == 0


# --- 9: host add checks the name before contacting the box ---------------------------------------
def test_host_add_existing_name_is_refused_before_contact(home):
    _add_box()
    t0 = time.time()
    res = gpurun("host", "add", "box", "--ssh", "root@192.0.2.1:22")   # TEST-NET: would hang if contacted
    assert res.returncode == 2 and "already exists" in res.stderr and "--replace" in res.stderr
    assert time.time() - t0 < 20
    from orchestrator import paths
    kh = paths.data_home() / "known_hosts"
    assert not kh.exists() or "192.0.2.1" not in kh.read_text()


# --- 10: shell completion --------------------------------------------------------------------------
def _complete(words: str) -> list[str]:
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli"], capture_output=True, text=True, timeout=60,
                         env=_env(_GPURUN_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(cword)))
    assert res.returncode == 0, res.stderr
    return [ln.split(",", 1)[1] for ln in res.stdout.splitlines() if "," in ln]


def test_completion_offers_commands_hosts_and_jobs(finished):
    _add_box()
    assert "queue" in _complete("gpurun qu")
    assert _complete("gpurun queue status --host b") == ["box"]
    assert set(_complete("gpurun down ")) >= {"box", "local"}
    assert _complete("gpurun queue logs toy-lr") == NAMES[:2]
    from orchestrator.core import snapshot                            # an SSH host: from the snapshot at home
    box = {"name": "box", "kind": "ssh"}
    snapshot.record(box, "submit", {"jobs": [{"id": "abc123", "name": "remote-seed0", "command": "true"}]},
                    {"added": ["abc123"], "present": []})
    assert _complete("gpurun queue cancel --host box rem") == ["remote-seed0"]
    src = subprocess.run([sys.executable, "-m", "orchestrator.cli"], capture_output=True, text=True, timeout=60,
                         env=_env(_GPURUN_COMPLETE="bash_source"))
    assert "_GPURUN_COMPLETE=bash_complete" in src.stdout
