"""Figures for profiles and setup: profile load, `gpurun profiles ls` cold, and the setup
probe round trip (local, and over a real loopback sshd vs a bare `ssh true`).

Run: python bench/bench_profiles_setup.py   (needs openssh-server for the SSH figures)
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def timed(fn, n: int) -> tuple[float, float]:
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs), max(xs)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="gpurun-bench-"))
    try:
        figures(home)
    finally:  # the throwaway home holds a known_hosts and agent state: leave nothing behind
        shutil.rmtree(home, ignore_errors=True)


def figures(home: Path) -> None:
    os.environ.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"),
                      XDG_CONFIG_HOME=str(home / "config"))
    from orchestrator.profiles import list_profiles, load_profile

    med, mx = timed(lambda: load_profile("runpod"), 50)
    print(f"load_profile('runpod') in-process: median {med * 1e3:.1f} ms, max {mx * 1e3:.1f} ms")
    med, mx = timed(list_profiles, 20)
    print(f"list_profiles() (7 profiles): median {med * 1e3:.1f} ms, max {mx * 1e3:.1f} ms")
    cmd = [sys.executable, "-c", "from orchestrator.cli.main import main; main()",
           "profiles", "ls", "--json"]
    med, mx = timed(lambda: subprocess.run(cmd, capture_output=True, check=True), 10)
    print(f"`gpurun profiles ls --json` cold process: median {med * 1e3:.0f} ms, "
          f"max {mx * 1e3:.0f} ms")

    from orchestrator.core.setup import layout, run_probe
    from orchestrator.transport.local import LocalTransport

    prof = load_profile("generic-ssh")
    host = {"name": "local", "state_dir": str(home / "state")}
    lay = layout(prof, host)
    t = LocalTransport()
    med, mx = timed(lambda: run_probe(t, prof, lay), 10)
    print(f"setup probe, local transport: median {med * 1e3:.0f} ms, max {mx * 1e3:.0f} ms")

    from rigs.sshd import CLEAN_USER, SshdRig, sshd_available

    why = sshd_available()
    if why:
        print(f"SSH figures skipped: {why}")
        return
    rig = SshdRig()
    rig.start()
    try:
        from orchestrator import hosts, paths

        entry = rig.host_entry(CLEAN_USER, name="benchbox")
        rig.trust(paths.data_home() / "known_hosts")
        hosts.add_host(entry)
        bare = rig.ssh_argv(CLEAN_USER, "true")
        med_ssh, _ = timed(lambda: subprocess.run(bare, capture_output=True, check=True), 10)
        print(f"bare `ssh box true`: median {med_ssh * 1e3:.0f} ms")
        dry = [sys.executable, "-c", "from orchestrator.cli.main import main; main()",
               "setup", "generic-ssh", "benchbox", "--json"]
        med, mx = timed(lambda: subprocess.run(dry, capture_output=True), 5)
        print(f"`gpurun setup generic-ssh box` cold CLI over loopback SSH (probe + 2 "
              f"actions): median {med * 1e3:.0f} ms, max {mx * 1e3:.0f} ms "
              f"({med / med_ssh:.1f}x bare ssh)")
    finally:
        rig.close()


if __name__ == "__main__":
    main()
