"""The teardown gate's judgement when the box cannot be reached: from what is known at home,
the controller's job snapshot (``core.snapshot``), each job's ``PULL_VERIFIED.json`` with its
files re-hashed now, and the provider's word on the instance.

A box whose SSH host key changed is judged the same way: it may be someone else's machine
(a man in the middle) or the same box re-provisioned, and either way nothing it says can be
trusted, so gpurun does not talk to it. The offline gate (always a typed confirmation) lets the
user stop the meter through the provider API anyway, instead of failing with no way forward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from orchestrator.agent.states import QUEUED, TERMINAL
from orchestrator.core import snapshot
from orchestrator.core.teardown import Assessment, Target, assess, file_home, when
from orchestrator.errors import GpurunError, HostKeyError, TransportError, VerificationError
from orchestrator.sync.state import VERIFIED, JobRecord, job_dir_name, job_root

# provider states in which nothing on the box can still be running
DOWN_STATES = ("preempted", "stopped", "terminated")


# how the offline judgement of a box with a changed host key starts its ``unreachable``
HOST_KEY_CHANGED = "host key changed (possible man-in-the-middle, or a re-provisioned box)"

__all__ = ["DOWN_STATES", "HOST_KEY_CHANGED", "assess_gate", "assess_offline", "host_key_changed",
           "provider_state", "when"]


def assess_gate(session: Any, t: Target) -> Assessment:
    """The live gate; when the agent cannot be reached, or its host key changed (then nothing
    it would say can be trusted, so it is not asked), the offline one."""
    try:
        return assess(session, t.dest, t.policy)
    except HostKeyError as exc:
        state, note = provider_state(t.entry)
        why = HOST_KEY_CHANGED if "CHANGED" in str(exc) else "host key not recorded (the box cannot be verified)"
        a = assess_offline(t.entry, t.dest, f"{why}: {exc}", state, note)
        if exc.hint:
            a.notes.append(exc.hint)
        return a
    except TransportError as exc:   # ConnectError included: no manifest could be read
        state, note = provider_state(t.entry)
        return assess_offline(t.entry, t.dest, str(exc), state, note)


def host_key_changed(a: Assessment) -> bool:
    """Whether ``a`` is the offline judgement of a box whose host key changed."""
    return a.offline and (a.unreachable or "").startswith(HOST_KEY_CHANGED)


def provider_state(entry: dict) -> tuple[Optional[str], Optional[str]]:
    """``(state, note)``: the provider's current state of a rented host's instance, or None
    with the reason when there is no API for it or the API did not answer."""
    inst = entry.get("instance") or {}
    if not inst.get("id"):
        return None, "not rented through a provider API: nobody can say whether the box is down"
    try:
        from orchestrator.core import rent
        prov, _ = rent.provider_for(entry["profile"])
        return prov.refresh(str(inst["id"])).state, None
    except GpurunError as exc:
        return None, f"the provider could not be asked ({exc})"


def _marker(root: Path, host: str, job_id: str) -> Optional[dict]:
    """The job's verified-pull marker, or None when absent, torn, or for another job/host."""
    try:
        mk = json.loads((root / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(mk, dict) or not isinstance(mk.get("files"), list):
        return None
    job = mk.get("job") or {}
    if job.get("id") != job_id or mk.get("host") not in (None, host):
        return None
    return mk


def assess_offline(entry: dict, dest: Path, unreachable: str,
                   state: Optional[str] = None, state_note: Optional[str] = None) -> Assessment:
    """Judge a box that cannot be reached from home records only.

    Every job in the snapshot must be terminal there (or in its marker, which may be newer:
    a pull does not refresh the snapshot), or the provider must say the box is down (then an
    unfinished job counts as interrupted). Every job needs a verified pull whose files are all
    still at home with the recorded size and SHA-256 (re-hashed now), or verified in S3; a job
    that finished needs a pull made after it finished (a ``complete`` marker)."""
    host = entry["name"]
    snap = snapshot.load(host)
    out = Assessment(host=host, dest=str(dest), basis="offline", unreachable=unreachable,
                     provider_state=state, snapshot_at=snap.get("updated_at"))
    if state_note:
        out.notes.append(state_note)
    if snap.get("updated_at") is None:
        out.missing.append(f"the job list of {host} (no record of its jobs at home: it was never "
                           "submitted to or queried from this machine)")
        return out
    box_down = state in DOWN_STATES
    pulls: list[float] = []
    for job in snapshot.jobs(host, snap):
        jid = str(job["id"])
        root = job_root(dest / job_dir_name(host), jid, job.get("name"))
        label = f"{job.get('name') or jid} ({jid})"
        mk = _marker(root, host, jid)
        if mk is None and job.get("moved_to"):
            # a job moved off this box (a fleet's lost member, `recover`) ran on and was pulled
            # from its new host: that verified pull is its home copy
            moved_root = job_root(dest / job_dir_name(str(job["moved_to"])), jid, job.get("name"))
            mk = _marker(moved_root, str(job["moved_to"]), jid)
            root = moved_root if mk is not None else root
        mk_job = (mk or {}).get("job") or {}
        terminal = job.get("state") in TERMINAL or bool(mk_job.get("terminal"))
        shown = mk_job.get("state") if mk_job.get("terminal") else job.get("state")
        row: dict[str, Any] = {"id": jid, "name": job.get("name"), "state": shown, "dir": str(root),
                               "files": len((mk or {}).get("files") or []), "missing": 0,
                               "verdict": "verified", "pulled_at": (mk or {}).get("verified_at"),
                               "moved_to": job.get("moved_to")}
        out.jobs.append(row)
        if not terminal:
            if box_down or job.get("moved_to"):
                row["state"] = f"{shown} (interrupted)"
            else:
                out.blockers.append(f"job {label} was {shown} when last seen ({when(snap['updated_at'])}) "
                                    f"and the provider says {state or 'nothing'}")
                row["verdict"] = "active"
        if mk is None:
            never = job.get("state") == QUEUED and not job.get("started_at")
            out.missing.append(f"{jid}: no verified pull at home" +
                               (" (it had not started when last seen)" if never else ""))
            row["missing"] += 1
        else:
            pulls.append(float(mk.get("verified_at") or 0))
            _check_marker(out, row, JobRecord(root), mk, jid, terminal)
        if row["missing"] and row["verdict"] != "active":
            row["verdict"] = "missing"
    out.last_pull_at = min(pulls) if pulls else None
    return out


def _check_marker(out: Assessment, row: dict, rec: JobRecord, mk: dict, jid: str, terminal: bool) -> None:
    """Re-check one job's marker against the bytes at home (the same check as the live gate)."""
    if terminal and not mk.get("complete"):
        out.missing.append(f"{jid}: last verified pull ({when(mk.get('verified_at'))}) was made before "
                           "the job finished; its final files were never verified at home")
        row["missing"] += 1
    for f in mk["files"]:
        try:
            where = file_home(rec, f)
        except (VerificationError, KeyError, TypeError, ValueError):
            where = None  # a marker we cannot read vouches for nothing
        if where is None:
            out.missing.append(f"{jid}/{f.get('path')} (changed or gone since the pull)")
            row["missing"] += 1
        else:
            out.files += 1
            out.bytes += int(f["size"])
    if mk.get("pending") and not terminal:
        out.notes.append(f"{jid}: {len(mk['pending'])} file(s) were still being written at the last pull "
                         "and are not at home")
    out.superseded += [f"{jid}/{s['path']}" for s in mk.get("superseded") or [] if "path" in s]
