"""Provider control-plane figures against the loopback fakes (tests/rigs/fake_clouds.py).

1. API calls per minute while idle-watching 20 instances: batched poller (one list call per
   provider per tick) vs. the naive per-instance refresh, counted by the fake server.
2. Preemption -> detection latency with the batched poller at a given interval.
3. Preemption -> box back and SSH-reachable with the ``restart`` policy (fake boot = 1 poll).

Usage: python bench/bench_providers.py [--interval 0.5] [--trials 10] [--watch-interval 60]
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
from rigs.fake_providers import KEY, start_fake  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--watch-interval", type=float, default=60.0)
    a = ap.parse_args()
    os.environ.setdefault("XDG_DATA_HOME", tempfile.mkdtemp(prefix="gpurun-bench-"))
    idle_watch(a.watch_interval)
    detection(a.interval, a.trials)
    restart(a.interval, a.trials)


if __name__ == "__main__":
    main()
