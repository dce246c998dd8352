"""Issue 12, done when: a flat-from-start run on a real loopback SSH box gets a reviewer answer
from a loopback chat-completions server during the agent's periodic check, using a key that
reached the box only through ``gpurun secret set`` (never in the controller's environment when
the queue is submitted, never in any file or output gpurun writes)."""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under
from rigs.chat import chat_server

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

# writes a run that never learns (flat at its first loss, a little noise), then keeps running
# so that the agent's periodic check finds it alive
TRAIN = r"""
import json, math, os, time
with open(os.environ["GPURUN_RUN_DIR"] + "/metrics.jsonl", "w") as f:
    for i in range(400):
        f.write(json.dumps({"step": (i + 1) * 10, "loss": 2.3 * (1 + 0.003 * math.sin(i * 1.7))}) + "\n")
time.sleep(25)
"""


def test_flat_run_on_ssh_box_is_reviewed_with_a_key_set_by_secret_set(ssh_host, sshd, isolated_home, tmp_path):
    from orchestrator import paths
    from orchestrator.transport.ssh import SSHTransport

    key = "sk-" + pysecrets.token_hex(20)
    name = ssh_host["name"]
    state_dir, work = Path(ssh_host["state_dir"]), Path(ssh_host["workdir"])
    with SSHTransport(ssh_host) as t:  # the box's own dirs; gpurun creates the rest itself
        t.run(f"mkdir -p {work}")
    (work / "train.py").write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if k != "REVIEW_KEY"}
    outputs: list[str] = []

    def run(*args: str, env_: dict | None = None, ok: bool = True):
        res = gpurun(*args, "--host", name, env=env_ or env, cwd=str(tmp_path))
        outputs.extend([res.stdout, res.stderr])
        assert not ok or res.returncode == 0, (args, res.stdout, res.stderr)
        return res

    with chat_server(answer="CONTINUE") as chat:
        udir = paths.user_profiles_dir()
        udir.mkdir(parents=True, exist_ok=True)
        (udir / f"{ssh_host['profile']}.yaml").write_text(
            "quality:\n  action: alert\n  intervals_s: [3, 60]\n  scan_s: 0.5\n  reviewer:\n"
            f"    base_url: {chat.url}\n    model: judge-model\n    key_env: REVIEW_KEY\n    timeout_s: 5\n")
        run("secret", "set", "REVIEW_KEY", env_=dict(env, REVIEW_KEY=key))  # the only way the key travels
        q = tmp_path / "q.txt"
        q.write_text("[name=flat gpus=0] python3 train.py\n")  # metrics.jsonl in its run dir is found
        try:
            run("queue", "submit", str(q))
            deadline = time.time() + 60
            while not chat.received and time.time() < deadline:
                time.sleep(0.3)
            assert chat.received, "the periodic check never asked the reviewer"
            req = chat.received[0]
            assert req["headers"]["Authorization"] == "Bearer " + key
            assert req["body"]["model"] == "judge-model"
            asked = json.dumps(req["body"])
            assert "no_learning" in asked and "2.3" in asked  # the doubt and the last losses

            evs = []
            while time.time() < deadline and not evs:
                evs = [e for e in json.loads(run("queue", "events", "flat", "--json").stdout)["events"]
                       if e["kind"] == "reviewer"]
                time.sleep(0.3)
            assert evs and "CONTINUE" in json.dumps(evs[0])
            st = json.loads(run("queue", "status", "--json").stdout)
            assert st["jobs"][0]["state"] in ("running", "succeeded")  # CONTINUE: not stopped
            run("queue", "cancel", "flat")
            run("agent", "stop", "--yes")
        finally:
            kill_agents_under(state_dir.parent)

    for text in outputs:
        assert key not in text
    leaks = [str(p) for root in (isolated_home, state_dir) for p in root.rglob("*")
             if p.is_file() and p.name != "secrets.json" and key.encode() in p.read_bytes()]
    assert not leaks, leaks
