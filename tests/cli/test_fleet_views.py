"""Fleet-wide views and verbs (``core/fleet_views``) on two loopback boxes: each box is its own
real sshd on its own port, logging in as its own unix user (so state dirs, agents and homes
differ), and a box goes down by stopping its sshd. Driven through the real CLI."""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path

import pytest
from rigs.agents import gpurun
from rigs.fleet import box_entry
from rigs.fleet import wait_until as wait_for
from rigs.sshd import CLEAN_USER, SshdRig, _ensure_user, sshd_available

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

OTHER_USER = "gpurun-f3b"  # box-b's unix user (box-a is the rig's clean user)


@pytest.fixture(scope="module")
def rigs():
    why = sshd_available()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("two boxes as two unix users need root to create the second user")
    _ensure_user(OTHER_USER, noisy=False)
    a, b = SshdRig(), SshdRig()
    a.start()
    b.start()
    yield a, b
    a.close()
    b.close()


def _box(rig: SshdRig, user: str, name: str, **more: object) -> dict:
    return box_entry(rig, user, name, label="f3", **more)


@pytest.fixture
def fleet(rigs, home):
    """Fleet ``f`` of ``box-a`` (one slot) and ``box-b`` (two), host keys trusted."""
    from orchestrator import hosts, paths
    from orchestrator.fleets import add_fleet

    a, b = rigs
    boxes = {"box-a": _box(a, CLEAN_USER, "box-a", slots=1), "box-b": _box(b, OTHER_USER, "box-b", slots=2)}
    for rig in rigs:
        rig.trust(paths.data_home() / "known_hosts")
    for e in boxes.values():
        hosts.add_host(e)
    add_fleet("f", ["box-a", "box-b"])
    try:
        yield boxes
    finally:
        for rig in rigs:
            rig.start()
        for name in boxes:  # the agents run as the box users, outside ``home``: stop them
            gpurun("agent", "stop", "--host", name, "--yes", timeout=60)


def submit(host: str, *lines: str) -> list[str]:
    from orchestrator.core.queue import to_jobs
    from orchestrator.core.session import open_session
    from orchestrator.queuefile import parse_text

    with open_session(host) as s:
        jobs, _ = to_jobs(parse_text("\n".join(lines) + "\n", "q.txt"), s.host, "q.txt")
        s.submit(jobs)
    return [j["id"] for j in jobs]


def states(host: str) -> dict[str, str]:
    from orchestrator.core.session import open_session
    with open_session(host) as s:
        return {j["name"]: j["state"] for j in s.status()["jobs"]}


def test_status_and_events_of_a_fleet_show_a_moved_job_once(fleet):
    work_a = Path(fleet["box-a"]["workdir"])
    hold, mover = submit("box-a", "[name=hold] while [ ! -e stop ]; do sleep 0.1; done",
                         "[name=mover cwd=/tmp] echo moved-here")
    (b1,) = submit("box-b", "[name=b1] echo on-b")
    wait_for(lambda: states("box-a")["hold"] == "running", "hold running on box-a")
    assert states("box-a")["mover"] == "queued"  # box-a has one slot, held by `hold`

    # the move, as core/fleet_balance makes it: release on box-a, then submit the spec to box-b
    from orchestrator.core.session import open_session
    with open_session("box-a") as s:
        rel = s.release([mover], "box-b")
    assert [j["id"] for j in rel["released"]] == [mover]
    with open_session("box-b") as s:
        s.submit(rel["released"])
    wait_for(lambda: states("box-b").get("mover") == "succeeded" and states("box-b")["b1"] == "succeeded",
             "mover and b1 done on box-b")
    assert states("box-a")["mover"] == "moved"

    res = gpurun("queue", "status", "--fleet", "f", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["fleet"] == "f" and [h["host"] for h in doc["hosts"]] == ["box-a", "box-b"]
    where = {j["id"]: h["host"] for h in doc["hosts"] for j in h["jobs"]}
    assert sum(len(h["jobs"]) for h in doc["hosts"]) == 3  # the moved row on box-a is hidden
    assert where == {hold: "box-a", mover: "box-b", b1: "box-b"}
    assert not any("error" in h for h in doc["hosts"])

    res = gpurun("queue", "status", "--fleet", "f", env=dict(os.environ, TTY_COMPATIBLE="0"))
    assert res.returncode == 0, res.stderr
    head, *rows = res.stdout.splitlines()
    assert head.split()[:4] == ["HOST", "#", "NAME", "STATE"]
    assert sorted((r.split()[0], r.split()[2], r.split()[3]) for r in rows) == [
        ("box-a", "hold", "running"), ("box-b", "b1", "succeeded"), ("box-b", "mover", "succeeded")]
    assert "moved" not in res.stdout

    res = gpurun("queue", "events", "--fleet", "f", "--json", "--limit", "200")
    assert res.returncode == 0, res.stderr
    evs = json.loads(res.stdout)
    assert evs["fleet"] == "f" and evs["errors"] == []
    stamps = [e["ts_unix"] for e in evs["events"]]
    assert stamps == sorted(stamps)
    assert {e["host"] for e in evs["events"]} == {"box-a", "box-b"}
    # the moved job's history is on both hosts: released on box-a, run on box-b
    mover_hosts = {e["host"] for e in evs["events"] if e["job_id"] == mover}
    assert mover_hosts == {"box-a", "box-b"}
    assert all(e["job_name"] == "mover" for e in evs["events"] if e["job_id"] == mover)

    res = gpurun("queue", "events", "mover", "--fleet", "f")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines and all("mover" in ln for ln in lines)
    assert any("box-a" in ln for ln in lines) and any("box-b" in ln for ln in lines)

    # watch --fleet: both members, the moved row hidden, this poll's moves (none: box-a's only
    # queued job already moved, box-b has room and nothing queued)
    res = gpurun("watch", "--fleet", "f", "--once", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["fleet"] == "f" and doc["moves"] == []
    shown = {h["host"]: sorted(j["name"] for j in h["jobs"]) for h in doc["hosts"]}
    assert shown == {"box-a": ["hold"], "box-b": ["b1", "mover"]}

    res = gpurun("queue", "status", "--fleet", "f", env=dict(os.environ, TTY_COMPATIBLE="1", COLUMNS="80"))
    assert res.returncode == 0, res.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", res.stdout)  # the SGR codes take no columns
    heads = [ln for ln in text.splitlines() if ln.startswith("queue on ")]
    assert [h.split(" (")[0] for h in heads] == ["queue on box-a", "queue on box-b"]
    assert heads[0].endswith(": 1 running") and heads[1].endswith(": 2 succeeded")
    assert max(len(ln) for ln in text.splitlines()) <= 80

    # a controller that died between release and submit: no member but box-a holds the job, so
    # its moved row stays in sight (queue balance --fleet finishes the move)
    (transit,) = submit("box-a", "[name=transit cwd=/tmp] echo t")
    with open_session("box-a") as s:
        assert [j["id"] for j in s.release([transit], "box-b")["released"]] == [transit]
    doc = json.loads(gpurun("queue", "status", "--fleet", "f", "--json").stdout)
    rows = [(h["host"], j["state"]) for h in doc["hosts"] for j in h["jobs"] if j["id"] == transit]
    assert rows == [("box-a", "moved")]

    # down --fleet while a job runs on box-a: refused for box-a (jobs running), said per host
    res = gpurun("down", "--fleet", "f", "--dest", str(work_a.parent / "nowhere"))
    assert res.returncode == 3, (res.stdout, res.stderr)
    out = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
    assert out["box-a"].startswith("refused: jobs running or queued")
    assert "Traceback" not in res.stderr and "box-a" in res.stderr
    (work_a / "stop").touch()
    wait_for(lambda: states("box-a")["hold"] == "succeeded", "hold done")


def test_pull_and_down_fleet(fleet, tmp_path: Path):
    dest = tmp_path / "home-artifacts"
    line = "[name={n} checkpoints=ck] mkdir -p ck && head -c 300000 /dev/urandom > ck/{n}.bin"
    (ja,) = submit("box-a", line.format(n="ja"))
    (jb1, jb2) = submit("box-b", line.format(n="jb1"), line.format(n="jb2"))
    wait_for(lambda: set(states("box-a").values()) == {"succeeded"} and
             set(states("box-b").values()) == {"succeeded"}, "every job done")

    # nothing home yet: every member refused, each for its unverified artifacts
    res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--json")
    assert res.returncode == 3, res.stderr
    doc = json.loads(res.stdout)
    assert [(h["host"], h["outcome"], h["decision"]) for h in doc["hosts"]] == [
        ("box-a", "refused", "refused"), ("box-b", "refused", "refused")]
    assert all("unverified artifacts" in h["why"] for h in doc["hosts"])

    res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--dry-run")
    assert res.returncode == 3 and all(": refused: " in ln for ln in res.stdout.splitlines())
    teardown_log = Path(os.environ["XDG_DATA_HOME"]) / "gpurun" / "teardown.jsonl"
    assert len(teardown_log.read_text().splitlines()) == 2  # the refusals above; a dry run records nothing

    # one member pulled: box-a passes (nothing gpurun can stop: it says so), box-b still refused
    res = gpurun("pull", "--host", "box-a", "--dest", str(dest))
    assert res.returncode == 0, res.stderr
    res = gpurun("down", "--fleet", "f", "--dest", str(dest))
    assert res.returncode == 3, (res.stdout, res.stderr)
    out = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
    assert out["box-a"].startswith("nothing to stop:") and "stop it yourself" in out["box-a"]
    assert out["box-b"].startswith("refused: unverified artifacts")
    assert "box-b" in res.stderr and "Traceback" not in res.stderr

    # --job: the member that holds it pulls it; the other has nothing of it, and is no failure
    res = gpurun("pull", "--fleet", "f", "--dest", str(dest), "--job", "jb1", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [[j["job"] for j in h["jobs"]] for h in doc["hosts"]] == [[], [jb1]]
    res = gpurun("pull", "--fleet", "f", "--dest", str(dest), "--job", "jb1")
    assert res.returncode == 0 and "box-a: none of the named jobs is here" in res.stderr, res.stderr
    res = gpurun("pull", "--fleet", "f", "--dest", str(dest), "--job", "nosuch")
    assert res.returncode == 2 and "no job nosuch on any member" in res.stderr

    # --loop: every queue is done, so one round (with its rebalance) and out
    res = gpurun("pull", "--fleet", "f", "--dest", str(dest), "--json", "--loop", "--interval", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["fleet"] == "f" and doc["done"]
    assert [h["host"] for h in doc["hosts"]] == ["box-a", "box-b"]
    pulled = {j["job"]: (h["host"], j) for h in doc["hosts"] for j in h["jobs"]}
    assert set(pulled) == {ja, jb1, jb2}
    from orchestrator.agent.manifest import sha256_file
    for host, row in pulled.values():
        assert row["verified"] and row["complete"] and not row["failed"]
        local = Path(row["dir"])
        assert local.parent == dest / host
        assert json.loads((local / "PULL_VERIFIED.json").read_text())["complete"] is True
        name = row["name"]
        remote = Path(fleet[host]["workdir"]) / "ck" / f"{name}.bin"
        assert sha256_file(str(local / "checkpoints" / f"{name}.bin")) == sha256_file(str(remote))

    res = gpurun("down", "--fleet", "f", "--dest", str(dest))
    assert res.returncode == 0, (res.stdout, res.stderr)
    out = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
    assert set(out) == {"box-a", "box-b"} and all(v.startswith("nothing to stop:") for v in out.values())
    log = [json.loads(ln) for ln in (Path(os.environ["XDG_DATA_HOME"]) / "gpurun" / "teardown.jsonl")
           .read_text().splitlines()]
    assert [(r["host"], r["decision"], r.get("fleet")) for r in log[-2:]] == [
        ("box-a", "proceeded", "f"), ("box-b", "proceeded", "f")]


def test_a_member_down_is_reported_and_the_others_shown(fleet, rigs, tmp_path: Path):
    (ja,) = submit("box-a", "[name=ja] echo a")
    submit("box-b", "[name=jb] echo b")
    wait_for(lambda: states("box-a")["ja"] == "succeeded" and states("box-b")["jb"] == "succeeded", "jobs done")
    rigs[1].stop()  # box-b goes dark: its sshd and every live session

    plain = dict(os.environ, TTY_COMPATIBLE="0")
    res = gpurun("queue", "status", "--fleet", "f", env=plain)
    assert res.returncode == 1
    rows = res.stdout.splitlines()[1:]
    assert [(r.split()[0], r.split()[2]) for r in rows] == [("box-a", "ja")]
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("gpurun: box-b: unreachable") and "Traceback" not in res.stderr

    res = gpurun("queue", "status", "--fleet", "f", "--json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert [j["id"] for j in doc["hosts"][0]["jobs"]] == [ja] and "error" not in doc["hosts"][0]
    assert doc["hosts"][1]["host"] == "box-b" and doc["hosts"][1]["error"] and doc["hosts"][1]["jobs"] == []

    res = gpurun("queue", "events", "--fleet", "f")
    assert res.returncode == 1 and "box-a" in res.stdout and "box-b" not in res.stdout
    assert "gpurun: box-b: unreachable" in res.stderr

    dest = tmp_path / "d"
    res = gpurun("pull", "--fleet", "f", "--dest", str(dest), "--json", timeout=300)
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    a, b = doc["hosts"]
    assert a["done"] and [j["job"] for j in a["jobs"]] == [ja] and "error" not in a
    assert b["host"] == "box-b" and b["error"] and not doc["done"]
    assert "box-b: pull failed" in res.stderr
    assert (dest / "box-a").is_dir() and not (dest / "box-b").exists()


def test_watch_fleet_rebalances_and_shows_each_move(fleet):
    work_a = Path(fleet["box-a"]["workdir"])
    hold, q1, q2 = submit("box-a", "[name=hold] while [ ! -e stop ]; do sleep 0.1; done",
                          "[name=q1 cwd=/tmp] echo one", "[name=q2 cwd=/tmp] echo two")
    wait_for(lambda: states("box-a")["hold"] == "running", "hold running on box-a")
    try:
        # box-a: one slot, held, two queued; box-b: two free slots and nothing queued
        res = gpurun("watch", "--fleet", "f", "--once", env=dict(os.environ, TTY_COMPATIBLE="0"))
        assert res.returncode == 0, res.stderr
        moved = sorted(ln.split(" ", 1)[1] for ln in res.stdout.splitlines() if " moved job " in f" {ln}")
        assert moved and all(m.startswith(("moved job q1: box-a -> box-b", "moved job q2: box-a -> box-b"))
                             for m in moved), res.stdout
        wait_for(lambda: all(states("box-b").get(n) == "succeeded" for n in
                             [m.split()[2].rstrip(":") for m in moved]), "the moved jobs done on box-b")
        res = gpurun("queue", "status", "--fleet", "f", "--json")
        doc = json.loads(res.stdout)
        ids = [j["id"] for h in doc["hosts"] for j in h["jobs"]]
        assert sorted(ids) == sorted([hold, q1, q2])  # each job once, wherever it lives
    finally:
        (work_a / "stop").touch()


METERED = """\
extends: generic-ssh
description: a loopback box whose meter-stop verb leaves a file in the box user's home
meter_stop:
  name: stop
  description: writes the marker file
  irreversible: false
  how: {command: 'touch "$HOME/.gpurun-f3-meter-TOKEN"', api: null, console: "the test's own"}
"""


def _no_meter_verb_started(marks: dict) -> None:
    """No box ran the meter verb, nor started it: ``down`` starts it detached and it waits 2 s
    before it writes its mark, so a verb started by the command that just returned would be a
    live ``sh`` whose command line names the mark (no need to wait the 2 s for the file)."""
    assert not any(m.exists() for m in marks.values())
    name = next(iter(marks.values())).name.encode()
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
        except OSError:
            continue   # ended meanwhile
        assert name not in cmd, cmd
    assert not any(m.exists() for m in marks.values())


def test_down_fleet_asks_once_and_stops_each_verified_member(fleet, rigs, tmp_path: Path):
    from orchestrator import hosts, paths

    token = tmp_path.name[-12:] + str(os.getpid())
    prof = paths.user_profiles_dir() / "metered.yaml"
    prof.parent.mkdir(parents=True, exist_ok=True)
    prof.write_text(METERED.replace("TOKEN", token))
    for name in fleet:
        hosts.update_host(name, profile="metered")
    marks = {n: Path(pwd.getpwnam(e["ssh"]["user"]).pw_dir) / f".gpurun-f3-meter-{token}" for n, e in fleet.items()}
    dest = tmp_path / "d"
    try:
        submit("box-a", "[name=ja] echo a")
        submit("box-b", "[name=jb] echo b")
        wait_for(lambda: states("box-a")["ja"] == "succeeded" and states("box-b")["jb"] == "succeeded", "jobs done")
        assert gpurun("pull", "--fleet", "f", "--dest", str(dest)).returncode == 0

        res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--dry-run")
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert res.stdout.splitlines() == ["box-a: would stop: gate passes; `stop` would run",
                                           "box-b: would stop: gate passes; `stop` would run"]

        # a no to the one question: nothing stopped anywhere, exit 3
        res = gpurun("down", "--fleet", "f", "--dest", str(dest), input="n\n")
        assert res.returncode == 3, (res.stdout, res.stderr)
        assert "Stop the meter on box-a (stop), box-b (stop)?" in res.stderr
        out = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
        assert out == {"box-a": "not stopped: not confirmed; nothing was changed",
                       "box-b": "not stopped: not confirmed; nothing was changed"}
        _no_meter_verb_started(marks)

        res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--yes")
        assert res.returncode == 0, (res.stdout, res.stderr)
        out = dict(ln.split(": ", 1) for ln in res.stdout.splitlines())
        assert all(v.startswith("stopped: command: started on the host: touch") for v in out.values()), out
        with pytest.raises(AssertionError):   # the check above sees a verb started, waiting or done
            _no_meter_verb_started(marks)
        wait_for(lambda: all(m.exists() for m in marks.values()), "both meter verbs ran", 15)
        for m in marks.values():
            m.unlink()

        # box-b goes dark: judged from home (its pull is verified), so the fleet's name must be
        # typed; piped input is no typing, and a wrong name is no confirmation
        rigs[1].stop()
        res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--yes", input="f\n")
        assert res.returncode == 3, (res.stdout, res.stderr)
        assert "--confirm-fleet f" in res.stderr
        res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--confirm-fleet", "g")
        assert res.returncode == 3
        assert all(ln.split(": ", 1)[1].startswith("not stopped") for ln in res.stdout.splitlines())
        _no_meter_verb_started(marks)

        res = gpurun("down", "--fleet", "f", "--dest", str(dest), "--confirm-fleet", "f", "--json")
        assert res.returncode == 0, (res.stdout, res.stderr)
        doc = {h["host"]: h for h in json.loads(res.stdout)["hosts"]}
        assert doc["box-a"]["outcome"] == "stopped" and not doc["box-a"]["assessment"]["basis"] == "offline"
        assert doc["box-b"]["outcome"] == "nothing to stop" and doc["box-b"]["assessment"]["basis"] == "offline"
        assert "cannot be reached" in doc["box-b"]["why"]
        wait_for(lambda: marks["box-a"].exists(), "box-a's meter verb ran", 15)
        assert not marks["box-b"].exists()
        log = [json.loads(ln) for ln in (paths.data_home() / "teardown.jsonl").read_text().splitlines()]
        assert [(r["host"], r["decision"], r.get("confirmation")) for r in log[-2:]] == [
            ("box-a", "proceeded", "flag"), ("box-b", "proceeded", "flag")]
    finally:
        for m in marks.values():
            m.unlink(missing_ok=True)


def test_pull_fleet_loop_rebalances_until_everything_is_home(fleet, tmp_path: Path):
    import subprocess
    import sys

    work_a = Path(fleet["box-a"]["workdir"])
    hold, q = submit("box-a", "[name=hold] while [ ! -e stop ]; do sleep 0.1; done", "[name=q cwd=/tmp] echo q")
    wait_for(lambda: states("box-a")["hold"] == "running", "hold running on box-a")
    dest = tmp_path / "d"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "pull", "--fleet", "f", "--loop",
                             "--interval", "1", "--dest", str(dest), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the first round moves q off box-a (one slot, held) to box-b (free, nothing queued)
        wait_for(lambda: states("box-b").get("q") == "succeeded", "q moved to box-b and run there")
        assert proc.poll() is None  # hold still runs: the loop goes on
        (work_a / "stop").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        (work_a / "stop").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "moved job q: box-a -> box-b" in err
    doc = json.loads(out)
    assert doc["done"] and states("box-a") == {"hold": "succeeded", "q": "moved"}
    home = {h["host"]: sorted(j["job"] for j in h["jobs"]) for h in doc["hosts"]}
    assert home["box-b"] == [q] and hold in home["box-a"]
    assert all(j["verified"] and j["complete"] for h in doc["hosts"] for j in h["jobs"])
