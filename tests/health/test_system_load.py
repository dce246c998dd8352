"""``health.system.host_load``: the CPU / RAM line of ``gpurun watch`` from a fake /proc and
cgroup tree (the container's limit wins over the machine's memory)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.health.system import host_load


def _proc(root: Path, stats: list[str]) -> list[str]:
    (root / "self").mkdir(parents=True)
    (root / "self" / "cgroup").write_text("0::/\n")
    (root / "loadavg").write_text("1.50 0.75 0.25 2/300 4242\n")
    (root / "meminfo").write_text("MemTotal:       16000000 kB\nMemFree:  1000000 kB\n"
                                  "MemAvailable:   12000000 kB\n")
    (root / "stat").write_text(stats[0])
    return stats


def test_host_memory_and_cpu_over_the_sample(tmp_path):
    proc = tmp_path / "proc"
    stats = _proc(proc, ["cpu  100 0 100 800 0 0 0 0 0 0\nbtime 1\n",
                         "cpu  175 0 125 900 0 0 0 0 0 0\nbtime 1\n"])
    out = host_load(str(proc), str(tmp_path / "nocgroup"), sample_s=1,
                    sleep=lambda s: (proc / "stat").write_text(stats[1]))
    assert out["load"] == [1.5, 0.75, 0.25]
    assert out["cpu_pct"] == 50.0  # 100 busy of 200 jiffies
    assert out["mem_scope"] == "host" and out["mem_total_bytes"] == 16000000 * 1024
    assert out["mem_used_bytes"] == 4000000 * 1024 and out["mem_pct"] == 25.0


def test_container_limit_wins(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, ["cpu  1 0 1 8 0 0 0 0\n"])
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("memory\n")
    (cg / "memory.max").write_text(str(8 << 30))
    (cg / "memory.current").write_text(str(2 << 30))
    out = host_load(str(proc), str(cg), sample_s=0)
    assert out["mem_scope"] == "cgroup" and out["mem_pct"] == 25.0 and out["cpu_pct"] is None


def test_missing_proc_is_unknown_not_an_error(tmp_path):
    out = host_load(str(tmp_path / "none"), str(tmp_path / "none"), sample_s=0.01)
    assert out["load"] is None and out["cpu_pct"] is None and out["mem_total_bytes"] is None
