#!/usr/bin/env bash
# tools/slurm-trixie.sh -- the real-Slurm integration tier on Debian 13's Slurm (24.11),
# beside the host's Debian 12 Slurm (22.05), on the same machine.
#
#   bash tools/slurm-trixie.sh [PYTEST ARGS]      default: tests/integration
#
# A Debian 13 root is made with debootstrap under ROOT (default /opt/mpswrap-ci/trixie) and
# kept for the next run; Slurm 24.11, munge, Python 3.13, Open MPI and mpi4py are installed
# into it with apt, so the host's packages are never touched. The repository is copied in,
# installed into a venv there, and pytest runs chrooted, with the kernel's /proc, /sys
# (cgroups) and /dev bound in, in a mount namespace of the script's own (the host never sees
# those mounts; they go with the namespace). Its clusters search for free ports from 7817, so
# they never take the host tier's ports.
# The root is kept under a key of its package list (ROOT/.mpswrap-pkgs): a second run on the
# same machine reuses it and says so; a changed list brings the packages up to it.
# Debian 12, as root. Env: ROOT, MIRROR, WHEEL (a built wheel for test_admin_guide.py),
# REPORT (where the run's junit XML goes), MPS_LOAD_JOBS (the load test's length).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
ROOT=${ROOT:-/opt/mpswrap-ci/trixie}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PKGS=(slurmctld slurmd slurm-client munge libslurm-dev gcc libc6-dev python3 python3-venv
      python3-mpi4py openmpi-bin libpmix-dev procps util-linux passwd ca-certificates
      environment-modules man-db)
log() { echo "tools/slurm-trixie.sh: $*" >&2; }

[ "$(id -u)" = 0 ] || { log "run as root"; exit 2; }
# The rest runs in a mount namespace of its own: its binds of /proc, /sys and /dev never reach
# the host's mount table and go with the namespace, even when this script is SIGKILLed.
if [ "${MPSWRAP_TRIXIE_NS:-}" != 1 ]; then
  exec unshare --mount --propagation private env MPSWRAP_TRIXIE_NS=1 bash "$(readlink -f "$0")" "$@"
fi
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
  HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

MOUNTS=()
bind() {  # bind SRC into the root at the same path; slave, so unmounting never reaches SRC
  mkdir -p "$ROOT$1"
  mount --rbind "$1" "$ROOT$1"
  MOUNTS+=("$ROOT$1")
  mount --make-rslave "$ROOT$1"
}
unbind() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -R "${MOUNTS[i]}" 2>/dev/null ||
    umount -lR "${MOUNTS[i]}" || log "could not unmount ${MOUNTS[i]}"; done
  MOUNTS=()
}
trap unbind EXIT
trap "exit 130" INT
trap "exit 143" TERM

# --- the root: made once, packages brought up to the list on every run ------------------------
stamp=$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16)
if [ ! -x "$ROOT/usr/sbin/slurmd" ] || [ "$(cat "$ROOT/.mpswrap-pkgs" 2>/dev/null)" != "$stamp" ]; then
  start=$SECONDS
  if [ ! -x "$ROOT/bin/sh" ]; then
    command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap >/dev/null
    rm -rf --one-file-system "$ROOT.new"
    debootstrap --variant=minbase trixie "$ROOT.new" "$MIRROR" >"$ROOT.log" 2>&1 ||
      { tail -20 "$ROOT.log" >&2; log "debootstrap failed (log: $ROOT.log)"; exit 1; }
    mv "$ROOT.new" "$ROOT"
  fi
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  bind /proc
  in_root sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends ${PKGS[*]}" \
    >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log" >&2; log "apt-get in $ROOT failed"; exit 1; }
  unbind
  echo "$stamp" >"$ROOT/.mpswrap-pkgs"
  log "Debian 13 root built in $((SECONDS - start)) s ($ROOT, package list $stamp)"
else
  log "Debian 13 root reused: $ROOT, package list $stamp"
fi
# shellcheck disable=SC2016  # dpkg-query's own format
log "$(in_root dpkg-query -W -f='slurm ${Version}' slurmd), $(in_root python3 -V)"

# --- the tree, its wheels, a venv, the mounts ----------------------------------------------------
# The wheels are fetched by the host's pip (its index and certificates), for the root's Python;
# every pip in the root installs them offline (its /etc/pip.conf), the admin guide's venv too.
SRC=/opt/mpswrap-ci/src VENV=/opt/mpswrap-ci/venv DIST=/opt/mpswrap-ci/dist
rm -rf --one-file-system "${ROOT:?}$SRC" "${ROOT:?}$DIST"; mkdir -p "$ROOT$SRC" "$ROOT$DIST"
tar -C "$REPO" --exclude=./.git --exclude=__pycache__ --exclude=.head --exclude=.debs -cf - . |
  tar -C "$ROOT$SRC" -xf -
chmod -R a+rX "$ROOT$SRC"
HOST_VENV=$ROOT.host-venv
[ -x "$HOST_VENV/bin/pip" ] || /usr/bin/python3 -m venv "$HOST_VENV"
if [ -n "${WHEEL:-}" ]; then cp "$WHEEL" "$ROOT$DIST/"; else
  "$HOST_VENV/bin/pip" wheel -q --no-deps -w "$ROOT$DIST" "$REPO" >"$ROOT.pip.log" 2>&1 ||
    { tail -20 "$ROOT.pip.log" >&2; log "building the wheel failed"; exit 1; }
fi
wheel=$(cd "$ROOT$DIST" && echo mpswrap-*.whl)
py=$(in_root python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
platforms=()
for tag in manylinux_2_{17..39}_x86_64 manylinux2014_x86_64 linux_x86_64; do platforms+=(--platform "$tag"); done
"$HOST_VENV/bin/pip" download -q --dest "$ROOT$DIST" --only-binary=:all: --python-version "$py" \
  --implementation cp --abi "cp$py" --abi abi3 --abi none "${platforms[@]}" \
  "$ROOT$DIST/${wheel}[test]" >"$ROOT.pip.log" 2>&1 ||
  { tail -20 "$ROOT.pip.log" >&2; log "fetching wheels for Python $py failed"; exit 1; }
printf '[global]\nno-index = true\nfind-links = %s\n' "$DIST" >"$ROOT/etc/pip.conf"
# The host's name must resolve inside too: srun gives slurmd its address by name.
cp /etc/hosts "$ROOT/etc/hosts"
chmod 1777 "$ROOT/tmp"
bind /proc; bind /sys; bind /dev
[ -x "$ROOT$VENV/bin/python" ] || in_root python3 -m venv --system-site-packages "$VENV"
# The tree's own wheel again even where one of the same version is there: it is this tree.
in_root sh -c "$VENV/bin/python -m pip install -q '$DIST/${wheel}[test]' &&
  $VENV/bin/python -m pip install -q --force-reinstall --no-deps '$DIST/$wheel'" \
  >"$ROOT.pip.log" 2>&1 || { tail -20 "$ROOT.pip.log" >&2; log "pip install in $ROOT failed"; exit 1; }
chmod -R a+rX "$ROOT/opt/mpswrap-ci"

[ $# -gt 0 ] || set -- tests/integration
log "pytest $* (Slurm from $ROOT)"
rc=0
junit=/tmp/mpswrap-junit.xml
rm -f "$ROOT$junit"
# shellcheck disable=SC2016  # the inner shell expands its arguments
in_root MPS_TEST_WHEEL="$DIST/$wheel" PORT_BASE=7817 MPS_STRICT_SKIPS="${MPS_STRICT_SKIPS:-1}" \
  MPS_ALLOWED_SKIPS="$SRC/tests/allowed_skips.txt" ${MPS_LOAD_JOBS:+MPS_LOAD_JOBS="$MPS_LOAD_JOBS"} \
  bash -c 'cd "$0" && exec "$1/bin/python" -m pytest -p no:cacheprovider --junitxml="$2" -m "not gpu" "${@:3}"' \
  "$SRC" "$VENV" "$junit" "$@" || rc=$?
if [ -n "${REPORT:-}" ] && [ -r "$ROOT$junit" ]; then cp "$ROOT$junit" "$REPORT"; fi
log "Slurm 24.11 tier: pytest exited $rc"
exit $rc
