#!/usr/bin/env bash
# compare_trees.sh BASE -- two mpswrap trees side by side on the GPU machine, in one visit:
# the prolog, the epilog and the per-rank supervisor's start (benchmarks/startup_ab.py --gpu:
# both trees each round, the order alternating), then the 48-client teardown
# (tests/gpu/test_gpu_teardown.py) of BASE and of this tree, one after the other.
# The start-up is measured twice: with mpswrap's own venv of the machine's /usr/bin/python3
# holding only its dependencies (the carried wheels in .whl/), as slurm/README.md installs it
# (startup-ab.json), and with the PyTorch venv's python3, whose site-packages run PyTorch's
# .pth start-up hooks in every interpreter (startup-ab-torchpy.json).
# Run after run_gpu_tier.sh (its setup: the carried wheels in /opt/mpswrap-site, the CUDA
# test client). Writes those and teardown-<tree>.log to $OUT (or ./gpu-out).
# Touches no GPU setting (compute mode, clocks, MIG, persistence stay as they are).
set -uo pipefail
BASE=$(cd "${1:?usage: compare_trees.sh BASE}" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}; mkdir -p "$OUT"
PY=$(command -v python3)
export PYTHONPATH=/opt/mpswrap-site MPS_CONTRACT_CLIENT=/opt/mpswrap-site/cuda_client
export OMPI_MCA_plm_rsh_agent=false MPS_STRICT_SKIPS=1
# Readable by the test user, bytecode compiled, as an installed package has it.
for tree in "$BASE" "$REPO"; do chmod -R a+rX "$tree"; "$PY" -m compileall -q "$tree/mpswrap" >/dev/null; done
rc=0
# mpswrap's own environment, as an admin makes it: python3 -m venv, then its dependencies.
VENV=/opt/mpswrap-venv
if [ ! -x "$VENV/bin/python" ] && /usr/bin/python3 -m venv --without-pip "$VENV"; then
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$PY" -m pip install -q --no-index --no-deps --target "$site" "$REPO"/.whl/*.whl || rc=1
  "$VENV/bin/python" -m compileall -q "$site" >/dev/null; chmod -R a+rX "$VENV"
fi
"$VENV/bin/python" -c 'import psutil, filelock, pynvml' || { echo "no mpswrap venv"; rc=1; }
# Each tree's package on the machine's own disk, where an admin's venv is: the working copy
# this script runs from may sit on a slower file system (fs.txt says which), and a Python start
# opens some 150 files.
AB=/opt/mpswrap-ab; rm -rf "$AB"
for tree in "$BASE" "$REPO"; do
  mkdir -p "$AB/$(basename "$tree")"; cp -a "$tree/mpswrap" "$AB/$(basename "$tree")/"
done
chmod -R a+rX "$AB"
for dir in "$REPO" "$BASE" "$AB" "$VENV"; do
  echo "$dir: $(stat -f -c %T "$dir") $(df -P "$dir" | awk 'NR == 2 { print $1 }')"
done >"$OUT/fs.txt"
for run in "$VENV/bin/python startup-ab.json" "$PY startup-ab-torchpy.json"; do
  read -r py out <<<"$run"
  for tree in "$BASE" "$REPO"; do
    "$py" -m compileall -q "$AB/$(basename "$tree")/mpswrap" >/dev/null
  done
  echo "=== startup with $py: $BASE against $REPO (copies in $AB)"
  "$PY" "$REPO/benchmarks/startup_ab.py" "$AB/$(basename "$BASE")" "$AB/$(basename "$REPO")" \
    --gpu --rounds "${AB_ROUNDS:-4}" --python "$py" --out "$OUT/$out" 2>&1 | tail -4 || rc=1
done
# What each tree's supervisor does before its program's spawn, profiled.
"$VENV/bin/python" "$REPO/benchmarks/start_trace.py" "$AB/$(basename "$BASE")" \
  "$AB/$(basename "$REPO")" --gpu --python "$VENV/bin/python" \
  >"$OUT/start-trace.txt" 2>&1 || rc=1
# Where the venv's start goes, with this tree from the machine's disk.
PYTHONPATH=$AB/$(basename "$REPO") bash "$REPO/tests/gpu/startup_costs.sh" "$VENV/bin/python" \
  >"$OUT/startup-venv.txt" 2>&1 || rc=1
for tree in "$BASE" "$REPO"; do
  name=$(basename "$tree")
  echo "=== teardown of 48 clients: $tree"
  (cd "$tree" && PYTHONPATH=$tree:/opt/mpswrap-site timeout "${PHASE_TIMEOUT:-540}" \
    "$PY" -m pytest -p no:cacheprovider -o addopts="--strict-markers" -rA -s \
    tests/gpu/test_gpu_teardown.py) >"$OUT/teardown-$name.log" 2>&1 || rc=1
  grep -E "teardown|passed|failed" "$OUT/teardown-$name.log" | tail -6
done
exit $rc
