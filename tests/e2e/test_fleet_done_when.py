"""Issue 13's first "Done when", typed as a user would: three loopback boxes (three unix users,
each behind its own sshd so one can die alone) are added with ``gpurun host add``, grouped with
``gpurun fleet add``, and a 12-job queue goes to the fleet with ``queue submit --fleet``. It is
spread by capacity (slots 1, 2, 3: 2, 4 and 6 jobs). The biggest box dies mid-queue (its sshd
stops and every process of its user is killed) while three of its jobs run and three wait;
``queue balance --fleet --lost-after 0`` moves its six jobs to the others, where they finish.
``down --fleet --dry-run`` refuses (exit 3) until ``pull --fleet`` has brought every artifact
home, verified against the box's own file; then it passes for the live members.

Each job appends its box user to ``<job>.starts`` when it starts and to ``<job>.done`` when its
work is written, in a directory every box user can write: the number of lines is what the jobs
did, whichever box ran them. Every job is done exactly once; a queued job of the dead box never
started there; the three killed mid-run started twice (there, then on a live box).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from rigs.agents import gpurun
from rigs.fleet import box_root, boxes, kill_user, shared_dir, shared_files
from rigs.fleet import wait_until as _wait

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

USERS = ("gpurun-f4a", "gpurun-f4b", "gpurun-f4c")
NAMES = ("box-a", "box-b", "box-c")
SLOTS = (1, 2, 3)
DEAD = 2   # box-c dies
NJOBS = 12


@pytest.fixture
def rigs():
    with boxes(USERS) as rigs:
        try:
            yield rigs
        finally:
            for u in USERS:   # each box's agent daemon and jobs (the users are this test's own)
                kill_user(u)


@pytest.fixture
def runs():
    with shared_dir("gpurun-f4-runs-") as d:
        yield d


def _user_env(tmp: Path) -> dict:
    """A new user's shell: its own HOME and XDG dirs, output piped, an 80-column terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPURUN_", "FORCE_COLOR", "NO_COLOR"))}
    env.update(COLUMNS="80", TTY_COMPATIBLE="0")
    return env


def _queue(runs: Path) -> str:
    lines = ["# a 12-job sweep: each writes its checkpoint under ck/<job>/"]
    for i in range(1, NJOBS + 1):
        n = f"j{i:02d}"
        me = "$(id -un)"
        lines.append(
            f"[name={n} checkpoints=ck/{n}] echo {me} >> {runs}/{n}.starts; "
            f"while [ -e {runs}/hold-{me} ]; do sleep 0.05; done; sleep {0.2 + (i % 4) * 0.3:.1f}; "
            f"mkdir -p ck/{n} && head -c {100_000 + i * 7_000} /dev/urandom > ck/{n}/model.bin && "
            f"echo {me} >> {runs}/{n}.done")
    return "\n".join(lines) + "\n"


def _status(env: dict) -> tuple[int, dict]:
    res = gpurun("queue", "status", "--fleet", "sweep", "--json", env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def _where(doc: dict) -> dict[str, tuple[str, str]]:
    """``{job name: (host, state)}`` from ``queue status --fleet --json``; each job once."""
    out: dict[str, tuple[str, str]] = {}
    for h in doc["hosts"]:
        for j in h["jobs"]:
            assert j["name"] not in out, (j["name"], out[j["name"]], h["host"])
            out[j["name"]] = (h["host"], j["state"])
    return out




def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_fleet_of_three_runs_every_job_once_survives_a_dead_box_and_pulls_home(
        rigs, runs: Path, home: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    env = _user_env(tmp_path)
    roots = {}
    for name, rig, user, slots in zip(NAMES, rigs, USERS, SLOTS):
        rig.trust(Path(os.environ["XDG_DATA_HOME"]) / "gpurun" / "known_hosts")
        root = roots[name] = box_root(rig, user, f"f4-{name}")
        res = gpurun("host", "add", name, "--ssh", f"{user}@127.0.0.1:{rig.port}", "--key", str(rig.client_key),
                     "--state-dir", str(root / "state"), "--workdir", str(root / "work"),
                     "--slots", str(slots), env=env)
        assert res.returncode == 0, res.stderr
    res = gpurun("fleet", "add", "sweep", *NAMES, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "fleet sweep: box-a, box-b, box-c (3 host(s))"

    q = tmp_path / "q.txt"
    q.write_text(_queue(runs))
    shared_files(runs, [f"j{i:02d}.{what}" for i in range(1, NJOBS + 1) for what in ("starts", "done")])
    dead_user = USERS[DEAD]
    (runs / f"hold-{dead_user}").touch()   # box-c's jobs wait once started, so it dies mid-queue

    # -- submit: spread by capacity ---------------------------------------------------------
    res = gpurun("queue", "submit", str(q), "--fleet", "sweep", env=env)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and all(len(ln) <= 80 for ln in res.stdout.splitlines()), res.stdout
    rc, doc = _status(env)
    assert rc == 0
    where = _where(doc)
    assert len(where) == NJOBS
    per_host = {n: sorted(j for j, (h, _) in where.items() if h == n) for n in NAMES}
    assert [len(per_host[n]) for n in NAMES] == [2, 4, 6], per_host

    # -- box-c dies with three jobs running and three queued --------------------------------
    def c_states() -> list[str]:
        return sorted(s for h, s in _where(_status(env)[1]).values() if h == "box-c")

    _wait(lambda: c_states() == ["queued"] * 3 + ["running"] * 3, "box-c: 3 running, 3 queued")
    held = sorted(j for j in per_host["box-c"] if _lines(runs / f"{j}.starts"))
    waiting = sorted(set(per_host["box-c"]) - set(held))
    assert len(held) == 3 and len(waiting) == 3

    rigs[DEAD].stop()              # its sshd, and every live session through it
    assert kill_user(dead_user) >= 1   # its agent daemon and its jobs

    # a fleet view with a member down: the others shown, the dead one said in one line
    rc, doc = _status(env)
    assert rc == 1
    down = {h["host"]: h for h in doc["hosts"]}["box-c"]
    assert down["error"] and down["jobs"] == []
    res = gpurun("queue", "status", "--fleet", "sweep", env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert next(ln for ln in res.stderr.splitlines() if ln.strip()).startswith("gpurun: box-c: unreachable")
    head, *rows = res.stdout.splitlines()   # piped: whitespace columns for grep and awk
    assert head.split()[:4] == ["HOST", "#", "NAME", "STATE"]
    assert {r.split()[0] for r in rows} == {"box-a", "box-b"} and len(rows) == 6
    res = gpurun("queue", "status", "--fleet", "sweep", env=dict(env, TTY_COMPATIBLE="1"))
    text = re.sub(r"\x1b\[[0-9;]*m", "", res.stdout)   # a terminal of 80 columns
    assert max(len(ln) for ln in text.splitlines()) <= 80, text
    assert "box-c: unreachable" in res.stderr

    # -- queue balance: box-c is lost at once, its six jobs go to the others ----------------
    res = gpurun("queue", "balance", "--fleet", "sweep", "--lost-after", "0", env=env, timeout=120)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "box-c is lost" in res.stderr, res.stderr
    moved = [ln for ln in res.stdout.splitlines() if ln.startswith("moved ")]
    assert sorted(ln.split()[1] for ln in moved) == per_host["box-c"], res.stdout
    assert all(re.search(r" from box-c to box-[ab]", ln) for ln in moved), moved

    def all_done() -> bool:
        _rc, doc = _status(env)
        got = _where(doc)
        return len(got) == NJOBS and all(s == "succeeded" for _, s in got.values())

    _wait(all_done, "all 12 jobs to succeed on box-a and box-b", timeout=90)
    where = _where(_status(env)[1])
    assert {h for h, _ in where.values()} == {"box-a", "box-b"}

    # every job did its work exactly once; box-c's queued jobs never started there
    users = {n: u for n, u in zip(NAMES, USERS)}
    for j in sorted(where):
        assert _lines(runs / f"{j}.done") == [users[where[j][0]]], j
        starts = _lines(runs / f"{j}.starts")
        if j in held:    # killed mid-run on box-c, run again on the box it moved to
            assert starts == [dead_user, users[where[j][0]]], (j, starts)
        else:
            assert starts == [users[where[j][0]]], (j, starts)

    # -- down refuses until pull --fleet has brought everything home ------------------------
    res = gpurun("down", "--fleet", "sweep", "--dry-run", env=env)
    assert res.returncode == 3, (res.stdout, res.stderr)
    verdict = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
    assert verdict["box-a"].startswith("refused: unverified artifacts"), verdict
    assert verdict["box-b"].startswith("refused: unverified artifacts"), verdict

    res = gpurun("pull", "--fleet", "sweep", "--json", env=env, timeout=300)
    assert res.returncode == 1, res.stderr   # box-c cannot be reached: said, the others pulled
    pulled = json.loads(res.stdout)
    assert {h["host"]: bool(h.get("error")) for h in pulled["hosts"]} == \
        {"box-a": False, "box-b": False, "box-c": True}
    got = {j["name"]: (h["host"], j) for h in pulled["hosts"] for j in h["jobs"]}
    assert sorted(got) == sorted(where)
    from orchestrator.agent.manifest import sha256_file
    for name, (host, row) in got.items():
        assert host == where[name][0] and row["verified"] and row["complete"] and not row["failed"], row
        local = [p for p in Path(row["dir"]).rglob("model.bin")]
        assert len(local) == 1, (name, local)
        remote = roots[host] / "work" / "ck" / name / "model.bin"
        assert sha256_file(str(local[0])) == sha256_file(str(remote)), name

    # every member passes now, the dead one too: judged from home, where its six jobs' verified
    # pulls sit under the hosts they moved to (generic-ssh boxes: nothing gpurun can stop)
    res = gpurun("down", "--fleet", "sweep", "--dry-run", env=env)
    assert res.returncode == 0, (res.stdout, res.stderr)
    verdict = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
    assert all(v.startswith("nothing to stop: gate passes") for v in verdict.values()), verdict
    doc = {h["host"]: h for h in json.loads(gpurun("down", "--fleet", "sweep", "--dry-run", "--json",
                                                   env=env).stdout)["hosts"]}
    assert doc["box-c"]["assessment"]["basis"] == "offline" and doc["box-c"]["outcome"] != "refused"
    print(f"fleet done-when: {time.monotonic() - started:.1f} s")


def test_a_newcomer_meets_fleets_through_help_and_typos(isolated_home: Path) -> None:
    """The first minutes, piped at 80 columns: the help tells the story; each slip is one clean
    error naming what is known."""
    from rigs.agents import one_error

    env = _user_env(isolated_home)
    res = gpurun("fleet", "--help", env=env)
    assert res.returncode == 0 and max(len(ln) for ln in res.stdout.splitlines()) <= 80, res.stdout
    for verb in ("queue submit q.txt --fleet", "queue balance --fleet", "pull --fleet", "down --fleet"):
        assert f"gpurun {verb} sweep" in res.stdout, verb

    res = gpurun("fleet", "ls", env=env)
    assert res.returncode == 0 and "gpurun fleet add NAME HOST..." in res.stderr
    assert "unknown host 'box-a'" in one_error(gpurun("fleet", "add", "GPU", "box-a", env=env))
    assert gpurun("host", "add", "box-a", "--ssh", "root@192.0.2.1:22", "--insecure-host-key",
                  env=env).returncode == 0   # TEST-NET: recorded, never contacted
    assert "invalid fleet name 'my fleet'" in one_error(gpurun("fleet", "add", "my fleet", "box-a", env=env))
    assert gpurun("fleet", "add", "GPU", "box-a", env=env).returncode == 0

    q = isolated_home / "q.txt"
    q.write_text("[name=a] echo a\n")
    res = gpurun("queue", "submit", str(q), "--fleet", "gpu", env=env)
    assert "unknown fleet 'gpu'" in one_error(res)
    assert "did you mean 'GPU'?" in res.stderr   # the case slip is the likeliest one
    res = gpurun("queue", "balance", env=env)
    assert "no fleet named" in one_error(res) and "--fleet NAME (fleets: GPU)" in res.stderr
