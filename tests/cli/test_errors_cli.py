"""Bad input through the real CLI: one line naming the file/line/key, a hint, exit 2, no
traceback, and nothing submitted."""

from __future__ import annotations

import json

import pytest

from rigs.agents import gpurun


def _one_error(res) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("gpurun: error: ")
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].strip().startswith("hint:"))
    return res.stderr


@pytest.mark.parametrize("text,needle", [
    ("echo ok\n[name=x gpus=two] python t.py\n", "q.txt:2: option gpus='two'"),
    ("echo ok\n[name=x python t.py\n", "q.txt:2: option block"),
    ("[nmae=x] echo\n", "did you mean 'name'"),
])
def test_broken_queue_line_submits_nothing(home, tmp_path, text, needle):
    q = tmp_path / "q.txt"
    q.write_text(text)
    res = gpurun("queue", "submit", str(q))
    assert res.returncode == 2
    assert needle in _one_error(res)
    st = gpurun("queue", "status", "--json")
    assert json.loads(st.stdout)["jobs"] == []


def test_missing_file_unknown_host_unknown_profile(home, tmp_path):
    res = gpurun("queue", "submit", str(tmp_path / "nope.txt"))
    assert res.returncode == 2 and "no such queue file" in _one_error(res)
    q = tmp_path / "q.txt"
    q.write_text("echo hi\n")
    res = gpurun("queue", "submit", str(q), "--host", "gpu-box-7")
    assert res.returncode == 2 and "unknown host 'gpu-box-7'" in _one_error(res)
    assert "gpurun host add" in res.stderr
    res = gpurun("host", "add", "b1", "--profile", "runpd", "--ssh", "root@127.0.0.1:2222")
    assert res.returncode == 2 and "runpd" in _one_error(res) and "runpod" in res.stderr
    res = gpurun("host", "add", "b1", "--ssh", "root@127.0.0.1:99999")
    assert res.returncode == 2 and "out of range" in _one_error(res)
    res = gpurun("queue", "logs", "nope")
    assert res.returncode == 2 and "no job 'nope'" in _one_error(res)
    res = gpurun("queue", "cancel")
    assert res.returncode == 2 and "--all" in _one_error(res)


def test_from_skips_jobs_not_lines(home, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("# header\n[name=a] true\n\n[name=b] true\n# c\n[name=c] true\n[name=d] true\n")
    res = gpurun("queue", "submit", str(q), "--from", "3", "--wait", "--json")
    assert res.returncode == 0, res.stderr
    assert [j["name"] for j in json.loads(res.stdout)["jobs"]] == ["c", "d"]


def test_cancel_all_asks_before_stopping_running_jobs(home, tmp_path):
    import time
    q = tmp_path / "q.txt"
    q.write_text("[name=long] sleep 60\n[name=later] true\n")
    assert gpurun("queue", "submit", str(q)).returncode == 0
    deadline = time.time() + 20
    while time.time() < deadline:
        jobs = {j["name"]: j for j in json.loads(gpurun("queue", "status", "--json").stdout)["jobs"]}
        if jobs["long"]["state"] == "running":
            break
        time.sleep(0.2)
    res = gpurun("queue", "cancel", "--all")        # no terminal here: refuse, change nothing
    assert res.returncode == 2 and "--yes" in _one_error(res) and "long" in res.stderr
    jobs = {j["name"]: j for j in json.loads(gpurun("queue", "status", "--json").stdout)["jobs"]}
    assert jobs["long"]["state"] == "running" and jobs["later"]["state"] == "queued"
    res = gpurun("queue", "cancel", "--all", "--yes")
    assert res.returncode == 0 and "long: stopping" in res.stdout and "later: cancelled" in res.stdout
