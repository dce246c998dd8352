"""Judging a setup probe: raw tool output from the box -> checks, GPUs, tiers, refusal.

Pure functions over the probe's JSON (see ``templates/setup_probe.sh``), so every rule is
testable with a literal probe document.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.profiles import Profile

# fstypes where SQLite's POSIX locks are unreliable or absent.
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs",
              "beegfs", "afs", "9p", "ncpfs", "davfs", "ocfs2", "moosefs", "orangefs"}
LOCAL_FUSE = {"fuse.lxcfs", "fuseblk"}


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS or (fstype.startswith("fuse.") and fstype not in LOCAL_FUSE)


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_of(path: str, mounts_text: str) -> tuple[str, str]:
    """(mount point, fstype) holding absolute ``path``: the longest matching mount point;
    the last mount wins for the same point (it hides the earlier ones)."""
    best, best_len = ("/", "unknown"), -1
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mp, fstype = _unescape(parts[1]), parts[2]
        base = mp.rstrip("/")
        if path == mp or path.startswith(base + "/") or mp == "/":
            if len(mp) >= best_len:
                best, best_len = (mp, fstype), len(mp)
    return best


def _df(row: str) -> dict[str, Any]:
    """One ``df -Pk`` / ``df -Pi`` row -> numbers (None where the fs reports none)."""
    f = row.split()
    if len(f) < 6:
        return {}

    def num(x: str) -> int | None:
        return int(x) if x.isdigit() else None

    pct = f[4].rstrip("%")
    return {"total": num(f[1]), "used": num(f[2]), "avail": num(f[3]),
            "pct": int(pct) if pct.isdigit() else None}


def parse_gpus(nv: dict | None) -> tuple[list[dict], str | None, str | None, str | None]:
    """(gpus, driver, cuda, error) from the nvidia-smi part of the probe."""
    if not nv:
        return [], None, None, "nvidia-smi not found"
    gpus = []
    err = None
    if nv.get("query_rc", 0) != 0:
        err = (nv.get("query") or "").strip().splitlines()[-1:] or ["nvidia-smi failed"]
        err = err[0][:200]
    else:
        for line in (nv.get("query") or "").splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) >= 4 and cells[0].isdigit():
                gpus.append({"index": int(cells[0]), "name": cells[1], "memory": cells[2],
                             "driver": cells[3]})
    banner = nv.get("banner") or ""
    drv = re.search(r"Driver Version:\s*([\d.]+)", banner)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    driver = drv.group(1) if drv else (gpus[0]["driver"] if gpus else None)
    return gpus, driver, cuda.group(1) if cuda else None, err


def _gib(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1048576:.1f} GiB"


def analyse(probe: dict, profile: Profile, host: dict, lay: dict) -> dict:
    """Checks (name, status ok|warn|fail, detail), GPUs, tiers and a refusal if the agent
    state would land somewhere unsafe."""
    d = profile.data
    wd = d["watchdog"]
    checks: list[dict] = []

    def check(name: str, status: str, detail: str) -> None:
        checks.append({"name": name, "status": status, "detail": detail})

    py = probe.get("python") or {}
    ver = py.get("version") or ""
    nums = tuple(int(x) for x in ver.split(".")[:2] if x.isdigit())
    if not py.get("path"):
        check("python", "fail", "no python3 on PATH; the gpurun agent needs Python >= 3.8")
    elif nums < (3, 8):
        check("python", "fail", f"{py['path']} is Python {ver or '?'}; the agent needs >= 3.8")
    else:
        check("python", "ok", f"{py['path']} (Python {ver})")

    gpus, driver, cuda, gerr = parse_gpus(probe.get("nvidia_smi"))
    expect = host.get("expect_gpus")
    pod_gpus = (probe.get("provider_env") or {}).get("RUNPOD_GPU_COUNT") or ""
    if gerr:
        # A box without nvidia-smi may be a CPU box on purpose; on RunPod it is RP1/RP9.
        sev = "fail" if expect or profile.name == "runpod" or pod_gpus else "warn"
        check("gpus", sev, f"{gerr}: NO GPU visible; jobs would run on CPU")
    elif not gpus:
        msg = "nvidia-smi sees ZERO GPUs"
        if profile.name == "runpod" or pod_gpus:
            msg += (" -- the RunPod zero-GPU-after-restart trap (RP1): the stopped pod was "
                    "pinned to a host whose GPUs are now rented; terminate and re-create it")
        check("gpus", "fail", msg)
    else:
        names = ", ".join(sorted({g["name"] for g in gpus}))
        detail = f"{len(gpus)} x {names}; driver {driver or '?'}, CUDA {cuda or '?'}"
        short = (expect and len(gpus) < int(expect)) or (
            pod_gpus.isdigit() and len(gpus) < int(pod_gpus))
        check("gpus", "fail" if short else "ok",
              detail + (f" -- expected {expect or pod_gpus}" if short else ""))

    mounts = probe.get("mounts") or ""
    tiers_by_path = {t["path"]: t for t in d["storage"]}
    measured: dict[str, dict] = {}
    for row in probe.get("paths") or []:
        nearest = row.get("nearest") or "/"
        mp, fstype = mount_of(nearest, mounts)
        disk, ino = _df(row.get("df") or ""), _df(row.get("dfi") or "")
        measured[row["asked"]] = {
            "path": row["asked"], "expanded": row.get("expanded"), "exists": row.get("exists"),
            "writable": row.get("writable"), "mount": mp, "fstype": fstype,
            "network_fs": is_network_fs(fstype), "free_bytes":
                None if disk.get("avail") is None else disk["avail"] * 1024,
            "used_pct": disk.get("pct"), "inode_used_pct": ino.get("pct"),
        }
    tiers = []
    for path, tier in tiers_by_path.items():
        m = dict(measured.get(path) or {"path": path})
        m.update(name=tier["name"], survives_stop=tier["survives_stop"],
                 survives_destroy=tier["survives_destroy"], declared_network_fs=tier["network_fs"])
        tiers.append(m)
        if not m.get("exists"):
            sev = "warn" if path == lay.get("durable_dir") else "ok"
            check(f"tier {tier['name']}", sev, f"{path} is not present on this box")
            continue
        used, iused = m.get("used_pct"), m.get("inode_used_pct")
        bad = []
        if used is not None and used >= wd["disk_pct"]:
            bad.append(f"disk {used}% used")
        if iused is not None and iused >= wd["inode_pct"]:
            bad.append(f"inodes {iused}% used")
        free = _gib(None if m["free_bytes"] is None else m["free_bytes"] // 1024)
        detail = (f"{path}: {free} free, disk {'?' if used is None else used}%, inodes "
                  f"{'n/a' if iused is None else iused}% used ({m['fstype']} at {m['mount']})")
        check(f"tier {tier['name']}", "fail" if bad else "ok",
              detail + (" -- " + ", ".join(bad) if bad else ""))

    refusal = None
    sd = measured.get(lay["state_dir"]) or {}
    if sd.get("network_fs") and d.get("kind") == "slurm":
        # a cluster's shared home: the compute nodes write the run dirs, and only this login
        # node opens the store (profile_schema.check_state_dir)
        check("state dir", "ok", f"{lay['state_dir']} on {sd['fstype']} at {sd['mount']}, shared with the "
              "compute nodes (use this one login node for gpurun)")
    elif sd.get("network_fs"):
        refusal = {
            "message": f"state dir {lay['state_dir']} is on a network filesystem "
                       f"({sd['fstype']} mounted at {sd['mount']}), where SQLite locking breaks",
            "hint": f"set paths.state_dir in {_user_file(profile)} (or the host's state_dir) to "
                    "a local disk that survives stop, then run setup again"}
        check("state dir", "fail", refusal["message"])
    elif sd and not sd.get("writable"):
        check("state dir", "fail", f"{lay['state_dir']} is not writable by {probe.get('user')}")
    elif sd:
        check("state dir", "ok", f"{lay['state_dir']} on {sd['fstype']} at {sd['mount']}")

    mem = probe.get("memory") or {}
    cg, total = mem.get("cgroup_max") or "", mem.get("total") or ""
    limit = int(cg) if cg.isdigit() and int(cg) < (1 << 60) else None
    if limit is not None:
        cur = mem.get("cgroup_current") or ""
        pct = f", {int(cur) * 100 // limit}% in use" if cur.isdigit() and limit else ""
        check("memory", "ok", f"cgroup limit {limit / 2**30:.1f} GiB{pct}; size DataLoader "
              "workers against this, not the host's RAM")
    else:
        tot = f"{int(total) / 2**30:.1f} GiB" if total.isdigit() else "unknown"
        check("memory", "ok", f"no cgroup memory limit; machine RAM {tot}")

    tools = probe.get("tools") or {}
    check("rsync", "ok" if tools.get("rsync") else "warn",
          "present" if tools.get("rsync") else "missing: gpurun push falls back to tar over SSH")
    if d["detach"] == "tmux":
        check("tmux", "ok" if tools.get("tmux") else "fail",
              "present" if tools.get("tmux") else
              "missing, and this profile detaches with tmux (plain nohup jobs are reported "
              "killed here); install it: apt-get install -y tmux")
    else:
        check("tmux", "ok", "present" if tools.get("tmux") else "not needed (detach: setsid)")
    if not tools.get("setsid"):
        check("setsid", "warn", "missing: the agent falls back to nohup")
    if d["network"].get("proxy_hook") and "network_turbo" in d["network"]["proxy_hook"]:
        ok = (probe.get("files") or {}).get("network_turbo")
        check("proxy hook", "ok" if ok else "warn",
              "/etc/network_turbo present" if ok else
              "/etc/network_turbo missing: downloads may hang without the academic proxy")
    return {"checks": checks, "gpus": gpus, "driver": driver, "cuda": cuda, "tiers": tiers,
            "refusal": refusal}


def _user_file(profile: Profile) -> str:
    from orchestrator import paths

    return str(paths.user_profiles_dir() / f"{profile.name}.yaml")
