"""`gpurun push` and the code hash: hashing rules, .gpurunignore, the CLI over real SSH,
and one-line errors for unreachable hosts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator import hosts as hostinv
from orchestrator.core import push as core
from orchestrator.core.session import open_session
from rigs.agents import gpurun


def tree(root: Path) -> Path:
    for rel, body in {"train.py": "print('hi')\n", "lib/util.py": "U = 1\n",
                      "lib/__pycache__/util.cpython-311.pyc": "x", ".git/config": "c",
                      "runs/out.log": "log", "notes.tmp": "t"}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    (root / ".gpurunignore").write_text("# local outputs\nruns/\n*.tmp\n")
    return root


def test_tree_hash_is_stable_and_follows_ignores(tmp_path):
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    ha, hb = core.local_tree_hash(a), core.local_tree_hash(b)
    assert ha == hb and ha["files"] == 3  # train.py, lib/util.py, .gpurunignore
    (b / "runs" / "new.log").write_text("ignored")
    (b / "lib" / "__pycache__" / "z.pyc").write_text("ignored")
    assert core.local_tree_hash(b)["hash"] == ha["hash"]
    (b / "lib" / "util.py").write_text("U = 2\n")
    assert core.local_tree_hash(b)["hash"] != ha["hash"]


def test_negated_ignore_pattern_is_bad_input(tmp_path):
    root = tree(tmp_path / "p")
    (root / ".gpurunignore").write_text("runs/\n!runs/keep\n")
    res = gpurun("push", str(root), "--dry-run")
    assert res.returncode == 2
    assert f"{root / '.gpurunignore'}:2" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.ssh
@pytest.mark.parametrize("fixture", ["ssh_host", "noisy_ssh_host"])
def test_push_cli_records_hash_on_box_and_here(request, tmp_path, fixture):
    host = request.getfixturevalue(fixture)
    root = tree(tmp_path / "proj")
    res = gpurun("push", "--host", host["name"], str(root), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out) == {"host", "local_dir", "remote_dir", "method", "files", "bytes",
                        "code_hash", "fallback_reason", "dry_run"}
    work = Path(host["workdir"])
    assert out["remote_dir"] == str(work) and out["method"] in ("rsync", "tar")
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()) == \
        [".gpurunignore", "lib/util.py", "train.py"]
    here = core.local_tree_hash(root)
    assert out["code_hash"] == here["hash"]
    assert core.last_local_record(host["name"])["hash"] == here["hash"]
    with open_session(host["name"]) as s:
        assert core.remote_code_hash(s) == here["hash"]
        assert core.code_differs_warning(s.host, core.remote_code_info(s)) is None
        (root / "train.py").write_text("print('changed')\n")
        assert "differs" in core.code_differs_warning(s.host, core.remote_code_info(s))
    record = json.loads((Path(host["state_dir"]) / "code_hash").read_text())
    assert record["hash"] == here["hash"] and record["local_dir"] == str(root)


@pytest.mark.ssh
def test_push_to_wrong_port_is_one_line_error(ssh_host, tmp_path):
    from rigs.sshd import free_port

    hostinv.update_host(ssh_host["name"], ssh={**ssh_host["ssh"], "port": free_port()})
    t0 = time.monotonic()
    res = gpurun("push", "--host", ssh_host["name"], str(tree(tmp_path / "p")), timeout=30)
    assert res.returncode == 1
    assert time.monotonic() - t0 < 12
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("gpurun: error: cannot reach box") and "refused" in lines[0]
    assert lines[1].startswith("  hint:") and len(lines) == 2


@pytest.mark.ssh
def test_dead_host_cli_error_within_connect_timeout(ssh_host, sshd, tmp_path):
    sshd.freeze()
    try:
        t0 = time.monotonic()
        res = gpurun("push", "--host", ssh_host["name"], str(tree(tmp_path / "p")), timeout=60)
        took = time.monotonic() - t0
    finally:
        sshd.thaw()
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "timed out" in res.stderr or "banner" in res.stderr
    assert took < 10 + 3  # default connect timeout 10 s, plus CLI start-up
