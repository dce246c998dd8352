"""Interruption detection and recovery for rented hosts, plus the batched instance poller.

Signals: the provider's state (preempted, or stopped/terminated when we did not ask), SSH
unreachable, and a changed boot id on the box (a reboot killed every process). Policy per
profile ``recovery.on_preempt``: ``wait`` for the same box, ``restart`` it, or ``replace`` it
with a new rental and move the queue there. The old box is never destroyed here: its
artifacts are not verified at home, so that stays ``gpurun down``'s call.
"""

from __future__ import annotations

import time
from typing import Callable

from orchestrator.core import rent
from orchestrator.errors import OperationalError, ProviderError, Unsupported
from orchestrator.providers import Instance, Provider

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
MOVABLE = ("queued", "running")   # a running job on a lost box is interrupted: run it again


def read_boot_id(entry: dict) -> str | None:
    """The box's kernel boot id over SSH, or None when it cannot be read."""
    try:
        from orchestrator.core.session import open_session
        with open_session(host=entry) as s:
            res = s.transport.run(BOOT_ID, timeout=15)
        return res.stdout.strip() or None if res.exit_code == 0 else None
    except OperationalError:
        return None


def detect_interruption(entry: dict, *, provider: Provider | None = None,
                        probe: Callable[[str, int], bool] = rent.tcp_probe,
                        boot_reader: Callable[[dict], str | None] = read_boot_id) -> dict:
    """One look at a rented host. Returns the ``interruption`` JSON: host, provider, instance_id,
    provider_state, ssh_reachable, boot_id_changed, interrupted, reason, policy, checked_at."""
    inst = entry.get("instance") or {}
    if provider is None:
        provider, prof = rent.provider_for(entry["profile"])
    else:
        prof = rent._profile(entry["profile"])
    iid = str(inst.get("id"))
    rec = rent.rental(provider.name, iid)
    now = provider.refresh(iid)
    ssh = entry.get("ssh") or {}
    host, port = now.ssh_host or ssh.get("hostname"), now.ssh_port or ssh.get("port")
    reachable = bool(host and port and probe(host, int(port)))
    boot_changed = False
    if now.state == "running" and reachable:
        boot = boot_reader(entry)
        if boot and rec.get("boot_id") and boot != rec["boot_id"]:
            boot_changed = True
        if boot and boot != rec.get("boot_id"):
            rent.note_rental(provider.name, iid, boot_id=boot)
    state = now.state
    by_us = bool(rec.get("stopped_by_us") or rec.get("ended_at"))
    reason = None
    if state == "preempted" and not by_us:
        reason = "preempted"
    elif state in ("stopped", "terminated") and not by_us:
        reason = f"{state} by the provider"
    elif boot_changed:
        reason = "rebooted (boot id changed)"
    elif state == "running" and not reachable:
        reason = None   # the API says fine; a network blip is not an interruption yet
    return {"host": entry["name"], "provider": provider.name, "instance_id": iid,
            "provider_state": state, "ssh_reachable": reachable, "boot_id_changed": boot_changed,
            "interrupted": reason is not None, "reason": reason,
            "policy": str(prof.get("recovery.on_preempt") or "wait"), "checked_at": time.time()}


def _wait_back(provider: Provider, iid: str, probe, timeout: float) -> Instance:
    return provider.wait_state(iid, lambda i: i.ssh_reachable and probe(i.ssh_host, i.ssh_port),
                               timeout=timeout)


def recover(entry: dict, *, policy: str | None = None, provider: Provider | None = None,
            probe: Callable[[str, int], bool] = rent.tcp_probe,
            boot_reader: Callable[[dict], str | None] = read_boot_id, wait_timeout: float = 900.0,
            jobs: list[dict] | None = None, submit: Callable[[dict, list[dict]], dict] | None = None,
            up_kwargs: dict | None = None) -> dict:
    """Detect, then apply the policy. Returns ``{"action", "detection", ...}`` where action is
    ``none | waited | restarted | replaced``. For ``replace``: ``new_host`` and ``moved`` (job
    ids re-submitted). ``jobs`` overrides the job list read from the old host's agent (which is
    usually unreachable after a preemption). Every moved job is re-checked by the agent's
    quality gate before it resumes on the new host (the agent's resume path)."""
    det = detect_interruption(entry, provider=provider, probe=probe, boot_reader=boot_reader)
    if not det["interrupted"]:
        return {"action": "none", "detection": det}
    prov = provider or rent.provider_for(entry["profile"])[0]
    iid = det["instance_id"]
    policy = policy or det["policy"]
    if policy == "restart" and det["provider_state"] == "terminated":
        policy = "replace"   # nothing left to restart
    if policy in ("wait", "restart"):
        if policy == "restart" and det["provider_state"] in ("stopped", "preempted"):
            try:
                prov.start(iid)
            except Unsupported:
                policy = "wait"
        if det["boot_id_changed"]:
            return {"action": "rebooted", "detection": det,
                    "note": "the box rebooted; the agent's boot hook re-queues interrupted jobs"}
        inst = _wait_back(prov, iid, probe, wait_timeout)
        rent.note_rental(prov.name, iid, recovered_at=time.time())
        return {"action": "restarted" if policy == "restart" else "waited", "detection": det,
                "ssh": f"{inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port}"}
    if policy != "replace":
        raise Unsupported(f"unknown recovery policy {policy!r}", hint="use wait, restart or replace")
    return _replace(entry, prov, det, jobs, submit, up_kwargs or {}, probe)


def _replace(entry, prov, det, jobs, submit, up_kwargs, probe) -> dict:
    rec = rent.rental(prov.name, det["instance_id"])
    spec = rec.get("spec") or {}
    inst = entry.get("instance") or {}
    gpu = spec.get("gpu") or f"{inst.get('gpu', '')}:{inst.get('count', 1)}"
    if jobs is None:
        jobs = _jobs_from(entry)
    new = rent.up(entry["profile"], gpu, spot=bool(spec.get("spot")), max_price=spec.get("max_price"),
                  disk_gb=int(spec.get("disk_gb") or 50), image=spec.get("image"),
                  name=_next_name(entry["name"]), ssh_key=(entry.get("ssh") or {}).get("key"),
                  provider=prov, probe=probe, **up_kwargs)
    movable = [j for j in jobs if j.get("state", "queued") in MOVABLE]
    moved: list[str] = []
    if movable:
        from orchestrator import hosts
        new_entry = hosts.get_host(new["host"])
        res = (submit or _submit)(new_entry, [_resubmit(j) for j in movable])
        moved = list(res.get("added", [])) + list(res.get("present", []))
    rent.note_rental(prov.name, det["instance_id"], replaced_by=new["host"], replaced_at=time.time())
    return {"action": "replaced", "detection": det, "new_host": new["host"],
            "new_instance_id": new["instance_id"], "moved": moved,
            "old_instance": f"left {det['provider_state']}; `gpurun down {entry['name']}` once its "
                            "artifacts are pulled (it may still bill)"}


def _next_name(name: str) -> str:
    base, _, n = name.rpartition("-r")
    return f"{base}-r{int(n) + 1}" if base and n.isdigit() else f"{name}-r1"


def _jobs_from(entry: dict) -> list[dict]:
    """The old host's job table, if its agent still answers; else nothing to move."""
    try:
        from orchestrator.core.session import open_session
        with open_session(host=entry) as s:
            return list(s.call("status", {}, timeout=30).get("jobs", []))
    except OperationalError:
        return []


def _resubmit(job: dict) -> dict:
    keep = ("id", "name", "command", "cwd", "env", "gpus", "retries", "timeout_s", "metrics",
            "checkpoints", "source")
    return {k: job.get(k) for k in keep if k in job}


def _submit(entry: dict, jobs: list[dict]) -> dict:
    from orchestrator.core.session import open_session
    with open_session(host=entry) as s:
        return s.call("submit", {"jobs": jobs})


def poll_instances(provider: Provider, ids: list[str]) -> dict[str, Instance]:
    """One batched look at many instances: one list call, not one call per instance (no storms).
    Instances missing from the list read as terminated."""
    try:
        listed = {i.id: i for i in provider.list_instances()}
    except ProviderError:
        return {}
    return {iid: listed.get(iid) or Instance(provider=provider.name, id=iid, state="terminated",
                                             raw_status="unlisted") for iid in ids}
