"""Use case ``pull``: ask the host's agent for its manifest, bring every job's files home
verified, optionally push them to S3, and with ``loop`` keep going until the queue is done.

Defaults come from ``config.yaml`` (``pull: {dest, keep_latest, best: {metric, mode},
interval_s}`` and ``s3: {...}``); flags win. The default destination is
``paths.artifacts_home()`` (under gpurun's data dir), never the current directory. Where each
host's pull went is recorded (``data_home()/hosts/<name>/pull.json``) so ``down`` and
``recover`` check that tree from any directory (:func:`artifacts_dest`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator import paths
from orchestrator.errors import ConfigError, GpurunError, TransportError
from orchestrator.sync.engine import JobPull, ProgressSink, pull_job
from orchestrator.sync.keep import KeepPolicy
from orchestrator.sync.marker import clean_staging
from orchestrator.sync.state import (VERIFIED, JobRecord, job_dir_name, job_root, show_path,
                                     write_json_atomic)
from orchestrator.sync.sshmux import MuxRsyncFetcher
from orchestrator.sync.transfer import LocalFetcher, SftpFetcher, ssh_argv_for

PULL_KEYS = ("dest", "keep_latest", "best", "interval_s", "method", "settle_s", "reverify", "bwlimit_kbps", "streams")
REVERIFY_DEFAULT = 10  # each pull re-reads the 1/10 of local copies checked longest ago


def user_config() -> tuple[dict, str]:
    """(parsed ``config.yaml``, its path); ``{}`` when absent. ConfigError (file:line:key) on
    anything wrong in it: ``userconfig`` reads and checks the whole file, once."""
    from orchestrator.userconfig import read_config

    return read_config()


def pull_config() -> tuple[dict, Optional[dict]]:
    """The validated ``pull`` section and the ``s3`` section (None when not configured). The
    types and ranges were checked by ``userconfig`` (file:line:key); the keys are checked here."""
    data, src = user_config()
    pull = data.get("pull") or {}
    bad = sorted(set(pull) - set(PULL_KEYS))
    if bad:
        raise ConfigError(f"{src}: unknown key 'pull.{bad[0]}'", "allowed: " + ", ".join(PULL_KEYS))
    s3 = data.get("s3")
    if s3 is not None:
        from orchestrator.sync.s3 import validate_config

        s3 = validate_config(s3, src)
    return pull, s3


def _dest_record(host: str) -> Path:
    return paths.data_home() / "hosts" / job_dir_name(host) / "pull.json"


def recorded_dests(host: str) -> list[str]:
    """Every destination a pull of ``host`` used, the latest first (empty when never pulled)."""
    try:
        data = json.loads(_dest_record(host).read_text(encoding="utf-8"))
        return [str(d) for d in data.get("dests") or [] if isinstance(d, str)]
    except (OSError, ValueError, AttributeError):
        return []


def record_dest(host: str, dest: Path) -> None:
    """Note where this pull of ``host`` went. Never raises: losing the note costs only a
    ``--dest`` on ``down``, never a file."""
    try:
        dests = [str(dest)] + [d for d in recorded_dests(host) if d != str(dest)]
        write_json_atomic(_dest_record(host), {"host": host, "dest": str(dest), "dests": dests[:20],
                                               "at": time.time()})
    except OSError:
        pass


def default_dest(dest: Optional[str] = None, cfg: Optional[dict] = None) -> Path:
    """Where a pull goes: ``dest``, else ``pull.dest``, else ``paths.artifacts_home()``."""
    if dest is None and cfg is None:
        cfg = pull_config()[0]
    chosen = dest or (cfg or {}).get("dest")
    return Path(chosen).expanduser().resolve() if chosen else paths.artifacts_home()


def artifacts_dest(host: str, dest: Optional[str] = None) -> Path:
    """Where ``host``'s artifacts are at home, from any current directory: ``dest`` when
    given, else where the last pull of this host put them, else where a pull would."""
    if dest:
        return Path(dest).expanduser().resolve()
    known = recorded_dests(host)
    return Path(known[0]) if known else default_dest()


def known_dests() -> list[Path]:
    """Every destination any host's pulls used, plus the default ones (for ``recover``,
    which looks for a job's checkpoints wherever it was pulled)."""
    out: list[Path] = []
    hosts_dir = paths.data_home() / "hosts"
    names = sorted(os.listdir(hosts_dir)) if hosts_dir.is_dir() else []
    try:
        cands = [Path(d) for n in names for d in recorded_dests(n)] + [default_dest()]
    except ConfigError:
        cands = [Path(d) for n in names for d in recorded_dests(n)] + [paths.artifacts_home()]
    for c in cands:
        if c not in out:
            out.append(c)
    return out


def choose_fetcher(session: Any, method: str = "auto", bwlimit_kbps: int = 0, streams: int = 1) -> Any:
    """rsync when both ends have it, else SFTP; a local host is copied directly. ``streams``: the
    parallel ssh streams one large file comes over (``pull.streams``; 1 is fastest where both ends
    share few CPUs, more may fill a long fat link)."""
    host = session.host
    if host.get("kind", "local") == "local":
        return LocalFetcher()
    if method in ("auto", "rsync") and shutil.which("rsync"):
        res = session.transport.run("command -v rsync", timeout=30)
        if res.exit_code == 0 and res.stdout.strip():
            from orchestrator.transport.hostkeys import default_known_hosts

            argv, target = ssh_argv_for(host, str(default_known_hosts()))
            # its rsyncs share one SSH connection (sync/sshmux): a login per job cost ~0.4 s
            return MuxRsyncFetcher(argv, target, bwlimit_kbps=bwlimit_kbps, streams=streams)
        if method == "rsync":
            raise TransportError(f"rsync is not installed on {host['name']}",
                                 "install it there, or drop `pull.method: rsync` to use SFTP")
    return SftpFetcher(_sftp_session(session.transport))


def _sftp_session(transport: Any) -> Callable[[], Any]:
    # the transport's own SFTP door (its lock held while a file comes): never its bare
    # SFTPClient, which a push on the same connection would be reading from too
    if callable(getattr(transport, "sftp_session", None)):
        return transport.sftp_session
    raise TransportError(f"transport {getattr(transport, 'name', '?')} offers no SFTP client",
                         "install rsync on both ends")


def _manifest(session: Any, jobs: Optional[list[str]], settle_s: float) -> dict:
    # hashing a new multi-GB checkpoint on the box can take a while: generous timeout
    return session.manifest(jobs, settle_s)


def _mark_pulled(session: Any, job: dict, rec: Any) -> None:
    """Tell the agent which files are verified at home (the box-side autostop gate reads it)."""
    files = [{"path": f["path"], "sha256": f["sha256"]} for f in job["files"]
             if rec.files.get(f["path"], {}).get("state") in ("verified", "superseded")]
    try:
        session.mark_pulled(job["id"], files)
    except GpurunError:
        pass  # best effort: without the record, autostop simply keeps the box running


def pull_once(session: Any, dest: Path, *, jobs: Optional[list[str]] = None,
              policy: Optional[KeepPolicy] = None, fetcher: Any = None,
              progress: Optional[ProgressSink] = None, rehash: bool = False, s3: Any = None,
              settle_s: float = 2.0, reverify: int = 0) -> dict:
    """One pass over the host's manifest. Returns ``{"host", "dest", "jobs": [...],
    "done"}`` where ``done`` means every job is terminal and verified at home (and in S3
    when ``s3`` is given). ``reverify`` N re-hashes a rotating 1/N of each job's local
    copies (``pull.reverify``). A full destination raises DiskFull: the other jobs would
    not fit either, and the partials stay for the resume."""
    host = session.host["name"]
    policy = policy or KeepPolicy()
    fetcher = fetcher or choose_fetcher(session)
    man = _manifest(session, jobs, settle_s)
    results: list[dict] = []
    done = True
    if man.get("jobs"):
        record_dest(host, dest)
        fetcher.expect(len(man["jobs"]))   # sync/sshmux: one login for them all
    for job in man.get("jobs", []):
        root = job_root(dest / job_dir_name(host), job["id"], job.get("name"))
        res: JobPull = pull_job(job, root, fetcher, policy, host=host, progress=progress, rehash=rehash,
                                reverify=reverify)
        clean_staging(root)
        row = res.as_dict()
        row.update(name=job.get("name"), state=job.get("state"), method=" + ".join(res.methods) or fetcher.method)
        rec = JobRecord(root) if res.verified else None   # as pull_job left it, read once
        if s3 is not None and rec is not None:
            from orchestrator.sync.s3 import push_job

            kept = [f for f in job["files"] if rec.files.get(f["path"], {}).get("state") == "verified"]
            row["s3_pushed"] = push_job(s3, rec, root / VERIFIED, host, root.name, kept)
        if rec is not None and res.complete and not res.failed:
            _mark_pulled(session, job, rec)
        done = done and res.complete and not res.failed
        results.append(row)
    used = dict.fromkeys(m for r in results if r["pulled"] for m in r["method"].split(" + "))
    return {"host": host, "dest": str(dest), "jobs": results, "done": done, "method": " + ".join(used) or fetcher.method}


def pull(host_name: Optional[str] = None, *, jobs: Optional[list[str]] = None,
         dest: Optional[str] = None, loop: bool = False, interval: Optional[float] = None,
         use_s3: bool = False, rehash: bool = False, progress: Optional[ProgressSink] = None,
         on_pass: Optional[Callable[[dict], None]] = None, sleep: Callable[[float], None] = time.sleep) -> dict:
    """The ``gpurun pull`` use case. With ``loop`` repeats every ``interval`` seconds until
    the queue is done and everything is home; a dropped link is retried next round.
    Raises ConfigError / HostError / JobNotFound for bad input."""
    from orchestrator.core.session import open_session

    cfg, s3cfg = pull_config()
    out = default_dest(dest, cfg)
    policy = KeepPolicy.from_config(cfg)
    interval = float(interval if interval is not None else cfg.get("interval_s", 60))
    settle_s = float(cfg.get("settle_s", 2.0))
    reverify = int(cfg.get("reverify", REVERIFY_DEFAULT))
    target = None
    if use_s3:
        if s3cfg is None:
            raise ConfigError("--s3 given but config.yaml has no 's3' section",
                              "add s3: {endpoint_url, bucket, prefix, access_key_env, secret_key_env}")
        from orchestrator.sync.s3 import S3Target

        target = S3Target(s3cfg)
    while True:
        try:
            with open_session(host_name) as session:
                fetcher = choose_fetcher(session, cfg.get("method") or "auto", int(cfg.get("bwlimit_kbps") or 0),
                                         int(cfg.get("streams") or 1))
                try:
                    summary = pull_once(session, out, jobs=jobs, policy=policy, fetcher=fetcher,
                                        progress=progress, rehash=rehash, s3=target, settle_s=settle_s,
                                        reverify=reverify)
                finally:
                    fetcher.close()   # its shared SSH connection
        except TransportError as exc:
            if not loop:
                raise
            summary = {"host": host_name, "dest": str(out), "jobs": [], "done": False, "error": str(exc)}
        if on_pass is not None:
            on_pass(summary)
        if not loop or summary["done"]:
            return summary
        rehash, reverify = False, 0  # one re-read (full or sampled) per invocation is enough
        sleep(interval)


def repull_changed(session: Any, rec: JobRecord, job: dict, f: dict, notes: list[str]) -> Optional[str]:
    """The re-verify before ``down`` (``core/teardown.assess`` calls this when its re-read of
    a local copy did not match): a copy that exists at home but differs from the box's (a bit
    flip, an edit, even with its mtime put back) is re-pulled from the box, which holds the
    truth while it lives, and reported in ``notes``. Returns "local" once the fresh copy is
    verified, else None (missing files stay missing: pulling is ``gpurun pull``'s job)."""
    try:
        final = rec.final_path(f["path"])
    except GpurunError:
        return None  # an unsafe path never has a home copy
    if not final.is_file():
        return None
    fetcher = getattr(session, "_gpurun_fetcher", None)
    cfg = pull_config()[0]
    if fetcher is None:
        fetcher = choose_fetcher(session, cfg.get("method") or "auto", int(cfg.get("bwlimit_kbps") or 0),
                                 int(cfg.get("streams") or 1))
        try:
            session._gpurun_fetcher = fetcher  # one probe per `down`, however many files changed
        except AttributeError:
            pass
    res = pull_job(job, rec.root, fetcher, KeepPolicy.from_config(cfg), host=session.host["name"],
                   only={f["path"]})
    if f["path"] in res.pulled:
        notes.append(f"re-pulled {job['id']}/{show_path(f['path'])}: the copy at home had changed since it "
                     "was verified; the box's copy is the truth while the box lives")
        return "local"
    return None
