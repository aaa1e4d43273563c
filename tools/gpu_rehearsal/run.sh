#!/usr/bin/env bash
# tools/gpu_rehearsal/run.sh NGPUS [PYTEST ARGS...] -- the GPU tier's tests against the MPS
# simulator on NGPUS simulated GPUs, before a visit to a GPU machine: what a test assumes of
# mpswrap's output, files and layout is checked here, not what the driver does. A rehearsal,
# not a tier: a pass says nothing about the real GPU, a failure often says the test is wrong.
#   bash tools/gpu_rehearsal/run.sh 4 tests/gpu/test_gpu_multi.py -k "not session"
# Stand-ins (this folder): nvidia_smi.py (the GPUs of the simulated inventory; each running
# simulated client as a compute process on the GPUs of its CUDA_VISIBLE_DEVICES, with its
# memory from the simulator's ledger), torch/ (enough of PyTorch for the multi phase's probe,
# whose process becomes a simulated client), plugin.py (the simulator in every test's
# environment, also after tests/conftest.py clears MPSWRAP_*). Tests that run real PyTorch
# work (core, attach, session, trust), real Slurm or MPI timings are not rehearsed. Where
# the simulator is slower than a GPU, REHEARSE_WINDOW (terminate_window, s) may need 10.
set -euo pipefail
n=${1:?usage: run.sh NGPUS [PYTEST ARGS...]}; shift
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-$(command -v python3)}  # with the test dependencies (pytest, psutil, ...)
ROOT=$(mktemp -d /tmp/mpsw-rehearse.XXXX); chmod 755 "$ROOT"
trap 'rm -rf "$ROOT"' EXIT
PYTHONPATH=$REPO "$PY" -m mpswrap.sim install-bin "$ROOT/bin" >/dev/null
PYTHONPATH=$REPO "$PY" -m mpswrap.sim inventory "$ROOT/gpus.json" --gpus "$n" >/dev/null
mkdir -m 1777 "$ROOT/gpus.json.mem"  # the simulated GPUs' memory, written by every user
printf '#!/bin/sh\nexec %s %s "$@"\n' "$PY" "$HERE/nvidia_smi.py" >"$ROOT/bin/nvidia-smi"
# The real test client prints its CUDA errors on stdout.
printf '#!/bin/sh\nexec %s "$@" 2>&1\n' "$ROOT/bin/mps-sim-client" >"$ROOT/bin/cuda-client"
chmod 755 "$ROOT/bin/nvidia-smi" "$ROOT/bin/cuda-client"
export PATH=$ROOT/bin:$PATH MPSWRAP_GPU_INVENTORY=$ROOT/gpus.json REHEARSE_BIN=$ROOT/bin
export MPS_CONTRACT_CLIENT=$ROOT/bin/cuda-client MPS_BENCH_WORKER=stand-in
export PYTHONPATH=$REPO:$HERE OMPI_MCA_plm_rsh_agent=false
cd "$REPO"
"$PY" -m pytest -p no:cacheprovider -p plugin -o addopts="--strict-markers" -o timeout=300 \
  -rA "$@"
