#!/usr/bin/env bash
# The test command of the README: installs what the suite needs, then runs it.
# Needs: OpenSSH server + client and rsync (the SSH tests start a real sshd on loopback),
# Slurm and munge (a one-node cluster for the Slurm tests), and the Python test extras.
# Safe to run again; installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need_apt+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
# the Slurm tests run a one-node cluster (tests/rigs/slurm.py)
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need_apt+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need_apt+=(munge)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# the test extra also brings the optional features' packages (gpurun[s3], gpurun[plot]) so they are tested
"$PY" -m pip install -q -e ".[test]"
exec "$PY" -m pytest -q "$@"
