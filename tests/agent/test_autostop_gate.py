"""Idle autostop on the box stops the meter only after every artifact is verified at home."""

from __future__ import annotations

import time

from rigs.agents import gpurun


def test_autostop_waits_for_verified_pull(home, tmp_path):
    stopfile = tmp_path / "meter-stopped"
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True)
    (prof / "local.yaml").write_text(
        "autostop:\n  enabled: true\n  idle_minutes: 0\n  check_interval_s: 1\n"
        f"  command: touch {stopfile}\n")
    q = tmp_path / "q.txt"
    q.write_text("[name=train] head -c 300000 /dev/urandom > $GPURUN_RUN_DIR/model.bin; echo trained\n")
    res = gpurun("queue", "submit", str(q), "--wait")
    assert res.returncode == 0, res.stderr
    ev = gpurun("queue", "status", "--json")
    assert ev.returncode == 0
    from orchestrator.core.session import open_session

    def refusals() -> list:
        with open_session() as s:
            return [e for e in s.events()["events"] if e["kind"] == "autostop" and "not verified at home" in
                    e["message"]]
    # the idle box asks the gate every second: two refusals in a row, and the meter still runs
    deadline = time.time() + 20
    while len(refusals()) < 2 and time.time() < deadline:
        time.sleep(0.3)
    assert not stopfile.exists(), "the meter must not stop before the artifacts are home"
    seen = refusals()
    assert len(seen) >= 2 and "model.bin" in seen[-1]["message"], seen
    pulled = gpurun("pull", "--dest", str(tmp_path / "home-copy"))
    assert pulled.returncode == 0, pulled.stderr
    deadline = time.time() + 20
    while not stopfile.exists() and time.time() < deadline:
        time.sleep(0.3)
    assert stopfile.exists(), "after a verified pull the idle box stops its meter"
    with open_session() as s:
        events = s.events()["events"]
    assert any(e["kind"] == "autostop" and "meter stopped" in e["message"] for e in events)
