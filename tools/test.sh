#!/usr/bin/env bash
# tools/test.sh -- install everything the test tiers need and run them (lint, unit,
# functional, contract against the simulator, integration with a real Slurm and Open MPI).
# Debian 12, as root (the Slurm harness runs slurmd and creates the test users).
#   bash tools/test.sh            everything but the gpu tier
#   bash tools/test.sh -k smoke   extra arguments go to pytest (the oldest-Python run is
#                                 skipped then, unless MPS_MIN_PYTHON=1)
# Before the tests it builds the wheel and sdist (python -m build), checks that both carry the
# Slurm shims, installs the wheel into a fresh environment and runs `mpswrap demo` from it;
# the tests get that wheel as MPS_TEST_WHEEL (tests/integration/test_admin_guide.py).
# After the full run under Debian's python3, the real-Slurm tests run again on Slurm 24.11 (a
# Debian 13 root made with debootstrap: tools/slurm-trixie.sh), and the unit and functional
# tiers run again under the oldest Python that pyproject's requires-python allows (found under
# pyenv or on PATH), in a fresh environment with the wheel's dependencies (the tests import
# the source tree, as the main run does): that is the floor CI tests. No such Python fails the run, unless
# MPS_ALLOW_NO_MIN_PYTHON=1.
# Strict skips: a skip whose reason tests/allowed_skips.txt does not list fails the run, since
# everything the tests need is installed here (MPS_STRICT_SKIPS=0 turns that off).
# The gpu tier runs on a GPU machine: bash tests/gpu/run_gpu_tier.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
VENV=${MPSWRAP_TEST_VENV:-/opt/mpswrap-ci/venv}
log() { echo "tools/test.sh: $*" >&2; }

[ "$(id -u)" = 0 ] || { log "run as root (Slurm harness, test users)"; exit 2; }

PKGS=(python3 python3-venv python3-mpi4py openmpi-bin slurmctld slurmd slurm-client munge
      libpmix-dev libslurm-dev gcc libc6-dev shellcheck util-linux procps passwd patchelf debootstrap)
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
"$VENV/bin/ruff" check mpswrap tests benchmarks examples tools
"$VENV/bin/ruff" format --check mpswrap tests benchmarks examples tools
"$VENV/bin/mypy" mpswrap
shellcheck -x mpswrap/slurm/hook mpswrap/slurm/*.sh tools/*.sh tests/gpu/*.sh \
  tests/integration/cluster/*.sh

log "build: wheel and sdist"
DIST=$(dirname "$VENV")/dist
rm -rf "$DIST"
"$VENV/bin/python" -m pip install -q build
"$VENV/bin/python" -m build --outdir "$DIST" . >"$DIST.log" 2>&1 ||
  { tail -30 "$DIST.log" >&2; log "python -m build failed (log: $DIST.log)"; exit 1; }
WHEEL=$(echo "$DIST"/mpswrap-*.whl) SDIST=$(echo "$DIST"/mpswrap-*.tar.gz)
"$VENV/bin/python" - "$WHEEL" "$SDIST" <<'EOF'
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
need = ["mpswrap/slurm/hook", "mpswrap/slurm/install.sh", "mpswrap/slurm/uninstall.sh",
        "mpswrap/slurm/install.py", "mpswrap/slurm/mpswrap_spank.c", "mpswrap/py.typed"]
in_wheel = set(zipfile.ZipFile(wheel).namelist())
with tarfile.open(sdist) as tar:
    in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
missing = [f"wheel: {n}" for n in need if n not in in_wheel]
missing += ["wheel: LICENSE"] * (not any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel))
missing += [f"sdist: {n}" for n in [*need, "LICENSE"] if n not in in_sdist]
if missing:
    sys.exit("tools/test.sh: missing from the built distributions: " + ", ".join(missing))
EOF
log "built $(basename "$WHEEL") and $(basename "$SDIST"); demo from the wheel in a fresh venv"
WHEEL_VENV=$(dirname "$VENV")/wheel-venv
rm -rf "$WHEEL_VENV"
VENV=$WHEEL_VENV WHEEL=$WHEEL PYTHON=/usr/bin/python3 bash tools/install-and-demo.sh
# Not MPSWRAP_*: mpswrap reads those as settings (and warns about unknown ones).
export MPS_TEST_WHEEL=$WHEEL

# The oldest interpreter requires-python allows: "PATH VERSION", or nothing. pyenv's versions
# and python3.N on PATH; pyenv's shims are skipped (they are scripts that pick a version).
oldest_python() {
  "$VENV/bin/python" - <<'EOF'
import glob, os, re, subprocess, tomllib
from packaging.specifiers import SpecifierSet
with open("pyproject.toml", "rb") as f:
    spec = SpecifierSet(tomllib.load(f)["project"]["requires-python"])
pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
dirs = glob.glob(f"{pyenv}/versions/*/bin") + os.environ.get("PATH", "").split(":")
found = []
for path in (p for d in dirs if "/shims" not in d for p in sorted(glob.glob(f"{d}/python3.*"))):
    if not re.fullmatch(r"python3\.\d+", os.path.basename(path)) or not os.access(path, os.X_OK):
        continue
    code = "import sys; print(*sys.version_info[:3], sep='.')"
    try:
        out = subprocess.run([path, "-c", code], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        continue
    version = out.stdout.strip()
    if out.returncode == 0 and spec.contains(version):
        found.append((tuple(map(int, version.split("."))), path, version))
if found:
    best = min(found, key=lambda f: f[0])
    print(best[1], best[2])
EOF
}

# A copy of PYTHON's installation that other users can run (pyenv's live under /root, 0700,
# and link libpython through an absolute RUNPATH there); prints the copy's interpreter.
world_runnable() {
  local python=$1 prefix copy name rpath
  prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
  case "$prefix" in /|/usr|/usr/local) log "$python cannot be run by other users"; return 1 ;; esac
  name=$(basename "$python") copy=$(dirname "$VENV")/python-$(basename "$prefix")
  rm -rf "$copy"; mkdir -p "$copy"
  tar -C "$prefix" --exclude="./lib/$name/test" --exclude=__pycache__ -cf - . | tar -C "$copy" -xf -
  rpath=$(patchelf --print-rpath "$copy/bin/$name" 2>/dev/null || true)
  # shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader
  if [[ $rpath == "$prefix"* ]]; then patchelf --set-rpath '$ORIGIN/../lib' "$copy/bin/$name"; fi
  chmod -R a+rX "$copy"
  echo "$copy/bin/$name"
}

# The unit and functional tiers under the oldest supported Python, from the built wheel.
min_python_tier() {
  local found python version venv start=$SECONDS
  found=$(oldest_python)
  if [ -z "$found" ]; then
    log "**********************************************************************************"
    log "NO PYTHON SATISFYING requires-python ($(grep -m1 '^requires-python' pyproject.toml))"
    log "found under pyenv or on PATH: the oldest supported Python was NOT tested"
    log "**********************************************************************************"
    [ "${MPS_ALLOW_NO_MIN_PYTHON:-}" = 1 ] && return 0
    log "failing (MPS_ALLOW_NO_MIN_PYTHON=1 lets the run pass without it)"
    return 1
  fi
  read -r python version <<<"$found"
  log "oldest supported Python: $version ($python): unit and functional tiers, the wheel's dependencies"
  if ! runuser -u nobody -- env -i "$python" -c pass 2>/dev/null; then
    python=$(world_runnable "$python") || return 1
    runuser -u nobody -- env -i "$python" -c 'import ssl, sqlite3' ||
      { log "other users cannot run $python"; return 1; }
  fi
  venv=$(dirname "$VENV")/venv-py$version
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # The mpi extra as well: functional tests run session() with mpi4py (a binary wheel; it
  # finds Debian's Open MPI library at run time).
  "$venv/bin/python" -m pip install -q --only-binary mpi4py "${WHEEL}[test,mpi]"
  chmod -R a+rX "$venv"
  local rc=0
  "$venv/bin/python" -m pytest -p no:cacheprovider -m "not gpu and not slurm and not mpi" \
    tests/unit tests/functional || rc=$?
  log "oldest supported Python $version: pytest exited $rc after $((SECONDS - start)) s"
  return $rc
}

log "tests"
export MPS_STRICT_SKIPS=${MPS_STRICT_SKIPS:-1} MPS_ALLOWED_SKIPS=$SRC/tests/allowed_skips.txt
set +e
"$VENV/bin/python" -m pytest -p no:cacheprovider -m "not gpu" "$@"
rc=$?
set -e
[ $rc = 5 ] && { log "pytest collected no tests"; exit 1; }
if [ $# -gt 0 ] && [ "${MPS_MIN_PYTHON:-}" != 1 ]; then
  log "Slurm 24.11 and the oldest supported Python: skipped (pytest arguments given;"
  log "MPS_MIN_PYTHON=1 runs both)"
  exit $rc
fi
# The real-Slurm tests (marker slurm) again on Debian 13's Slurm 24.11, in a chroot beside
# the host's 22.05 (tools/slurm-trixie.sh); after the main run, not beside it: both tiers
# start Slurm clusters and time-sensitive jobs on this machine's few cores.
set +e
start=$SECONDS
WHEEL=$WHEEL bash "$REPO/tools/slurm-trixie.sh" -m slurm tests/integration
next_rc=$?
log "Slurm 24.11 tier: exit $next_rc after $((SECONDS - start)) s"
(set -e; min_python_tier)
min_rc=$?
set -e
for code in $rc $next_rc $min_rc; do [ "$code" != 0 ] && exit "$code"; done
exit 0
