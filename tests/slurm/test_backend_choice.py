"""The backend contract (``agent/backend``): the host config picks the backend at every verb,
on a real agent (no Slurm needed: a PATH without Slurm's commands shows where one was asked),
and no agent module but the backend tests which scheduler a host has."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tests.rigs.boxagent import BoxAgent

AGENT = Path(__file__).resolve().parents[2] / "orchestrator" / "agent"


def test_the_host_config_picks_the_backend_at_every_verb(tmp_path: Path, monkeypatch) -> None:
    path = os.environ["PATH"]
    (tmp_path / "nobin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # sbatch is "not installed" on this login node
    box = BoxAgent(tmp_path / "state", {"scheduler": "slurm"})
    try:
        rep = box.verb("submit", {"jobs": [{"id": box.id("a"), "name": "a", "command": "echo ran", "gpus": 0}]})
        # the ensure before it started no daemon; the submit asked sbatch, in its own words
        assert not rep["ok"] and rep["error"]["kind"] == "scheduler", rep
        assert "sbatch: command not found" in rep["error"]["message"], rep
        assert box.daemon_pid() is None
        # status syncs first: sbatch is asked again, and its refusal is the job's reason
        (job,) = box.jobs().values()
        assert (job["state"], job["backend_id"]) == ("queued", None)
        assert "sbatch: command not found" in (job["reason"] or ""), job
        # the same state dir as a plain host: its ensure starts the daemon, whose runner runs the row
        monkeypatch.setenv("PATH", path)
        box.config = {}
        assert box.ok("status", {})["daemon"]["build"] is not None
        done = box.wait(["a"])["a"]
        assert (done["state"], done["backend_id"]) == ("succeeded", None), done
    finally:
        box.stop_all()


def test_only_the_backend_asks_which_scheduler_a_host_has() -> None:
    """Each Slurm-or-not decision is a backend hook: no other agent module reads the config's
    ``scheduler``, and only the backend and the Slurm modules import the Slurm modules."""
    offenders = []
    for path in sorted(AGENT.glob("*.py")):
        if path.stem == "backend":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            key = (node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "get" and node.args else node.slice if isinstance(node, ast.Subscript)
                   else None)
            if isinstance(key, ast.Constant) and key.value == "scheduler":  # config.get("scheduler") ...
                offenders.append("%s:%d reads 'scheduler'" % (path.name, node.lineno))
            if path.stem.startswith("slurm") or not isinstance(node, ast.ImportFrom):
                continue
            names = {a.name for a in node.names} if node.module == "orchestrator.agent" else {
                (node.module or "").rsplit(".", 1)[-1]}
            if names & {"slurm", "slurm_reconcile"}:
                offenders.append("%s:%d imports %s" % (path.name, node.lineno, sorted(names)))
    assert offenders == []

