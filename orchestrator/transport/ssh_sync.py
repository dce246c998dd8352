"""Directory sync to an SSH host: rsync over OpenSSH with gpurun's known_hosts, falling back
to a tar stream over the open SSH channel, then to SFTP, when rsync (or tar) is missing or
broken on either side (a ``.bashrc`` that prints text breaks rsync's protocol, not tar's).
All three leave out the same paths: the excludes, and what each ``.gitignore`` lists.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from orchestrator.errors import OperationalError, TransportError
from orchestrator.transport.excludes import RSYNC_GITIGNORE_FILTER, Matcher, walk
from orchestrator.transport.openssh import openssh_argv, rsync_host
from orchestrator.transport.sshconfig import Endpoint

if TYPE_CHECKING:
    from orchestrator.transport.ssh import SSHTransport

_RSYNC_OK = (0, 24)  # 24: some source files vanished while copying, harmless for code


def openssh_args(t: "SSHTransport", hop: Endpoint | None = None, *, with_target: bool = True
                 ) -> list[str]:
    """argv for the OpenSSH client equivalent to the transport's own connection: same
    keys, same jump chain, same known_hosts policy (built by ``openssh.openssh_argv``)."""
    return openssh_argv(hop or t.endpoint, t.known_hosts, insecure=t.insecure,
                        connect_timeout=t.connect_timeout, with_target=with_target)


def _probe(t: "SSHTransport", remote_dir: str) -> tuple[str, bool, bool]:
    """Create ``remote_dir``; return its absolute path and whether rsync and tar exist there."""
    from orchestrator.transport.base import rpath

    rsync = shlex.quote(t.rsync_path) if t.rsync_path else "rsync"
    cmd = (f"mkdir -p {rpath(remote_dir)} && cd {rpath(remote_dir)} && "
           f"echo GPURUN-DIR=\"$(pwd -P)\"; "
           f"command -v {rsync} >/dev/null 2>&1 && echo GPURUN-RSYNC=1; "
           f"command -v tar >/dev/null 2>&1 && echo GPURUN-TAR=1; true")
    res = t.run(cmd, timeout=60)
    found = dict(re.findall(r"^(GPURUN-[A-Z]+)=(.*)$", res.stdout, re.M))
    if "GPURUN-DIR" not in found:
        raise OperationalError(f"{t.name}: cannot create {remote_dir}: "
                               f"{res.stderr.strip()[-200:] or 'unknown error'}",
                               hint="check the path and permissions on the box")
    return found["GPURUN-DIR"], "GPURUN-RSYNC" in found, "GPURUN-TAR" in found


def sync(t: "SSHTransport", local_dir: str, remote_dir: str, *,
         excludes: Sequence[str] = ()) -> dict:
    """Mirror ``local_dir`` into ``remote_dir``. Returns ``{method, files, bytes}`` plus
    ``fallback_reason`` when rsync was not used. Only rsync deletes remote files that are
    gone locally; excluded remote paths (checkpoints, wandb) are never deleted."""
    src = Path(local_dir)
    if not src.is_dir():
        raise OperationalError(f"{local_dir}: not a directory", hint="push a project directory")
    abs_dir, remote_rsync, remote_tar = _probe(t, remote_dir)
    reason = None
    if shutil.which("rsync") is None:
        reason = "rsync missing here"
    elif not remote_rsync:
        reason = "rsync missing on the box"
    else:
        res = _rsync(t, src, abs_dir, excludes)
        if res.returncode in _RSYNC_OK:
            return {"method": "rsync", **rsync_stats(res.stdout), "remote_dir": abs_dir}
        reason = f"rsync failed (exit {res.returncode}: {_last_line(res.stderr)})"
    matcher = Matcher(excludes)
    if remote_tar:
        stats = _tar(t, src, abs_dir, matcher)
    else:
        stats = _sftp(t, src, abs_dir, matcher)
    return {**stats, "fallback_reason": reason, "remote_dir": abs_dir}


def _rsync(t: "SSHTransport", src: Path, abs_dir: str, excludes: Sequence[str]):
    argv = ["rsync", "-rlptz", "--delete", "--stats",
            "-e", " ".join(shlex.quote(a) for a in openssh_args(t))]
    if t.rsync_path:
        argv.append(f"--rsync-path={t.rsync_path}")
    argv += [f"--exclude={p}" for p in excludes] + [RSYNC_GITIGNORE_FILTER]
    host = rsync_host(t.endpoint)
    # rsync >= 3.2.4 escapes remote args itself; older ones need --protect-args (-s).
    argv += ["-s", str(src) + "/", f"{host}:{abs_dir}/"]
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              timeout=max(600, t.connect_timeout * 10))
    except subprocess.TimeoutExpired:
        raise TransportError(f"{t.name}: rsync did not finish in time",
                             hint="run `gpurun push` again; rsync resumes") from None


def rsync_stats(text: str) -> dict:
    """``{files, bytes}`` sent, from rsync's ``--stats``; None for a count it did not print
    (an unknown rsync says nothing rather than a wrong 0). Older rsyncs (< 3.1) say
    "Number of files transferred"."""
    files = re.search(r"Number of (?:regular )?files transferred: ([\d,.]+)", text)
    size = re.search(r"Total transferred file size: ([\d,.]+)", text)
    num = lambda m: int(re.sub(r"[,.]", "", m.group(1))) if m else None  # noqa: E731
    return {"files": num(files), "bytes": num(size)}


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:160] if lines else "no message"


def _tar(t: "SSHTransport", src: Path, abs_dir: str, matcher: Matcher) -> dict:
    files = total = 0
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
        with tarfile.open(fileobj=spool, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            for rel, path in walk(src, matcher):
                tar.add(str(path), arcname=rel, recursive=False)
                if path.is_file() and not path.is_symlink():
                    files += 1
                    total += path.stat().st_size
        spool.seek(0)
        res = t._exec(f"tar -xzmf - -C {shlex.quote(abs_dir)} --no-same-owner", spool,
                      timeout=max(600.0, t.connect_timeout * 10))
    if res.exit_code != 0:
        raise TransportError(f"{t.name}: tar on the box failed: {_last_line(res.stderr)}",
                             hint="check free space on the box", retryable=False)
    return {"method": "tar", "files": files, "bytes": total}


def _sftp(t: "SSHTransport", src: Path, abs_dir: str, matcher: Matcher) -> dict:
    with t.sftp_session() as sftp:  # one SFTP user at a time per transport (ssh_files.py)
        files = total = 0
        made: set[str] = set()
        for rel, path in walk(src, matcher):
            target = posixpath.join(abs_dir, rel)
            parent = posixpath.dirname(target)
            if parent not in made:
                t._mkdirs(sftp, parent)
                made.add(parent)
            if path.is_symlink():
                try:
                    sftp.remove(target)
                except OSError:
                    pass
                sftp.symlink(os.readlink(path), target)
                continue
            t.put(str(path), target)
            files += 1
            total += path.stat().st_size
    return {"method": "sftp", "files": files, "bytes": total}
