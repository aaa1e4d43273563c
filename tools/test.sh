#!/usr/bin/env bash
# tools/test.sh -- install everything the test tiers need and run them (lint, unit,
# functional, contract against the simulator, integration with a real Slurm and Open MPI).
# Debian 12, as root (the Slurm harness runs slurmd and creates the test users).
#   bash tools/test.sh            everything but the gpu tier
#   bash tools/test.sh -k smoke   extra arguments go to pytest
# Strict skips: a skip whose reason tests/allowed_skips.txt does not list fails the run, since
# everything the tests need is installed here (MPS_STRICT_SKIPS=0 turns that off).
# The gpu tier runs on a GPU machine: bash tests/gpu/run_gpu_tier.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
VENV=${MPSWRAP_TEST_VENV:-/opt/mpswrap-ci/venv}
log() { echo "tools/test.sh: $*" >&2; }

[ "$(id -u)" = 0 ] || { log "run as root (Slurm harness, test users)"; exit 2; }

PKGS=(python3 python3-venv python3-mpi4py openmpi-bin slurmctld slurmd slurm-client munge
      libpmix-dev shellcheck util-linux procps passwd)
missing=()
for p in "${PKGS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# Non-root job users must read the code they run: work from a world-readable copy if needed.
SRC=$REPO
if ! runuser -u nobody -- test -r "$REPO/mpswrap/__init__.py" 2>/dev/null; then
  SRC=/opt/mpswrap-ci/src
  log "repository not readable by other users: testing a copy in $SRC"
  rm -rf "$SRC"; mkdir -p "$SRC"; cp -a "$REPO"/. "$SRC"/; chmod -R a+rX "$SRC"
fi
cd "$SRC"

# Debian's python3 (3.11 on Debian 12) with its Open MPI build of mpi4py; world-readable.
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q "${SRC}[test,lint]"
chmod -R a+rX "$(dirname "$VENV")"

log "lint"
"$VENV/bin/ruff" check mpswrap tests benchmarks examples
"$VENV/bin/ruff" format --check mpswrap tests benchmarks examples
"$VENV/bin/mypy" mpswrap
shellcheck -x slurm/hook slurm/*.sh tools/*.sh tests/gpu/*.sh \
  tests/integration/cluster/*.sh

log "tests"
export MPS_STRICT_SKIPS=${MPS_STRICT_SKIPS:-1} MPS_ALLOWED_SKIPS=$SRC/tests/allowed_skips.txt
set +e
"$VENV/bin/python" -m pytest -p no:cacheprovider -m "not gpu" "$@"
rc=$?
set -e
[ $rc = 5 ] && { log "pytest collected no tests"; exit 1; }
exit $rc
