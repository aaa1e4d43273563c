#!/usr/bin/env bash
# run_gpu_tier.sh [PHASE...] -- the gpu tier in one go, on the GPU machine (root, no network).
#
# Sets up what the machine lacks (carried wheels in .whl/, Slurm .debs in .debs/), builds the
# real CUDA test client, runs the chosen phases and writes one log per phase to $OUT (or
# ./gpu-out), and each test phase's junit XML beside its log. Phases: contract core launcher attach ladder session faults slurm share tmpfs probe
# metrics farm trust teardown mpsstart containers container-ranks startup bench farmbench multi multibench torchrun signals (default: contract core). Each phase's log is complete when the
# phase ends, so a visit cut short still brings back every finished phase. signals runs last
# wherever it is named: it kills busy clients by signal (marker harm), which can leave an MPS
# server unable to serve.
# Every test phase runs on a machine of any GPU count and asserts what mpswrap promises for
# that count (tests/gpu/conftest.py: machine_gpus). multi (tests/gpu/test_gpu_multi.py) is the
# machine of several GPUs: on one GPU it is refused (exit 2), so leave it out there.
# multibench (benchmarks/multigpu.py; MULTIBENCH_ARGS, e.g. "--counts 1,2 --repeats 2") writes
# multigpu.json: prolog and epilog for jobs of 1, 2, 4 GPUs, a farm over them against raw MPS.
# PHASE_TIMEOUT (seconds, default 540) bounds each phase but bench; TEST_TIMEOUT (default 300)
# each test, so that a test that hangs is reported (with its stack) before its phase ends;
# PYTEST_ARGS are added to each test phase's pytest (e.g. "-x", "-k block"). The exit code is 1 if any
# phase failed or ran out of time, or a test phase skipped a test (everything a test needs must
# be here). A phase that leaves an MPS daemon, server or CUDA test client running fails, and
# what it left is listed and killed, so that the phases after it start on a clean machine.
# machine.txt names the commit and whether the tree differed from it. The GPU machine gets a
# copy of the tree without .git, so pass them from the checkout:
#   MPS_RESULTS_COMMIT=$(git rev-parse HEAD) \
#   MPS_RESULTS_DIRTY=$(git status --porcelain | grep -q . && echo 1 || echo 0) \
#   bash tests/gpu/run_gpu_tier.sh core
# Never touches the GPU's compute mode, clocks, MIG or persistence settings.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}; mkdir -p "$OUT"
PHASES=("$@"); [ ${#PHASES[@]} -gt 0 ] || PHASES=(contract core)
if [[ " ${PHASES[*]} " == *" signals "* ]]; then  # last: see above
  read -ra PHASES <<<"$(printf '%s\n' "${PHASES[@]}" | grep -vx signals | tr '\n' ' ') signals"
fi
export PYTHONUNBUFFERED=1
# Every skip fails a test phase, none allowed (tests/strict_skips.py).
export MPS_STRICT_SKIPS=1; unset MPS_ALLOWED_SKIPS

revision() {  # "commit: SHA" and "tree: clean|dirty|unknown" lines for machine.txt
  local commit=${MPS_RESULTS_COMMIT:-} dirty=${MPS_RESULTS_DIRTY:-}
  if [ -z "$commit" ] && [ -e "$REPO/.git" ] && command -v git >/dev/null; then
    commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null)
    dirty=$(git -C "$REPO" status --porcelain 2>/dev/null | grep -q . && echo 1 || echo 0)
  fi
  echo "commit: ${commit:-unknown}"
  case $dirty in 0) echo "tree: clean" ;; 1) echo "tree: dirty" ;; *) echo "tree: unknown" ;; esac
}
REVISION=$(revision)
# Open MPI 4 insists on an rsh agent even for one node; there is no ssh on the GPU machine.
export OMPI_MCA_plm_rsh_agent=false
PY=$(command -v python3)

# An unprivileged user must read the code: work from a world-readable copy.
SRC=/opt/mpswrap-src; rm -rf "$SRC"; mkdir -p "$SRC"
cp -a "$REPO"/. "$SRC"/; chmod -R a+rX "$SRC"; cd "$SRC" || exit 1
mkdir -p /opt/mpswrap-site  # also where the CUDA test client is built
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /opt/mpswrap-site .whl/*.whl
  chmod -R a+rX /opt/mpswrap-site
fi
export PYTHONPATH=$SRC:/opt/mpswrap-site
# Bytecode, as an installed package has: without it every Python start compiles mpswrap (and
# the carried wheels, installed --no-compile) again where PYTHONDONTWRITEBYTECODE is set.
"$PY" -m compileall -q "$SRC/mpswrap" /opt/mpswrap-site >/dev/null 2>&1
nvcc -O2 -o /opt/mpswrap-site/cuda_client tests/gpu/cuda_client.cu 2>&1 | tail -3
chmod a+rx /opt/mpswrap-site/cuda_client
export MPS_CONTRACT_CLIENT=/opt/mpswrap-site/cuda_client
# How many GPUs: what the multi phase needs, and what machine.txt says first.
GPUS=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | grep -c .)
{ date -u +%FT%TZ; echo "$REVISION"; echo "gpus: $GPUS"
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,compute_mode \
    --format=csv,noheader
  nvidia-smi topo -m  # which CPUs and NUMA node are near each GPU (the affinity policy)
  "$PY" -c 'import sys,torch,psutil,filelock,mpi4py; print(sys.version.split()[0], torch.__version__, psutil.__version__, filelock.__version__, mpi4py.__version__)'
} | tee "$OUT/machine.txt"

bounded() {  # a phase that hangs fails, and the phases after it still run
  timeout "${PHASE_TIMEOUT:-540}" "$@"
}
pt() {  # pt NAME ARGS... : one pytest run with its own log, junit XML and slowest tests
  local name=$1; shift
  local extra; read -ra extra <<<"${PYTEST_ARGS:-}"
  # pyproject's strictness kept (filterwarnings = error is not an addopt); -rA reports all.
  bounded "$PY" -m pytest -p no:cacheprovider \
    -o addopts="--strict-markers --strict-config" -o timeout="${TEST_TIMEOUT:-300}" -rA \
    --junitxml="$OUT/$name.xml" --durations=10 --durations-min=1 \
    "${extra[@]}" "$@" 2>&1 | tee "$OUT/$name.log" | tail -15
}
torch_bytecode() {  # PyTorch's bytecode, as an installed one has: the benchmarks' tasks import it
  # Without it each task's import compiles torch again (14-16 s a task alone on 2026-11-24,
  # where PYTHONDONTWRITEBYTECODE is set).
  local torch_dir
  torch_dir=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  "$PY" -m compileall -q -j 0 "$torch_dir" >/dev/null 2>&1
}
# The MPS programs and the CUDA test client themselves (not a shell naming them).
LEFT='^([^ ]*/)?(nvidia-cuda-mps-(control|server)|cuda_client)( |$)'
left_behind() {  # left_behind PHASE: fails, listing and killing them, if MPS processes remain
  local left
  for _ in $(seq 50); do pgrep -f "$LEFT" >/dev/null || return 0; sleep 0.2; done
  left=$(pgrep -fa "$LEFT" | tr '\n' ';')
  echo "phase $1 left MPS processes behind (killed now): $left"
  pkill -9 -f "$LEFT"
  return 1
}
rc=0
for phase in "${PHASES[@]}"; do
  echo "=== phase $phase"
  case $phase in
    contract) MPS_CONTRACT_BACKEND=real pt contract -m "not harm" tests/contract || rc=1 ;;
    core) pt core tests/gpu/test_gpu_core.py || rc=1 ;;
    launcher) pt launcher tests/gpu/test_gpu_launcher.py || rc=1 ;;
    attach) pt attach tests/gpu/test_gpu_attach.py || rc=1 ;;
    ladder) pt ladder tests/gpu/test_gpu_teardown.py || rc=1 ;;
    session) pt session tests/gpu/test_gpu_session.py || rc=1 ;;
    slurm) pt slurm tests/gpu/test_gpu_slurm.py || rc=1 ;;
    share) pt share tests/gpu/test_gpu_slurm_share.py || rc=1 ;;
    tmpfs) pt tmpfs tests/gpu/test_gpu_slurm_tmpfs.py || rc=1 ;;
    faults) pt faults tests/gpu/test_gpu_faults.py || rc=1 ;;
    metrics) pt metrics tests/gpu/test_gpu_metrics.py || rc=1 ;;
    farm) pt farm tests/gpu/test_gpu_farm.py || rc=1 ;;
    trust) pt trust tests/gpu/test_gpu_trust.py || rc=1 ;;
    torchrun) pt torchrun tests/gpu/test_gpu_torchrun.py || rc=1 ;;
    farmbench) read -ra farm_args <<<"${FARM_ARGS:-}"  # e.g. FARM_ARGS="--quick", "--parts memory"
      torch_bytecode
      "$PY" benchmarks/farm_bench.py --out "$OUT/farm.json" "${farm_args[@]}" || rc=1 ;;
    multi) if [ "$GPUS" -lt 2 ]; then
        echo "phase multi needs 2 GPUs or more; this machine has $GPUS: leave it out"; rc=2
      else pt multi tests/gpu/test_gpu_multi.py || rc=1; fi ;;
    multibench) read -ra multi_args <<<"${MULTIBENCH_ARGS:-}"
      torch_bytecode
      bounded "$PY" benchmarks/multigpu.py --out "$OUT/multigpu.json" "${multi_args[@]}" || rc=1 ;;
    probe) bounded bash tests/gpu/probe_mps.sh "$OUT/probe" >/dev/null 2>&1 || rc=1
      tail -40 "$OUT/probe/probe.txt" ;;
    containers) bounded bash tests/gpu/probe_containers.sh "$OUT/probe" >/dev/null 2>&1 || rc=1
      cat "$OUT/probe/containers.txt" ;;
    container-ranks) bounded bash tests/gpu/probe_container_ranks.sh "$OUT/probe" >/dev/null 2>&1 ||
        rc=1
      grep -E '^(RESULT|===)' "$OUT/probe/container-ranks.txt" ;;
    teardown) bounded bash tests/gpu/probe_teardown.sh "$OUT/probe" >/dev/null 2>&1 || rc=1
      cat "$OUT/probe/teardown.txt" ;;
    mpsstart) bounded bash tests/gpu/probe_mps_start.sh "$OUT/probe" >/dev/null 2>&1 || rc=1
      cat "$OUT/probe/mps-start.txt" ;;
    startup) bounded bash tests/gpu/startup_costs.sh "$PY" >"$OUT/startup.txt" 2>&1 || rc=1
      tail -25 "$OUT/startup.txt" ;;
    bench) read -ra bench_args <<<"${BENCH_ARGS:-}"  # e.g. BENCH_ARGS="--ns 12 --repeats 1"
      "$PY" benchmarks/run.py --out "$OUT/bench.json" "${bench_args[@]}" || rc=1 ;;
    signals) MPS_CONTRACT_BACKEND=real pt signals -m "gpu or harm" tests/gpu/test_gpu_signals.py \
        tests/contract || rc=1 ;;  # the supervisor's test first, on a GPU nothing has harmed
    *) echo "unknown phase $phase"; rc=2 ;;
  esac
  left_behind "$phase" || rc=1
done
exit $rc
