"""Pull throughput, resume bytes and memory over a real loopback sshd (run as root).

    python bench/bench_pull.py [--gb 1] [--rss-gb 10] [--rounds 5] [--streams 2] [--default-cipher]

1. a GB-sized file pulled with gpurun's engine (ssh writes the partial itself after a
   probe found the box quiet, gpurun hashes it from the page cache; fsync, format check,
   atomic rename, marker) vs plain ``rsync -a`` over the same SSH link, vs the engine's piped
   stream (the way before), and with ``--streams N`` over N ranged streams; interleaved in
   each round; medians, with the load average before and after. On a shared machine run it
   as ``chrt -r 1 python bench/bench_pull.py ...``: real-time round-robin for the bench and
   everything it starts (both ends of the link), so other sessions' load (which the
   kernel's autogroups would otherwise share out per session) does not decide the figure;
2. a pull killed at 40 % and resumed: bytes on the wire reported by rsync;
3. peak RSS of the pulling process for a ``--rss-gb`` sparse file (streaming hash);
4. the box's side: the manifest of a running job whose 1 GiB checkpoint is seen for the first
   time (settle wait 2 s, the hash done during it), a second call (cached), and one SHA-256
   pass over the file alone (the cost the wait now hides).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rigs.sshd import CLEAN_USER, SshdRig  # noqa: E402

from orchestrator.sync import direct as sync_direct  # noqa: E402
from orchestrator.sync import engine, stream  # noqa: E402
from orchestrator.sync.engine import pull_job  # noqa: E402
from orchestrator.sync.keep import KeepPolicy  # noqa: E402
from orchestrator.sync.transfer import RsyncFetcher  # noqa: E402


def make_file(path: Path, size: int, sparse: bool = False) -> str:
    h = hashlib.sha256()
    if sparse:
        with open(path, "wb") as fh:
            fh.truncate(size)
        block = b"\0" * (1 << 20)
        for _ in range(size >> 20):
            h.update(block)
        return h.hexdigest()
    block = os.urandom(1 << 20)
    with open(path, "wb") as fh:
        for i in range(size >> 20):
            b = i.to_bytes(8, "little") + block[8:]
            fh.write(b)
            h.update(b)
    return h.hexdigest()


def job_for(path: Path, digest: str) -> dict:
    st = path.stat()
    return {"id": "bench", "name": "bench", "state": "succeeded", "terminal": True, "pending": [],
            "files": [{"path": "checkpoints/model.bin", "remote": str(path), "kind": "checkpoint",
                       "unit": "model.bin", "size": st.st_size, "mtime": st.st_mtime, "sha256": digest}]}


def cpu_seconds() -> float:
    """CPU used so far at home: this process (gpurun's pull, its hash) and its reaped children
    (rsync, ssh). The box's side (sshd, its rsync or cat) is not counted: the rig's sshd
    reaps its sessions without charging them to itself. On a loaded machine the wall time
    swings with other work; this much less."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def drop_local(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)


def rss_child(argv_json: str) -> None:
    """Runs in a subprocess: pull once, print peak RSS of this process and of rsync."""
    a = json.loads(argv_json)
    fetcher = RsyncFetcher(a["ssh"], a["target"])
    t = time.monotonic()
    res = pull_job(a["job"], Path(a["dest"]), fetcher, KeepPolicy(), host="bench")
    dt = time.monotonic() - t
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would report the parent's peak
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"verified": res.verified, "seconds": dt, "self_maxrss_mb": hwm / 1024,
                      "children_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def manifest_figures(box: Path, src: Path) -> None:
    """Section 4: what a pull waits for on the box before its first byte moves."""
    from orchestrator.agent.manifest import build_manifest, sha256_file

    state = Path(tempfile.mkdtemp(prefix="gpurun-bench-state-"))
    job = {"id": "j", "name": "bench", "state": "running", "checkpoints": str(box)}
    past = time.time() - 30  # written half a minute ago, as a checkpoint the pull finds
    os.utime(src, (past, past))
    t = time.monotonic()
    sha256_file(str(src))
    alone = time.monotonic() - t
    t = time.monotonic()
    man = build_manifest(str(state), [job], settle_s=2.0)
    first = time.monotonic() - t
    t = time.monotonic()
    build_manifest(str(state), [job], settle_s=2.0)
    second = time.monotonic() - t
    listed = [f["path"] for f in man["jobs"][0]["files"]]
    print(f"manifest on the box, running job, 1 GiB checkpoint seen for the first time (settle 2 s): "
          f"{first:.2f} s (one SHA-256 pass alone {alone:.2f} s, so {2 + alone:.2f} s if hashed after the wait); "
          f"second call {second:.3f} s; listed {listed}")
    shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rss-gb", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--streams", type=int, default=1,
                    help="also time gpurun's pull over this many parallel ranged ssh streams (piped)")
    ap.add_argument("--default-cipher", action="store_true",
                    help="pull with OpenSSH's default cipher order, as plain rsync does (no AES-GCM first)")
    args = ap.parse_args()
    rig = SshdRig()
    rig.start()
    try:
        box = rig.user_dir(CLEAN_USER, "bench")
        ssh = rig.ssh_argv(CLEAN_USER)[:-1]  # argv without the target
        target = f"{CLEAN_USER}@127.0.0.1"
        size = int(args.gb * (1 << 30))
        src = box / "model.bin"
        digest = make_file(src, size)
        os.chmod(box, 0o755)
        os.chmod(src, 0o644)
        work = Path(tempfile.mkdtemp(prefix="gpurun-bench-"))
        ssh_e = " ".join(ssh)
        # like for like: plain rsync with the same cipher preference gpurun uses
        from orchestrator.sync.transfer import _CIPHERS, _has_aes
        same_cipher = not args.default_cipher and _has_aes()
        ssh_same = " ".join(ssh + ["-o", f"Ciphers={_CIPHERS}"]) if same_cipher else ssh_e
        def rsync_plain(e: str, durable: bool = False) -> None:
            drop_local(work / "plain")
            subprocess.run(["rsync", "-a", "-e", e, f"{target}:{src}", str(work / "plain" / "x")], check=True)
            if durable:  # made durable like gpurun's pull (which fsyncs before its atomic rename)
                fd = os.open(work / "plain" / "x", os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)

        fsync_s: list[float] = []  # time the engine spent in fsync, per pull of the new way
        real_fsync = engine._fsync_path

        def timed_fsync(path: Path) -> None:
            t = time.monotonic()
            real_fsync(path)
            fsync_s[-1] += time.monotonic() - t

        def gpurun_pull(direct: bool, streams: int = 1) -> None:
            drop_local(work / "ours")
            fetcher = RsyncFetcher(ssh, target, fast_cipher=not args.default_cipher, streams=streams)
            fsync_s.append(0.0)
            engine._fsync_path = timed_fsync
            stream.DIRECT = direct
            sync_direct._QUIET.clear()  # each `gpurun pull` is a new process: it probes the box again
            try:
                res = pull_job(job_for(src, digest), work / "ours", fetcher, KeepPolicy(), host="b")
            finally:
                engine._fsync_path = real_fsync
                stream.DIRECT = True
            if not direct:
                fsync_s.pop()
            assert res.verified and res.methods == ["ssh-stream"], res.as_dict()

        if args.streams > 1:
            runs_extra = {f"gpurun pull, {args.streams} ranged streams".ljust(33): lambda: gpurun_pull(False, args.streams)}
        else:
            runs_extra = {}
        runs = {  # label -> what it runs; interleaved in every round
            "plain rsync -a (default cipher)  ": lambda: rsync_plain(ssh_e),
            "plain rsync -a (gpurun's ciphers)": lambda: rsync_plain(ssh_same),
            "same + fsync (durable, like ours)": lambda: rsync_plain(ssh_same, durable=True),
            "gpurun pull (incl. verify)       ": lambda: gpurun_pull(True),
            "gpurun pull, piped stream, before": lambda: gpurun_pull(False),
        }
        runs.update(runs_extra)
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        load0 = os.getloadavg()
        for _ in range(args.rounds):
            for label, fn in runs.items():
                subprocess.run(["sync"], check=True)  # the previous run's writeback is not this one's
                c = cpu_seconds()
                t = time.monotonic()
                fn()
                wall[label].append(time.monotonic() - t)
                cpu[label].append(cpu_seconds() - c)
        load1 = os.getloadavg()
        med = {k: statistics.median(v) for k, v in wall.items()}
        print(f"pull {args.gb:g} GiB over loopback SSH, median of {args.rounds} interleaved rounds "
              f"(load {load0[0]:.2f} before, {load1[0]:.2f} after; {os.cpu_count()} CPUs); CPU: at home "
              "(gpurun, rsync, ssh):")
        for label in runs:
            print(f"  {label} : {med[label]:6.2f} s  {size / med[label] / 1e6:7.1f} MB/s  "
                  f"CPU {statistics.median(cpu[label]):5.2f} s")
        p, q, d, o, b = list(med.values())[:5]
        print(f"  of the gpurun pull, fsync before the rename (the VM's disk flush): median "
              f"{statistics.median(fsync_s):.2f} s, range {min(fsync_s):.2f}-{max(fsync_s):.2f} s")
        print(f"  ratio (rsync time / gpurun time, 1.0 = as fast): {q / o:.2f} of rsync with the same "
              f"ciphers ({q / b:.2f} piped, before), {d / o:.2f} of it made durable, {p / o:.2f} of default rsync")
        labels = list(runs)
        same, ours, old = wall[labels[1]], wall[labels[3]], wall[labels[4]]
        paired = statistics.median(a / c for a, c in zip(same, ours))
        print(f"  paired (median of the per-round ratios): {paired:.2f}; per round (s): "
              + "; ".join(f"{a:.2f}/{c:.2f}/{e:.2f}" for a, c, e in zip(same, ours, old))
              + "  (rsync same ciphers / gpurun / piped, before)")

        # resume: keep 40 % as a partial, pull again
        drop_local(work / "ours")
        part = work / "ours" / ".gpurun-partial" / "checkpoints" / "model.bin"
        part.parent.mkdir(parents=True)
        with open(src, "rb") as s, open(part, "wb") as d:
            d.write(s.read(int(size * 0.4)))
        res = pull_job(job_for(src, digest), work / "ours", RsyncFetcher(ssh, target), KeepPolicy(), host="b")
        assert res.verified
        print(f"resume after 40 %: {res.wire_bytes / 1e6:.1f} MB on the wire for {size * 0.6 / 1e6:.1f} MB "
              f"missing ({100 * res.wire_bytes / (size * 0.6):.1f} %)")

        manifest_figures(box, src)

        if args.rss_gb > 0:
            big = box / "big.bin"
            bsize = int(args.rss_gb * (1 << 30))
            bdigest = make_file(big, bsize, sparse=True)
            os.chmod(big, 0o644)
            free = shutil.disk_usage(work).free
            if free < bsize * 1.2:
                print(f"RSS: skipped, {free / 1e9:.0f} GB free < {bsize * 1.2 / 1e9:.0f} GB needed")
            else:
                drop_local(work / "big")
                arg = json.dumps({"ssh": ssh, "target": target, "dest": str(work / "big"),
                                  "job": job_for(big, bdigest)})
                out = subprocess.run([sys.executable, __file__, "--rss-child", arg], capture_output=True,
                                     text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"RSS for a {args.rss_gb:g} GB pull ({r['seconds']:.1f} s, verified={r['verified']}): "
                      f"gpurun process peak {r['self_maxrss_mb']:.0f} MB; rsync child peak "
                      f"{r['children_maxrss_mb']:.0f} MB")
                shutil.rmtree(work / "big", ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        rig.close()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2])
    else:
        main()
