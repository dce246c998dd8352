"""Provider control-plane figures against the loopback fakes (tests/rigs/fake_clouds.py).

1. API calls per minute while idle-watching 20 instances: batched poller (one list call per
   provider per tick) vs. the naive per-instance refresh, counted by the fake server.
2. Preemption -> detection latency with the batched poller at a given interval.
3. Preemption -> box back and SSH-reachable with the ``restart`` policy (fake boot = 1 poll).
4. Preemption -> the job running again on a replacement box (``replace`` policy), end to end:
   ``gpurun recover --watch`` against the RunPod fake whose pods are a real loopback sshd; the
   job restarts from its pulled checkpoint. Target: <= watch interval + 10 s. Needs root + sshd.

Usage: python bench/bench_providers.py [--interval 0.5] [--trials 10] [--watch-interval 60]
                                       [--recover-interval 5] [--recover-trials 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from orchestrator.core.recover import poll_instances  # noqa: E402
from orchestrator.providers import PROVIDERS, env_url_var, make_provider  # noqa: E402
from rigs.fake_providers import KEY, pods_on_rig, start_fake  # noqa: E402


def setup(name: str, **kw):
    fake = start_fake(name, **kw)
    os.environ[PROVIDERS[name][2]] = KEY
    os.environ[env_url_var(name)] = fake.url
    return fake, make_provider(name, sleep=lambda s: None)


def idle_watch(watch_interval: float, ticks: int = 5) -> None:
    print(f"== idle-watch 20 instances, {ticks} ticks per provider, scaled to a {watch_interval:g}s interval")
    for name in ("runpod", "lambda", "vast", "autodl"):
        fake, prov = setup(name)
        ids = [fake.new_instance("RTX 4090", 1, False, f"n{i}")["id"] for i in range(20)]
        for i in ids:
            fake.instances[i]["status"] = "running"
        base = fake.requests
        for _ in range(ticks):
            poll_instances(prov, ids)
        batched = (fake.requests - base) / ticks
        base = fake.requests
        for _ in range(ticks):
            for i in ids:
                prov.refresh(i)
        naive = (fake.requests - base) / ticks
        per_min = 60.0 / watch_interval
        print(f"  {name:7s} batched {batched:4.1f} req/tick = {batched * per_min:5.1f} req/min | "
              f"per-instance {naive:4.1f} req/tick = {naive * per_min:6.1f} req/min")
        fake.close()


def detection(interval: float, trials: int) -> None:
    print(f"== preemption -> detection, batched poller every {interval:g}s, {trials} trials (vast)")
    fake, prov = setup("vast")
    lat = []
    for _ in range(trials):
        rec = fake.new_instance("RTX 4090", 1, True, "spot")
        rec["status"] = "running"
        iid = rec["id"]
        stop = threading.Event()
        seen_at: list[float] = []

        def poller():
            while not stop.is_set():
                if poll_instances(prov, [iid])[iid].state == "preempted":
                    seen_at.append(time.monotonic())
                    return
                stop.wait(interval)

        th = threading.Thread(target=poller)
        th.start()
        time.sleep(random.uniform(0, interval))
        t0 = time.monotonic()
        fake.preempt(iid)
        th.join(timeout=interval * 4 + 5)
        stop.set()
        lat.append(seen_at[0] - t0)
    fake.close()
    print(f"  median {statistics.median(lat):.3f}s  max {max(lat):.3f}s  (bound: interval + 1 RTT)")


def restart(interval: float, trials: int) -> None:
    print(f"== preemption -> same box SSH-reachable again (restart policy), poll {interval:g}s, "
          f"{trials} trials (runpod)")
    import socket
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)   # stands in for the box's sshd: TCP accept is what `up` waits for
    fake, _ = setup("runpod", ssh=("127.0.0.1", lsock.getsockname()[1]))
    prov = make_provider("runpod")   # real sleeps: the boot takes one poll interval
    from orchestrator.core.rent import tcp_probe
    times = []
    for _ in range(trials):
        rec = fake.new_instance("RTX 4090", 1, True, "spot")
        rec["status"] = "running"
        iid = rec["id"]
        fake.preempt(iid)
        t0 = time.monotonic()
        while poll_instances(prov, [iid])[iid].state != "preempted":
            time.sleep(interval)
        prov.start(iid)
        prov.wait_state(iid, lambda i: i.ssh_reachable and tcp_probe(i.ssh_host, i.ssh_port),
                        timeout=30, interval=interval)
        times.append(time.monotonic() - t0)
    fake.close()
    lsock.close()
    print(f"  median {statistics.median(times):.3f}s  max {max(times):.3f}s  "
          "(excludes agent resume; real boots add the provider's start time)")


TRAIN = """import json, os, time
start = 0
if os.environ.get("GPURUN_RESUME_FROM"):
    start = json.load(open(os.path.join(os.environ["GPURUN_RESUME_FROM"], "state.json")))["step"]
os.makedirs("ckpt", exist_ok=True)
for step in range(start + 1, 10000):
    time.sleep(0.1)
    if step % 5 == 0:
        os.makedirs("ckpt/.t", exist_ok=True)
        json.dump({"step": step}, open("ckpt/.t/state.json", "w"))
        os.replace("ckpt/.t", "ckpt/step-%d" % step)
"""


def _cli(env: dict, *args: str, check: bool = True):
    import subprocess
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True,
                         text=True, timeout=300)
    if check and res.returncode != 0:
        raise SystemExit(f"gpurun {' '.join(args)} failed: {res.stderr}")
    return res


def moved(watch: float, trials: int) -> None:
    """Preemption -> job running again on the replacement, with `gpurun recover --watch`."""
    import json
    import shutil
    import signal
    import subprocess
    from pathlib import Path
    from rigs.agents import kill_agents_under
    from rigs.sshd import CLEAN_USER, SshdRig, sshd_available
    if os.geteuid() != 0 or sshd_available():
        print("== preemption -> job running on a replacement: skipped (needs root and sshd)")
        return
    print(f"== preemption -> job running again on a replacement box (replace policy), "
          f"recover --watch every {watch:g}s, {trials} trials (runpod fake + loopback sshd)")
    rig = SshdRig()
    rig.start()
    home = Path(tempfile.mkdtemp(prefix="gpurun-bench-recover-"))
    fake = start_fake("runpod", ssh=("127.0.0.1", rig.port))
    boxes = rig.user_dir(CLEAN_USER, "pods")
    env = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "cfg"),
               RUNPOD_API_KEY=KEY, GPURUN_RUNPOD_API_URL=fake.url, GPURUN_PROVIDER_POLL_S="0.2")
    pods_on_rig(home / "cfg" / "gpurun", boxes, CLEAN_USER, home / "art", on_preempt="replace", keep_latest=1)
    proj = home / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    q = home / "q.txt"
    q.write_text("[name=train gpus=0 checkpoints=ckpt] python3 train.py\n")
    figs, parts = [], []
    try:
        for t in range(trials):
            name = f"b{t}"
            up = json.loads(_cli(env, "up", "runpod", "--gpu", "RTX_4090", "--spot", "--yes", "--no-setup",
                                 "--json", "--ssh-key", str(rig.client_key), "--name", name).stdout)
            _cli(env, "push", str(proj), "--host", name)
            _cli(env, "queue", "submit", str(q), "--host", name)
            while not (boxes / name / "work" / "ckpt" / "step-10").exists():
                time.sleep(0.1)
            _cli(env, "pull", "--host", name, check=False)
            watcher = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "recover", name, "--watch",
                                        "--interval", str(watch), "--yes", "--no-setup", "--json"],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            time.sleep(random.uniform(0.5, watch + 0.5))   # preempt at a random point of the cycle
            t0 = time.time()
            fake.preempt(up["instance_id"])
            kill_agents_under(boxes / name)
            shutil.move(str(boxes / name), str(home / f"lost-{name}"))
            new_runs = boxes / f"{name}-r1" / "state" / "runs"
            started = None
            while started is None and time.time() - t0 < watch + 120:
                hits = list(new_runs.glob("*/started.*")) if new_runs.exists() else []
                started = hits[0].stat().st_mtime if hits else None
                time.sleep(0.05)
            out, _ = watcher.communicate(timeout=120)
            res = json.loads(out)
            if started is None:
                raise SystemExit("the moved job never started on the replacement")
            figs.append(started - t0)
            parts.append(res["elapsed_s"])
            kill_agents_under(boxes)
            if watcher.poll() is None:
                watcher.send_signal(signal.SIGTERM)
    finally:
        kill_agents_under(boxes)
        kill_agents_under(home)
        fake.close()
        rig.close()
        shutil.rmtree(home, ignore_errors=True)
    print(f"  preemption -> job running again: median {statistics.median(figs):.2f}s  max {max(figs):.2f}s  "
          f"(target <= {watch:g} + 10 = {watch + 10:g}s)")
    print(f"  recover --watch wall time per trial (waiting included): {', '.join(f'{p:.2f}s' for p in parts)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--watch-interval", type=float, default=60.0)
    ap.add_argument("--recover-interval", type=float, default=5.0)
    ap.add_argument("--recover-trials", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("XDG_DATA_HOME", tempfile.mkdtemp(prefix="gpurun-bench-"))
    idle_watch(a.watch_interval)
    detection(a.interval, a.trials)
    restart(a.interval, a.trials)
    moved(a.recover_interval, a.recover_trials)


if __name__ == "__main__":
    main()
