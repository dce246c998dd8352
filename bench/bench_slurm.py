#!/usr/bin/env python3
"""Issue 13: what gpurun adds on a Slurm host, against bare Slurm commands (needs root).

    python bench/bench_slurm.py [--submit N] [--gap-jobs M] [--status-jobs K] [--rounds R]

Runs on the one-node cluster of ``tests/rigs/slurm.py`` (joined if running, else started) and
a loopback sshd of its own, as a dedicated user ``gpurun-b`` (so ``squeue -u`` and ``scancel -u``
see the bench's jobs only, whatever the test suite runs beside it). Every figure is a cold CLI
or a cold ``ssh`` (gpurun keeps no SSH master), rounds interleaved (a load spike hits both):

* submit of N jobs (default 50), on a node a blocker job fills (so none starts during the
  measure): ``gpurun queue submit FILE --host cluster`` vs one ``ssh`` running N ``sbatch`` of a
  one-line script with the options gpurun gives (job name, output, --chdir, --requeue,
  --open-mode=append, -c 1), and vs one ``sbatch --array=0-(N-1)`` of it (gpurun sends 16+
  jobs with the same options as one array);
  the jobs are scancelled after each round;
* job-to-job gap (M jobs each, default 8, in series: each asks both fake GPUs): the time from
  one job's command ending to the next one's command starting, as the commands stamp it; bare
  ``sbatch --gres=gpu:2 script`` (same options) vs gpurun (whose wrapper starts and ends in
  the allocation);
* ``queue status`` with K jobs on Slurm (default 1,000: a blocker runs, the K wait): gpurun
  piped and ``--json`` (both reconcile: one ``squeue`` for all, then the run-dir files) vs
  ``ssh squeue -r -u gpurun-b`` (one line per array task). The K-job submit itself is timed
  once against the same two bare forms.

Prints one JSON document: medians in seconds, ratios, the load average before and after.
gpurun is the tree this file sits in (``PYTHONPATH``): to bench a commit, run the file from a
``git archive`` of it.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rigs.slurm import SlurmRig  # noqa: E402
from rigs.slurm_files import conf_digest  # noqa: E402
from rigs.sshd import SshdRig, _ensure_user  # noqa: E402

USER = "gpurun-b"
CLI = [sys.executable, "-m", "orchestrator.cli"]


def sh(rig: SshdRig, script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    quoted = "'" + script.replace("'", "'\"'\"'") + "'"
    res = subprocess.run(rig.ssh_argv(USER, "bash", "-c", quoted), capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode:
        raise SystemExit(f"ssh {script[:60]!r}: exit {res.returncode}: {res.stderr.strip()[-400:]}")
    return res


def timed(argv: list[str], env: dict, timeout: float = 600) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{' '.join(argv[2:6])} failed ({res.returncode}): {res.stderr.strip()[-600:]}")
    return took, res.stdout


def cli(env: dict, *args: str, timeout: float = 600) -> tuple[float, str]:
    return timed(CLI + list(args), env, timeout)


class Bench:
    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="gpurun-bench-slurm-"))
        self.env = dict(os.environ, HOME=str(self.home), XDG_DATA_HOME=str(self.home / "data"),
                        XDG_CONFIG_HOME=str(self.home / "config"),
                        PYTHONPYCACHEPREFIX=str(self.home / "pyc"),
                        PYTHONPATH=str(ROOT))  # the gpurun of this bench's tree
        for k in ("GPURUN_HOST", "PYTHONDONTWRITEBYTECODE"):
            self.env.pop(k, None)
        os.environ.update(self.env)
        _ensure_user(USER, noisy=False)
        pw = pwd.getpwnam(USER)
        self.box = Path(pw.pw_dir) / f"bench-{os.getpid()}"
        self.box.mkdir(exist_ok=True)
        os.chown(self.box, pw.pw_uid, pw.pw_gid)
        self.slurm = SlurmRig().start()
        self.sshd = SshdRig()
        self.sshd.start()
        from orchestrator import hosts, paths

        self.sshd.trust(paths.data_home() / "known_hosts")
        for name in ("cluster", "status"):  # "status": a store holding the K jobs only
            hosts.add_host({"name": name, "profile": "slurm", "kind": "ssh",
                            "ssh": {"user": USER, "hostname": "127.0.0.1", "port": self.sshd.port,
                                    "key": str(self.sshd.client_key)},
                            "state_dir": str(self.box / name / "state"),
                            "workdir": str(self.box / name / "work")})
            cli(self.env, "queue", "status", "--host", name)  # ship the agent, write its config

    def close(self) -> None:
        try:
            sh(self.sshd, f"scancel -u {USER}; true")
        finally:
            self.sshd.close()
            self.slurm.close()
            shutil.rmtree(self.home, ignore_errors=True)
            shutil.rmtree(self.box, ignore_errors=True)

    def blocker(self) -> str:
        """A job that holds both CPUs and both GPUs until scancelled: later jobs wait."""
        bid = sh(self.sshd, "sbatch --parsable -c 2 --gres=gpu:2 -o /dev/null -J blocker "
                            "--wrap 'sleep 3000'").stdout.strip()
        self.slurm.wait_state(bid, {"RUNNING"})
        return bid

    def queue_file(self, name: str, lines: list[str]) -> Path:
        q = self.home / name
        q.write_text("".join(lines))
        return q

    def gpurun_ids(self) -> list[str]:
        _, out = cli(self.env, "queue", "status", "--host", "cluster", "--json")
        return [j["backend_id"] for j in json.loads(out)["jobs"] if j.get("backend_id")]

    @property
    def bare_opts(self) -> str:
        """gpurun's sbatch options (agent/slurm.sbatch_options) for a bare job of the loop's $i."""
        return (f"--job-name=bare-$i --output={self.box}/bare-%j.out --chdir={self.box} "
                f"--requeue --open-mode=append")

    def bare_script(self, name: str, body: str) -> Path:
        script = self.box / name
        script.write_text("#!/bin/bash\n" + body + "\n")
        os.chmod(script, 0o755)
        return script

    # -- 1. submit ---------------------------------------------------------------------
    def bare_submit(self, n: int, array: bool) -> float:
        """N bare jobs over one ssh: N ``sbatch`` calls, or one ``sbatch --array`` (what gpurun
        does for 16+ jobs with the same options); cancelled again. Returns the seconds."""
        script = self.bare_script("bare.sh", "true")
        if array:
            cmd = (f"cd {self.box} && sbatch --parsable --array=0-{n - 1} --job-name=bare-array "
                   f"--output={self.box}/bare-%A_%a.out --chdir={self.box} --requeue "
                   f"--open-mode=append -c 1 {script}")
        else:
            cmd = f"cd {self.box} && for i in $(seq {n}); do sbatch --parsable {self.bare_opts} -c 1 {script}; done"
        t0 = time.perf_counter()
        ids = sh(self.sshd, cmd).stdout.split()
        took = time.perf_counter() - t0
        assert len(ids) == (1 if array else n), ids[:3]
        sh(self.sshd, "scancel " + " ".join(ids))
        return took

    def submit_round(self, n: int, r: int) -> tuple[float, float, float]:
        q = self.queue_file(f"submit-{r}.txt", [f"[name=s{r}-{i} gpus=0] true\n" for i in range(n)])
        before = set(self.gpurun_ids())
        t_g, _ = cli(self.env, "queue", "submit", str(q), "--host", "cluster", "--json")
        mine = [b for b in self.gpurun_ids() if b not in before]
        assert len(mine) == n, (len(mine), n)
        sh(self.sshd, "scancel " + " ".join(sorted({b.split("_")[0] for b in mine})))
        return t_g, self.bare_submit(n, array=False), self.bare_submit(n, array=True)

    # -- 2. job-to-job gap ---------------------------------------------------------------
    def gaps(self, stamps: Path, m: int, timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = stamps.read_text().split() if stamps.exists() else []
            if len(lines) >= 2 * m:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"{stamps}: {len(lines)} stamps of {2 * m} after {timeout:.0f}s")
        marks = sorted((float(t), kind) for t, kind in (ln.split(",") for ln in lines))
        out, last_end = [], None
        for t, kind in marks:
            if kind == "start" and last_end is not None:
                out.append(t - last_end)
            if kind == "end":
                last_end = t
        return out

    def gap_round(self, m: int, r: int, gpurun: bool) -> list[float]:
        stamps = self.box / f"stamps-{'g' if gpurun else 'b'}-{r}.txt"
        body = (f"echo $(date +%s.%N),start >> {stamps}; sleep 0.5; "
                f"echo $(date +%s.%N),end >> {stamps}")
        if gpurun:
            q = self.queue_file(f"gap-{r}.txt", [f"[name=gap{r}-{i} gpus=2] {body}\n" for i in range(m)])
            cli(self.env, "queue", "submit", str(q), "--host", "cluster")
        else:
            script = self.bare_script(f"gap-{r}.sh", body)
            sh(self.sshd, f"cd {self.box} && for i in $(seq {m}); do sbatch --parsable {self.bare_opts} "
                          f"--gres=gpu:2 {script}; done")
        return self.gaps(stamps, m, timeout=30 + 15 * m)

    # -- 3. status of K jobs -------------------------------------------------------------
    def status_setup(self, k: int) -> dict:
        self.blocker()
        q = self.queue_file("status.txt", [f"[name=st-{i:05d} gpus=0] true\n" for i in range(k)])
        t_g, _ = cli(self.env, "queue", "submit", str(q), "--host", "status", "--json")
        t_loop, t_array = self.bare_submit(k, array=False), self.bare_submit(k, array=True)
        return {"gpurun_s": round(t_g, 3), "bare_sbatch_loop_s": round(t_loop, 3),
                "bare_sbatch_array_s": round(t_array, 3), "ratio_vs_array": round(t_g / t_array, 2)}

    def status_round(self) -> dict[str, float]:
        t_pipe, out = cli(self.env, "queue", "status", "--host", "status")
        t_json, js = cli(self.env, "queue", "status", "--host", "status", "--json")
        t0 = time.perf_counter()
        sq = sh(self.sshd, f"squeue -r -u {USER}").stdout  # -r: one line per array task
        t_sq = time.perf_counter() - t0
        self.sizes = {"status_lines": len(out.splitlines()), "json_jobs": len(json.loads(js)["jobs"]),
                      "squeue_lines": len(sq.splitlines())}
        return {"status": t_pipe, "status_json": t_json, "squeue": t_sq}


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--submit", type=int, default=50)
    ap.add_argument("--gap-jobs", type=int, default=8)
    ap.add_argument("--status-jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    load0 = os.getloadavg()
    b = Bench()
    report: dict = {"machine": {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load0]},
                    "slurm_conf": conf_digest()}
    try:
        blocker = b.blocker()
        sub = [b.submit_round(args.submit, r) for r in range(args.rounds)]
        g, lp, ar = ([x[i] for x in sub] for i in range(3))
        report["submit"] = {"jobs": args.submit, "gpurun_s": med(g), "bare_sbatch_loop_s": med(lp),
                            "bare_sbatch_array_s": med(ar),
                            "ratio_vs_loop": round(statistics.median(g) / statistics.median(lp), 2),
                            "ratio_vs_array": round(statistics.median(g) / statistics.median(ar), 2),
                            "gpurun_all": [round(x, 3) for x in g], "loop_all": [round(x, 3) for x in lp],
                            "array_all": [round(x, 3) for x in ar]}
        sh(b.sshd, f"scancel {blocker}")
        gg: list[float] = []
        gb: list[float] = []
        for r in range(max(2, args.rounds // 2)):
            gb += b.gap_round(args.gap_jobs, r, gpurun=False)
            gg += b.gap_round(args.gap_jobs, r, gpurun=True)
        report["job_to_job_gap"] = {
            "jobs_per_round": args.gap_jobs, "gpurun_median_s": med(gg), "bare_median_s": med(gb),
            "ratio": round(statistics.median(gg) / statistics.median(gb), 2),
            "gpurun_range": [round(min(gg), 3), round(max(gg), 3)],
            "bare_range": [round(min(gb), 3), round(max(gb), 3)]}
        report["status_submit"] = {"jobs": args.status_jobs, **b.status_setup(args.status_jobs)}
        rounds = [b.status_round() for _ in range(args.rounds)]
        st = {k: [x[k] for x in rounds] for k in rounds[0]}
        report["status"] = {"jobs": args.status_jobs, **{k: med(v) for k, v in st.items()},
                            "ratio_status_vs_squeue": round(statistics.median(st["status"])
                                                            / statistics.median(st["squeue"]), 2),
                            "ratio_json_vs_squeue": round(statistics.median(st["status_json"])
                                                          / statistics.median(st["squeue"]), 2),
                            **b.sizes}
    finally:
        b.close()
        report["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
