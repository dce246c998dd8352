#!/usr/bin/env bash
# Real-GPU checks, for a machine with an NVIDIA GPU: the gpu-marked tests, the health verdict
# through the CLI, and the reaper against a real torch process holding VRAM outside any job.
# Usage: bash scripts/gpu-check.sh [OUTDIR]   (run from the repo root; needs torch for the VRAM holder)
set -uo pipefail
OUT=${1:-/tmp/gpurun-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export XDG_DATA_HOME=$OUT/data XDG_CONFIG_HOME=$OUT/cfg
G="python3 -m orchestrator.cli"
nvidia-smi -L | tee "$OUT/nvidia-smi.txt"
python3 -m pytest -m gpu -v -s tests/health/test_gpu_real.py 2>&1 | tee "$OUT/pytest-gpu.txt"
echo "== gpurun gpu --json"; $G gpu --json | tee "$OUT/gpu.json"; echo "exit=$?"
echo "== gpurun gpu"; $G gpu
# a VRAM holder that is not a gpurun job: 8 GiB allocated, then it sleeps
python3 -c "
import torch, time, os
x = torch.empty(8 * 1024**3, dtype=torch.uint8, device='cuda')
open('$OUT/holder.pid', 'w').write(str(os.getpid()))
time.sleep(600)
" &
for i in $(seq 1 60); do [ -f "$OUT/holder.pid" ] && break; sleep 1; done
sleep 2
echo "== nvidia-smi with the holder"; nvidia-smi --query-gpu=memory.used --format=csv | tee "$OUT/mem-before.txt"
echo "== gpurun reap --min-age 0 --json (dry run)"; $G reap --min-age 0 --json | tee "$OUT/reap-plan.json"
echo "holder pid: $(cat $OUT/holder.pid)"
kill -0 "$(cat $OUT/holder.pid)" && echo "holder still alive after dry run (expected)"
echo "== gpurun reap --min-age 0 --kill --grace 5 --json"; $G reap --min-age 0 --kill --grace 5 --json | tee "$OUT/reap-kill.json"
sleep 3
kill -0 "$(cat $OUT/holder.pid)" 2>/dev/null && echo "holder STILL ALIVE (unexpected)" || echo "holder gone after --kill"
echo "== nvidia-smi after reaping"; nvidia-smi --query-gpu=memory.used --format=csv | tee "$OUT/mem-after.txt"
# a queue job on the real GPU: CUDA_VISIBLE_DEVICES set by the agent, never reaped
printf '[name=gpu-job] python3 -c "import os,torch,time; x=torch.ones(1<<28,device=\\"cuda\\"); print(\\"cvd\\", os.environ[\\"CUDA_VISIBLE_DEVICES\\"], float(x.sum())); time.sleep(8)"\n' > "$OUT/q.txt"
$G queue submit "$OUT/q.txt"
sleep 5
echo "== reap while a live job holds the GPU (must not list it)"; $G reap --min-age 0 --json | tee "$OUT/reap-live-job.json"
echo "== watch --once --json"; $G watch --once --json | tee "$OUT/watch.json"
$G queue submit "$OUT/q.txt" --wait --json | tee "$OUT/job.json"
$G queue logs gpu-job
