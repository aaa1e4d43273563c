#!/usr/bin/env bash
# run_local.sh [N] -- `mpswrap run -n N` on this machine, with MPS.
#
# With an NVIDIA GPU and nvidia-cuda-mps-control: N copies of a small PyTorch client share
# the GPU(s) through MPS. Without them (or with SIMULATE=1): the same with mpswrap's MPS
# simulator and a fake 2-GPU inventory, so it runs anywhere Python runs. Either way mpswrap
# starts the daemons, attaches every rank, checks attachment, and stops everything at the end.
set -euo pipefail
N=${1:-4}
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

if [ "${SIMULATE:-0}" != 1 ] && command -v nvidia-cuda-mps-control >/dev/null \
    && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "== real GPU: $N PyTorch ranks through MPS"
  program=("$PY" -c '
import os, torch
x = torch.randn(2048, 2048, device="cuda")
for _ in range(200):
    x = torch.tanh(x @ x / 2048)
torch.cuda.synchronize()
print("rank", os.environ["MPSWRAP_RANK"], "on", os.environ["CUDA_VISIBLE_DEVICES"], "ok")')
else
  echo "== simulated MPS: $N ranks on 2 fake GPUs"
  SIM=$(mktemp -d /tmp/mpswrap-example.XXXX)
  trap 'rm -rf "$SIM"' EXIT
  "$PY" -m mpswrap.sim install-bin "$SIM/bin" >/dev/null
  "$PY" -m mpswrap.sim inventory "$SIM/gpus.json" --gpus 2 >/dev/null
  export MPSWRAP_CONTROL_BINARY=$SIM/bin/nvidia-cuda-mps-control
  export MPSWRAP_GPU_INVENTORY=$SIM/gpus.json
  export MPSWRAP_USER_RUN_DIR=$SIM/run
  program=("$SIM/bin/mps-sim-client" --seconds 1)
fi

# What each rank would get, without starting anything:
"$PY" -m mpswrap run -n "$N" --dry-run --threads uniform -- "${program[@]}"
# The run itself: every rank must become an MPS client within 30 s, or the run fails (69).
rc=0
"$PY" -m mpswrap run -n "$N" --threads uniform --verify-attach fail -- "${program[@]}" || rc=$?
echo "== exit code $rc (the daemons are stopped: nothing is left)"
exit $rc
