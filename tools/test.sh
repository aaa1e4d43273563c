#!/usr/bin/env bash
# tools/test.sh -- install everything the tests need, then run every test once, in the tier
# where it means something. Debian 12, as root (the Slurm harness runs slurmd and creates
# the test users).
#   bash tools/test.sh            every tier but the gpu one
#   bash tools/test.sh -k smoke   one pytest run of those arguments under Debian's python3,
#                                 from the tree (no tiers)
# Stages, in order; each tier's line (tests, seconds) is printed again at the end:
#   lint      ruff, mypy (mpswrap, tests, benchmarks), shellcheck, and the SPANK plugin built
#             by install.sh (-Wall -Wextra -Werror, its compiler output shown)
#   build     the wheel and sdist (checked for the Slurm shims); the tiers below use that wheel
#   python    unit, functional and contract tests under the oldest Python that pyproject's
#             requires-python allows (found under pyenv or on PATH; none fails the run unless
#             MPS_ALLOW_NO_MIN_PYTHON=1), with mpswrap installed from the wheel into a fresh
#             venv and the tests run from a copy of the tree without its package, so nothing
#             imports the source; in parallel (pytest-xdist, MPS_TEST_WORKERS, default 4: the
#             tests mostly wait on processes)
#   slurm     the real-Slurm and Open MPI tests (markers slurm, mpi) on Debian 12's Slurm 22.05,
#             Debian's python3 and mpi4py; one cluster, one process
#   slurm-24.11  the tests that depend on the Slurm version (marker slurm_version: hooks,
#             SPANK, gres/mps shares, the admin guide, the load test with MPS_LOAD_JOBS=5) on
#             Debian 13's Slurm 24.11, in a Debian 13 root kept between runs
#             (tools/slurm-trixie.sh)
# Every pytest call writes junit XML and its slowest tests (--durations) to REPORTS
# (default /opt/mpswrap-ci/reports). A failing tier fails the run; the later tiers still run.
# Strict skips: a skip whose reason tests/allowed_skips.txt does not list fails the run, since
# everything the tests need is installed here (MPS_STRICT_SKIPS=0 turns that off).
# The gpu tier runs on a GPU machine: bash tests/gpu/run_gpu_tier.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
VENV=${MPSWRAP_TEST_VENV:-/opt/mpswrap-ci/venv}
log() { echo "tools/test.sh: $*" >&2; }

[ "$(id -u)" = 0 ] || { log "run as root (Slurm harness, test users)"; exit 2; }

PKGS=(python3 python3-venv python3-mpi4py openmpi-bin slurmctld slurmd slurm-client munge
      libpmix-dev libslurm-dev gcc libc6-dev shellcheck util-linux procps passwd patchelf debootstrap
      prometheus environment-modules man-db groff-base podman crun uidmap bubblewrap systemd)
# promtool checks the metrics; modules: the admin guide's module; man: the man page renders;
# systemd: systemd-analyze checks the metrics timer of docs/howto-metrics.md;
# podman, crun, uidmap, bubblewrap: containerised ranks (tests/containers.py)
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

CI_DIR=$(dirname "$VENV")
REPORTS=${REPORTS:-$CI_DIR/reports}
rm -rf "$REPORTS"; mkdir -p "$REPORTS"
STAGES=$REPORTS/stages.txt  # one line per stage: what ran, seconds
# Not MPSWRAP_*: mpswrap reads those as settings (and warns about unknown ones).
export MPS_STRICT_SKIPS=${MPS_STRICT_SKIPS:-1} MPS_ALLOWED_SKIPS=$SRC/tests/allowed_skips.txt

# A stage's line: NAME, its start ($SECONDS), its exit code, and its junit XML if it ran tests.
record() {
  local name=$1 start=$2 rc=$3 xml=${4:-} counts=""
  if [ -n "$xml" ] && [ -r "$xml" ]; then
    counts=$("$VENV/bin/python" - "$xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
bad = n["failures"] + n["errors"]
print(f"{n['tests']} tests ({n['tests'] - bad - n['skipped']} passed, {bad} failed, "
      f"{n['skipped']} skipped)")
EOF
    ) || counts="no readable junit XML"
  fi
  local line="$name: ${counts:+$counts, }$((SECONDS - start)) s${rc:+, exit $rc}"
  echo "$line" >>"$STAGES"
  log "$line"
}
# pytest's own arguments for a tier: its junit XML and slowest tests in REPORTS.
report_args() { echo "-p no:cacheprovider --junitxml=$REPORTS/$1.xml --durations=25 --durations-min=1"; }

if [ $# -gt 0 ]; then
  log "pytest $* (Debian's python3, this tree; no tiers)"
  set +e
  # shellcheck disable=SC2046  # report_args is a list of words
  "$VENV/bin/python" -m pytest $(report_args adhoc) -m "not gpu" "$@"
  rc=$?
  [ $rc = 5 ] && log "pytest collected no tests"
  exit $rc
fi

start=$SECONDS
log "lint"
"$VENV/bin/ruff" check mpswrap tests benchmarks examples tools
"$VENV/bin/ruff" format --check mpswrap tests benchmarks examples tools
"$VENV/bin/mypy"  # pyproject's files: mpswrap, tests, benchmarks; strict
shellcheck -x mpswrap/slurm/hook mpswrap/slurm/*.sh tools/*.sh tests/gpu/*.sh \
  tests/integration/cluster/*.sh
# The SPANK plugin as install.sh builds it (-Wall -Wextra -Werror), against this Slurm's spank.h.
spank=$(mktemp -d)
bash mpswrap/slurm/install.sh --spank --python "$VENV/bin/python" --config /etc/mpswrap/mpswrap.conf \
  --dest "$spank/hooks" 2>&1 | grep -E "^install.sh: (cc|gcc|built)|: (warning|error|note)" >&2 ||
  { rm -rf "$spank"; log "the SPANK plugin did not build"; exit 1; }
rm -rf "$spank"
record lint "$start" ""

start=$SECONDS
log "build: wheel and sdist"
DIST=$CI_DIR/dist
rm -rf "$DIST"
"$VENV/bin/python" -m pip install -q build
"$VENV/bin/python" -m build --outdir "$DIST" . >"$DIST.log" 2>&1 ||
  { tail -30 "$DIST.log" >&2; log "python -m build failed (log: $DIST.log)"; exit 1; }
WHEEL=$(echo "$DIST"/mpswrap-*.whl) SDIST=$(echo "$DIST"/mpswrap-*.tar.gz)
"$VENV/bin/python" - "$WHEEL" "$SDIST" <<'EOF'
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
need = ["mpswrap/slurm/hook", "mpswrap/slurm/install.sh", "mpswrap/slurm/uninstall.sh",
        "mpswrap/slurm/install.py", "mpswrap/slurm/mpswrap_spank.c", "mpswrap/py.typed",
        "mpswrap/cli/mpswrap.1", "mpswrap/cli/mpswrap.bash"]
in_wheel = set(zipfile.ZipFile(wheel).namelist())
with tarfile.open(sdist) as tar:
    in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
missing = [f"wheel: {n}" for n in need if n not in in_wheel]
missing += ["wheel: LICENSE"] * (not any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel))
# The man page and completion where an installation puts them (pyproject's data-files).
for data in ("share/man/man1/mpswrap.1", "share/bash-completion/completions/mpswrap.bash"):
    missing += [f"wheel: {data}"] * (not any(n.endswith(f".data/data/{data}") for n in in_wheel))
missing += [f"sdist: {n}" for n in [*need, "LICENSE"] if n not in in_sdist]
if missing:
    sys.exit("tools/test.sh: missing from the built distributions: " + ", ".join(missing))
EOF
log "built $(basename "$WHEEL") and $(basename "$SDIST")"
export MPS_TEST_WHEEL=$WHEEL  # tests/integration/test_admin_guide.py installs it
record build "$start" ""

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

# Unit, functional and contract tests under the oldest supported Python, mpswrap from the
# wheel: a fresh venv, and a copy of the tree without mpswrap/ to run them from.
python_tier() {
  local found python version venv tree start=$SECONDS rc=0
  found=$(oldest_python)
  if [ -z "$found" ]; then
    log "**********************************************************************************"
    log "NO PYTHON SATISFYING requires-python ($(grep -m1 '^requires-python' pyproject.toml))"
    log "found under pyenv or on PATH: the unit, functional and contract tests did NOT run"
    log "**********************************************************************************"
    [ "${MPS_ALLOW_NO_MIN_PYTHON:-}" = 1 ] && return 0
    log "failing (MPS_ALLOW_NO_MIN_PYTHON=1 lets the run pass without it)"
    return 1
  fi
  read -r python version <<<"$found"
  if ! runuser -u nobody -- env -i "$python" -c pass 2>/dev/null; then
    python=$(world_runnable "$python") || return 1
    runuser -u nobody -- env -i "$python" -c 'import ssl, sqlite3' ||
      { log "other users cannot run $python"; return 1; }
  fi
  venv=$CI_DIR/venv-py$version tree=$CI_DIR/tree-without-package
  rm -rf "$venv" "$tree"
  "$python" -m venv "$venv"
  # The mpi extra as well: functional tests run session() with mpi4py (a binary wheel; it
  # finds Debian's Open MPI library at run time).
  "$venv/bin/python" -m pip install -q --only-binary mpi4py "${WHEEL}[test,mpi]"
  mkdir -p "$tree"
  tar -C "$SRC" --exclude=./mpswrap --exclude=./.git --exclude=__pycache__ -cf - . | tar -C "$tree" -xf -
  chmod -R a+rX "$venv" "$tree"
  local where
  where=$(cd "$tree" && "$venv/bin/python" -c 'import mpswrap; print(mpswrap.__file__)')
  case "$where" in "$venv"/*) ;; *) log "mpswrap imports from $where, not the wheel"; return 1 ;; esac
  log "python: Python $version, mpswrap from $(basename "$WHEEL"), ${MPS_TEST_WORKERS:-4} workers"
  # shellcheck disable=SC2046  # report_args is a list of words
  (cd "$tree" && "$venv/bin/python" -m pytest $(report_args python) -n "${MPS_TEST_WORKERS:-4}" \
    -m "not gpu and not slurm and not mpi" tests/unit tests/functional tests/contract) || rc=$?
  record "python (unit, functional, contract; Python $version, from the wheel)" "$start" $rc \
    "$REPORTS/python.xml"
  return $rc
}

rcs=()
set +e
(set -e; python_tier)
rcs+=("$?")

start=$SECONDS
log "slurm: real Slurm 22.05 and Open MPI ($("$VENV/bin/python" -V))"
# shellcheck disable=SC2046  # report_args is a list of words
"$VENV/bin/python" -m pytest $(report_args slurm) -m "not gpu and (slurm or mpi)"
rc=$?
record "slurm (Slurm $(dpkg-query -W -f='${Version}' slurmd | cut -d- -f1), Open MPI; $("$VENV/bin/python" -V))" \
  "$start" $rc "$REPORTS/slurm.xml"
rcs+=("$rc")

# After the 22.05 tier, not beside it: both start Slurm clusters and time-sensitive jobs on
# this machine's few cores.
start=$SECONDS
WHEEL=$WHEEL REPORT=$REPORTS/slurm-24.11.xml MPS_LOAD_JOBS=5 bash "$REPO/tools/slurm-trixie.sh" \
  --durations=25 --durations-min=1 -m slurm_version tests/integration
rc=$?
record "slurm-24.11 (the Slurm-version tests on Slurm 24.11)" "$start" $rc "$REPORTS/slurm-24.11.xml"
rcs+=("$rc")
set -e

log "---------------------------------------------------------------------------------------"
while read -r line; do log "$line"; done <"$STAGES"
log "reports (junit XML, slowest tests): $REPORTS; all stages: $SECONDS s"
for code in "${rcs[@]}"; do
  [ "$code" = 5 ] && { log "a tier collected no tests"; exit 1; }
  [ "$code" != 0 ] && exit "$code"
done
exit 0
