"""Moving a lost box's queue to its replacement: which jobs, where their paths land, and the
pulled artifacts that go with them (latest verified checkpoint, metrics, run-dir files).

Nothing here asks the old box: jobs come from the caller (live agent or controller snapshot),
artifacts from ``gpurun pull``'s destination, the code from the last ``gpurun push`` record.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import Any

from orchestrator.agent import states as S
from orchestrator.agent.manifest import sha256_file
from orchestrator.agent.states import TERMINAL
from orchestrator.core.snapshot import SPEC_KEYS
from orchestrator.errors import VerificationError
from orchestrator.sync.keep import unit_step
from orchestrator.sync.state import RECORD, JobRecord, find_job_root

MOVABLE = (S.QUEUED, S.RUNNING)   # a running job on a lost box is interrupted: run it again
# agent bookkeeping in a run dir: the new box writes its own
RUN_CONTROL = re.compile(r"^(log\.txt|exit\.\d+|started\.\d+|quality/.*)$")


def rebase(path: str | None, pairs: list[tuple[str, str]]) -> str | None:
    """``path`` with an old root prefix (workdir, state dir) swapped for the new box's."""
    if not path:
        return path
    for old, new in pairs:
        old = (old or "").rstrip("/")
        if old and new and (path == old or path.startswith(old + "/")):
            return new.rstrip("/") + path[len(old):]
    return path


def root_pairs(old: dict, new: dict) -> list[tuple[str, str]]:
    return [(old.get("workdir") or "", new.get("workdir") or ""),
            (old.get("state_dir") or "", new.get("state_dir") or "")]


def _verified(rec: JobRecord, rel: str) -> Path | None:
    """The local copy of ``rel`` if its bytes are the ones verified at pull time."""
    r = rec.files.get(rel) or {}
    if r.get("state") != "verified":
        return None
    final = rec.root / rel
    try:
        st = final.stat()
    except OSError:
        return None
    return final if st.st_size == r.get("size") and st.st_mtime_ns == r.get("mtime_ns") else None


def _job_roots(dest: Path, job_id: str) -> list[Path]:
    """Every pulled copy of a job (one per host it ran on; a job moved twice was pulled from
    each box) under ``dest`` and under every destination a pull recorded (``core.pull``), so
    a ``recover`` run from another directory still finds them. Folders are found by
    ``sync.state.find_job_root``: named ``<name>-<short id>`` or, from older pulls, by id."""
    from orchestrator.core.pull import known_dests

    out: list[Path] = []
    for base in [dest] + [d for d in known_dests() if d != dest]:
        if not base.is_dir():
            continue
        for d in sorted(base.iterdir()):
            root = find_job_root(d, job_id) if d.is_dir() else None
            if root is not None and (root / RECORD).is_file() and root not in out:
                out.append(root)
    return out


def latest_checkpoint(dest: Path, job_id: str) -> dict | None:
    """The newest checkpoint unit of a job whose every recorded file is verified at home:
    ``{"root", "unit", "step", "files": [(local Path, rel)]}``, or None."""
    best: tuple | None = None
    for root in _job_roots(dest, job_id):
        rec = JobRecord(root)
        units: dict[str, list[str]] = {}
        for rel in rec.files:
            parts = rel.split("/")
            if parts[0] == "checkpoints" and len(parts) >= 2:
                units.setdefault(parts[1], []).append(rel)
        for unit, rels in units.items():
            local = [(_verified(rec, r), r) for r in rels]
            if not local or any(p is None for p, _ in local):
                continue   # superseded, corrupt or half-pulled: never resume from it
            step = unit_step(unit)
            newest = max(p.stat().st_mtime for p, _ in local)
            key = (step is not None, step if step is not None else -1, newest)
            if best is None or key > best[0]:
                best = (key, {"root": root, "unit": unit, "step": step, "files": local})
    return best[1] if best else None


def pulled_state(dest: Path, job_id: str) -> str | None:
    """The job state the last pull saw (a job that finished before the box was lost is not
    moved even if the controller's snapshot is older)."""
    states = [JobRecord(r).data.get("job", {}).get("state") for r in _job_roots(dest, job_id)]
    return next((s for s in states if s in TERMINAL), None)


def restore_plan(job: dict, dest: Path, new_run_dir: str, pairs: list[tuple[str, str]]) -> dict:
    """What to upload for ``job`` before it is resubmitted: ``{"files": [(local, remote)],
    "resume_from": remote path or None, "step": int or None}``. Checkpoints go to the job's
    declared ``checkpoints`` path, metrics to its ``metrics`` path (the resume gate reads them),
    other run-dir files to the new run dir (jobs that checkpoint into ``$GPURUN_RUN_DIR``)."""
    files: list[tuple[Path, str]] = []
    resume_from, step = None, None
    ck = latest_checkpoint(dest, job["id"])
    ck_root = rebase(job.get("checkpoints"), pairs)
    if ck is not None and ck_root:
        only_file = len(ck["files"]) == 1 and ck["files"][0][1] == f"checkpoints/{posixpath.basename(ck_root)}"
        for local, rel in ck["files"]:
            files.append((local, ck_root if only_file else posixpath.join(ck_root, rel.split("/", 1)[1])))
        resume_from = ck_root if only_file else posixpath.join(ck_root, ck["unit"])
        step = ck["step"]
    roots = _job_roots(dest, job["id"])
    if roots:
        rec = JobRecord(roots[-1] if ck is None else ck["root"])
        metrics = rebase(job.get("metrics"), pairs)
        mrels = [r for r in rec.files if r.startswith("metrics/")]
        for rel in mrels:
            local = _verified(rec, rel)
            if local is None or not metrics:
                continue
            sub = rel.split("/", 1)[1]
            single = len(mrels) == 1 and sub == posixpath.basename(metrics)
            files.append((local, metrics if single else posixpath.join(metrics, sub)))
        for rel in rec.files:
            sub = rel.split("/", 1)[1] if rel.startswith("run/") else None
            local = _verified(rec, rel) if sub and not RUN_CONTROL.match(sub) else None
            if local is not None:
                files.append((local, posixpath.join(new_run_dir, sub)))
    return {"files": files, "resume_from": resume_from, "step": step}


def upload(session: Any, files: list[tuple[Path, str]]) -> int:
    """Put every file on the box, then check all their SHA-256 there in one round trip.
    Returns the bytes sent; ``VerificationError`` when a copy differs (nothing is submitted)."""
    if not files:
        return 0
    from orchestrator.transport.base import rpath as rq
    sent = 0
    for local, remote in files:
        session.transport.put(str(local), remote)
        sent += local.stat().st_size
    res = session.transport.run("sha256sum -- " + " ".join(rq(r) for _, r in files), timeout=3600)
    got = [ln.split()[0] for ln in res.stdout.splitlines() if re.match(r"^[0-9a-f]{64}\s", ln)]
    want = [sha256_file(str(p)) for p, _ in files]
    if res.exit_code != 0 or got != want:
        raise VerificationError(f"{session.host['name']}: restored files do not match the verified copies "
                                "at home", hint="re-run `gpurun recover`; it resumes the move to the same box")
    return sent


def repush_code(old_name: str, session: Any, pairs: list[tuple[str, str]]) -> dict | None:
    """Send the project last pushed to the lost box to its replacement (same place, rebased).
    None when nothing was pushed or the local tree is gone."""
    from orchestrator.core import push as code
    rec = code.last_local_record(old_name)
    if not rec or not rec.get("local_dir") or not os.path.isdir(rec["local_dir"]):
        return None
    target = rebase(rec.get("remote_dir"), pairs) or None
    out = code.push(session, rec["local_dir"], target)
    out["changed_since_last_push"] = out["code_hash"] != rec.get("hash")
    return out


def resubmission(job: dict, pairs: list[tuple[str, str]], old_host: str, plan: dict) -> dict:
    """The submit row for a moved job: same id and spec, paths rebased, ``attempt`` kept (so
    the new agent treats its start as a resume and runs the quality gate first)."""
    row: dict[str, Any] = {k: job.get(k) for k in SPEC_KEYS if k in job}
    for key in ("cwd", "metrics", "checkpoints"):
        row[key] = rebase(row.get(key), pairs)
    env = dict(row.get("env") or {})
    env["GPURUN_MOVED_FROM"] = old_host
    if plan.get("resume_from"):
        env["GPURUN_RESUME_FROM"] = plan["resume_from"]
    row["env"] = env
    # pulled artifacts prove it ran, even if the snapshot last saw it queued: a resume
    row["attempt"] = max(int(job.get("attempt") or 0), 1 if plan.get("files") else 0)
    row["source"] = f"moved from {old_host}" + (f" ({job['source']})" if job.get("source") else "")
    return row
