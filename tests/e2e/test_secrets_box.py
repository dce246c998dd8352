"""Secrets that reach the box safely, through the real CLI, on ``local`` and on a real loopback
SSH box: ``gpurun secret set`` from the environment, ``secret ls`` shows names only, the file
is 0600 in a 0700 dir, a job that asks (``secrets=MY_TOKEN``) sees the value and one that does
not ask does not, a missing secret fails its job naming it, the notifier finds its webhook URL
among the box's secrets, and no value shows up in any output, event, log, notification, the
agent's SQLite, ``agent.log`` or any file under the controller's and the agent's state dirs."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import secrets as pysecrets
import stat
import threading
import time
from pathlib import Path

import pytest

from rigs.agents import gpurun, kill_agents_under

pytestmark = [pytest.mark.slow]


class _Hook(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        n = int(self.headers.get("Content-Length") or 0)
        type(self).bodies.append((self.path, self.rfile.read(n).decode("utf-8", "replace")))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook():
    _Hook.bodies = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, _Hook.bodies
    srv.shutdown()


QUEUE = """\
[name=asks secrets=MY_TOKEN gpus=0] python3 -c "import os,hashlib; v=os.environ['MY_TOKEN']; open('asks.sha','w').write(hashlib.sha256(v.encode()).hexdigest()); print('the key is', v)"
[name=doesnt gpus=0] python3 -c "import os; open('doesnt.txt','w').write(repr(os.environ.get('MY_TOKEN')))"
[name=missing secrets=NOT_SET_HERE gpus=0] true
"""


def _scenario(host: str, state_dir: Path, work: Path, home: Path, webhook, tmp_path: Path) -> None:
    from orchestrator import hosts

    value = "tok-" + pysecrets.token_hex(16)
    srv, bodies = webhook
    hook = "http://127.0.0.1:%d/hook/%s" % (srv.server_address[1], pysecrets.token_hex(8))
    hosts.update_host(host, notify=[{"kind": "generic", "url_env": "MY_HOOK", "min_severity": "error"}])
    outputs: list[str] = []

    def run(*args: str, env: dict | None = None, ok: bool = True):
        res = gpurun(*args, "--host", host, env=env, cwd=str(work))
        outputs.extend([res.stdout, res.stderr])
        if ok:
            assert res.returncode == 0, (args, res.stdout, res.stderr)
        return res

    # set from the environment; the CLI's arguments never hold the value
    run("secret", "set", "MY_TOKEN", env=dict(os.environ, MY_TOKEN=value))
    run("secret", "set", "MY_HOOK", env=dict(os.environ, MY_HOOK=hook))
    no_value = run("secret", "set", "NOT_SET_HERE", ok=False)  # no env, no terminal: refused
    assert no_value.returncode == 2 and "no value for secret NOT_SET_HERE" in no_value.stderr
    bad = run("secret", "set", "9-lives", ok=False)
    assert bad.returncode == 2 and "bad secret name" in bad.stderr and "hint:" in bad.stderr

    ls = json.loads(run("secret", "ls", "--json").stdout)
    assert ls["host"] == host and [s["name"] for s in ls["secrets"]] == ["MY_HOOK", "MY_TOKEN"]
    assert all(set(s) == {"name", "set_at"} for s in ls["secrets"])
    assert "MY_TOKEN" in run("secret", "ls").stdout

    f = state_dir / "secrets.json"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700

    q = tmp_path / "q.txt"
    q.write_text(QUEUE)
    # the daemon starts here, from an environment that holds MY_TOKEN: a job that did not ask
    # must still not inherit it
    run("queue", "submit", str(q), "--wait", env=dict(os.environ, MY_TOKEN=value), ok=False)

    st = json.loads(run("queue", "status", "--json").stdout)
    jobs = {j["name"]: j for j in st["jobs"]}
    assert jobs["asks"]["state"] == "succeeded" and jobs["doesnt"]["state"] == "succeeded", jobs
    assert jobs["asks"]["secrets"] == ["MY_TOKEN"] and jobs["doesnt"]["secrets"] == []
    assert (work / "asks.sha").read_text() == hashlib.sha256(value.encode()).hexdigest()
    assert (work / "doesnt.txt").read_text() == "None"
    miss = jobs["missing"]
    assert miss["state"] == "failed" and miss["attempt"] == 0
    assert "NOT_SET_HERE" in miss["reason"] and f"gpurun secret set NOT_SET_HERE --host {host}" in miss["reason"]

    logs = run("queue", "logs", "asks").stdout
    assert "the key is ***" in logs
    run("queue", "events", "--json")
    run("queue", "events", "missing")
    run("queue", "status")
    run("agent", "status", "--json")

    deadline = time.time() + 30  # the failed job's event reaches the webhook named by a secret
    while not any("missing" in b or "NOT_SET_HERE" in b for _, b in bodies) and time.time() < deadline:
        time.sleep(0.3)
    assert bodies, "no notification arrived at the webhook whose URL is a secret"
    assert all(value not in b and hook not in b for _, b in bodies)

    run("secret", "rm", "MY_HOOK")
    gone = run("secret", "rm", "MY_HOOK", ok=False)
    assert gone.returncode == 2 and "no secret MY_HOOK" in gone.stderr
    run("agent", "stop", "--yes")

    # nothing gpurun printed, and no file it keeps, holds a value
    for text in outputs:
        assert value not in text and hook not in text
    roots = [home, state_dir]
    leaks = []
    for root in roots:
        for p in root.rglob("*"):
            if not p.is_file() or p == f:
                continue
            if p.name == "log.txt" and p.parent.parent.name == "runs":
                continue  # the job's own output, as the job wrote it (served masked: see logs above)
            data = p.read_bytes()
            if value.encode() in data or hook.encode() in data:
                leaks.append(str(p))
    assert not leaks, leaks
    assert (state_dir / "gpurun.db").exists() and (state_dir / "agent.log").exists()



def test_secrets_on_local(home, webhook, tmp_path):
    from orchestrator import paths

    work = tmp_path / "work"
    work.mkdir()
    _scenario("local", paths.local_state_dir("local"), work, home, webhook, tmp_path)


@pytest.mark.ssh
def test_secrets_on_an_ssh_box(ssh_host, sshd, webhook, tmp_path, isolated_home):
    from orchestrator.transport.ssh import SSHTransport

    with SSHTransport(ssh_host) as t:
        t.run(f"mkdir -p {ssh_host['workdir']} {ssh_host['state_dir']}")
    try:
        _scenario(ssh_host["name"], Path(ssh_host["state_dir"]), Path(ssh_host["workdir"]), isolated_home,
                  webhook, tmp_path)
    finally:
        kill_agents_under(Path(ssh_host["state_dir"]).parent)
