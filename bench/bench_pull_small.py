"""Pulls of many small files vs plain ``rsync -a`` over a real loopback sshd (run as root).

    python bench/bench_pull_small.py [--trees 150:2,2000:20] [--rounds 3] [--profile]

For each tree (``files:MB``: that many files, sizes spread around the mean, in nested dirs
like an HF checkpoint dir plus a run dir of metric/sample files) the rounds interleave:
plain ``rsync -a`` of the tree, then gpurun's engine pulling the same files (every file
SHA-256-verified against the manifest, durable, then renamed). Reports best-of and the ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rigs.sshd import CLEAN_USER, SshdRig  # noqa: E402

from orchestrator.sync.engine import pull_job  # noqa: E402
from orchestrator.sync.keep import KeepPolicy  # noqa: E402
from orchestrator.sync.transfer import RsyncFetcher  # noqa: E402


def make_tree(base: Path, files: int, total: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    run = base / "run"
    out = []
    mean = total // files
    for i in range(files):
        sub = ("samples/%03d" % (i // 100)) if i % 3 else ("metrics/part-%02d" % (i // 500))
        path = run / sub / f"file-{i:05d}.dat"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(max(1, int(mean * rng.uniform(0.2, 1.8))))
        path.write_bytes(data)
        os.chmod(path, 0o644)
        st = path.stat()
        out.append({"path": "run/" + path.relative_to(run).as_posix(), "remote": str(path), "kind": "evidence",
                    "size": st.st_size, "mtime": st.st_mtime, "sha256": hashlib.sha256(data).hexdigest()})
    for dirpath, _d, _f in os.walk(base):
        os.chmod(dirpath, 0o755)
    return {"id": "bench", "name": "bench", "state": "succeeded", "terminal": True, "pending": [],
            "files": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default="150:2,2000:20")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile one engine pull of the first tree")
    args = ap.parse_args()
    rig = SshdRig()
    rig.start()
    work = Path(tempfile.mkdtemp(prefix="gpurun-bench-small-"))
    try:
        ssh = rig.ssh_argv(CLEAN_USER)[:-1]
        target = f"{CLEAN_USER}@127.0.0.1"
        ssh_e = " ".join(ssh)
        print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        for spec in args.trees.split(","):
            n, mb = spec.split(":")
            box = rig.user_dir(CLEAN_USER, f"small-{n}")
            job = make_tree(box, int(n), int(float(mb) * 1e6))
            size = sum(f["size"] for f in job["files"])
            if args.profile:
                import cProfile
                import pstats

                shutil.rmtree(work / "ours", ignore_errors=True)
                prof = cProfile.Profile()
                prof.enable()
                pull_job(job, work / "ours", RsyncFetcher(ssh, target), KeepPolicy(), host="b")
                prof.disable()
                pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(25)
                return
            plain_t, ours_t = [], []
            for _ in range(args.rounds):
                shutil.rmtree(work / "plain", ignore_errors=True)
                t = time.monotonic()
                subprocess.run(["rsync", "-a", "-e", ssh_e, f"{target}:{box}/run/", str(work / "plain") + "/"],
                               check=True)
                plain_t.append(time.monotonic() - t)
                shutil.rmtree(work / "ours", ignore_errors=True)
                t = time.monotonic()
                res = pull_job(job, work / "ours", RsyncFetcher(ssh, target), KeepPolicy(), host="b")
                ours_t.append(time.monotonic() - t)
                assert res.verified and len(res.pulled) == int(n), {k: v for k, v in res.as_dict().items() if k != "pulled"}
            p, o = min(plain_t), min(ours_t)
            print(f"{n} files / {size / 1e6:.1f} MB (best of {args.rounds}): plain rsync -a {p:6.2f} s, "
                  f"gpurun pull (verified, durable) {o:6.2f} s = {o / p:.2f}x rsync")
        print(f"load average at end: {' '.join('%.2f' % x for x in os.getloadavg())}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        rig.close()


if __name__ == "__main__":
    main()
