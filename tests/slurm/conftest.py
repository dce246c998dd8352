"""Fixtures for the Slurm tests: the machine's one-node cluster and an SSH login to it.

``slurm_cluster`` (session) is the running ``rigs.slurm.SlurmRig``; it skips when Slurm is not
installed (or not root), and fails instead when ``GPURUN_REQUIRE_SLURM`` is set (CI).
``slurm_ssh_host`` is an inventory entry ``cluster`` (profile ``slurm``) for the sshd rig's
clean user, who can ``sbatch`` on the cluster; ``slurm_user_dir`` a fresh dir that user owns.
The cluster is shared with other test processes on the machine: find jobs by id.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigs.slurm import SlurmRig, slurm_available
from rigs.sshd import CLEAN_USER, SshdRig

SLURM_USER = CLEAN_USER


@pytest.fixture(scope="session")
def slurm_cluster(sshd_rig: SshdRig):
    """The one-node cluster, idle and ready (started, or joined if another process runs it).

    Depends on the sshd rig so that its users (who submit over SSH) exist first."""
    why = slurm_available()
    if why:
        if os.environ.get("GPURUN_REQUIRE_SLURM"):
            pytest.fail(f"GPURUN_REQUIRE_SLURM is set but {why}")
        pytest.skip(why)
    rig = SlurmRig()
    rig.start()
    yield rig
    rig.close()


@pytest.fixture
def slurm_user_dir(sshd: SshdRig, slurm_cluster: SlurmRig) -> Path:
    """A fresh directory in the Slurm user's home, owned by that user."""
    return sshd.user_dir(SLURM_USER, "slurm")


@pytest.fixture
def slurm_ssh_host(sshd: SshdRig, isolated_home: Path, slurm_cluster: SlurmRig) -> dict:
    """Inventory entry ``cluster``: profile ``slurm`` over the loopback sshd as the clean user
    (fresh state dir and workdir in that user's home), host key trusted, and registered in the
    inventory of the isolated home."""
    from orchestrator import hosts, paths

    entry = sshd.host_entry(SLURM_USER, name="cluster")
    entry["profile"] = "slurm"
    sshd.trust(paths.data_home() / "known_hosts")
    hosts.add_host(entry)
    return entry
