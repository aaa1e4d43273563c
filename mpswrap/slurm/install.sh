#!/usr/bin/env bash
# mpswrap/slurm/install.sh -- install mpswrap's Slurm hook shims on a node (run as root, on
# every node, like any other Prolog/Epilog). Usually run as `mpswrap install-hooks`.
#
#   install.sh --python /abs/path/to/python [--config /etc/mpswrap/mpswrap.conf]
#              [--dest /usr/local/libexec/mpswrap] [--spank [--slurm-include DIR]]
#
# Installs the shim beside it (hook) as DEST/prolog, DEST/task_prolog and DEST/epilog (the
# name picks the hook) with the interpreter (@PYTHON@) and the admin config file (@CONFIG@)
# filled in, root-owned, mode 0755, and prints the slurm.conf lines.  It does not edit slurm.conf.
# --spank also builds the SPANK plugin (mpswrap_spank.c: sbatch/salloc/srun --mps[=POLICY])
# with $CC (default cc, else gcc) against the installed Slurm's slurm/spank.h (found under
# --slurm-include DIR, /usr/include or /usr/local/include) into DEST/mpswrap_spank.so, and
# prints the plugstack.conf line. It builds with -Wall -Wextra -Werror (CFLAGS, default -O2,
# adds flags) and shows the compiler's command and output.
# Idempotent: running it again replaces the three files (atomically: a job starting at
# that moment sees the old or the new shim, never half of one).  Undo: uninstall.sh.
set -euo pipefail

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }
warn() { echo "install.sh: warning: $*" >&2; }
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
PYTHON="" CONFIG=/etc/mpswrap/mpswrap.conf DEST=/usr/local/libexec/mpswrap SPANK=0 INCLUDE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || usage; PYTHON=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || usage; CONFIG=$2; shift 2 ;;
    --dest)   [ $# -ge 2 ] || usage; DEST=$2; shift 2 ;;
    --spank)  SPANK=1; shift ;;
    --slurm-include) [ $# -ge 2 ] || usage; INCLUDE=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$PYTHON" ] || { echo "install.sh: --python is required" >&2; usage; }

# The paths are pasted into shell scripts (inside single quotes) and into slurm.conf, and
# Slurm splits its hook paths on nothing: allow plain path characters only.
for p in "$PYTHON" "$CONFIG" "$DEST"; do
  [[ $p = /* ]] || die "'$p' is not an absolute path"
  [[ $p =~ ^[A-Za-z0-9/._+-]+$ ]] || die "'$p' has characters other than A-Z a-z 0-9 / . _ + -"
done
[ "$(id -u)" = 0 ] || die "run as root: the hooks must be root-owned (slurmd runs them as root)"
[ -x "$PYTHON" ] || die "$PYTHON is not an executable file"
[ -r "$HERE/hook" ] || die "$HERE/hook is missing (reinstall mpswrap: the shims ship inside its package)"
if [ "$SPANK" = 1 ]; then
  [ -r "$HERE/mpswrap_spank.c" ] || die "$HERE/mpswrap_spank.c is missing (reinstall mpswrap)"
  if [ -z "${CC:-}" ]; then CC=cc; command -v cc >/dev/null || CC=gcc; fi
  command -v "$CC" >/dev/null || die "--spank needs a C compiler ($CC not found; e.g. apt-get install gcc)"
  for dir in $INCLUDE /usr/include /usr/local/include; do
    if [ -r "$dir/slurm/spank.h" ]; then SPANK_INCLUDE=$dir; break; fi
  done
  [ -n "${SPANK_INCLUDE:-}" ] || die "--spank needs Slurm's headers: no slurm/spank.h under ${INCLUDE:+$INCLUDE, }/usr/include or /usr/local/include (Debian: apt-get install libslurm-dev; RHEL: slurm-devel)"
fi

# Root runs the interpreter, the package and the config on every job: whoever may change one
# of them, or a directory above it, runs code as root. A level counts as safe when root owns
# it and neither group nor others may write it (a sticky directory, like /tmp, excepted).
changeable() {  # changeable PATH: print the first level of PATH another user may change
  local p=$1 uid mode kind
  while :; do
    IFS=: read -r uid mode kind < <(stat -c '%u:%a:%F' "$p") || { echo "$p (cannot stat)"; return 0; }
    [ "$uid" = 0 ] || { echo "$p (owned by uid $uid)"; return 0; }
    if [ "$kind" != "symbolic link" ] && (( (8#$mode & 8#022) != 0 )) &&
       ! { [ "$kind" = directory ] && (( (8#$mode & 8#1000) != 0 )); }; then
      echo "$p (mode $mode)"; return 0
    fi
    [ "$p" = / ] && return 1
    p=$(dirname "$p")
  done
}
refuse_changeable() {  # refuse_changeable WHAT PATH
  local found
  if found=$(changeable "$2"); then
    die "$1 $2 can be changed by a user other than root: $found; the hooks run it as root"
  fi
}
refuse_changeable "the interpreter" "$PYTHON"
refuse_changeable "the interpreter" "$(readlink -f "$PYTHON")"

# The shims run "$PYTHON -I -m mpswrap": -I ignores PYTHONPATH, so mpswrap must be installed
# in that interpreter's own environment (pip install into it, not a PYTHONPATH trick).
if ! out=$(cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$PYTHON" -I -c \
      'import mpswrap, sys; sys.stdout.write(mpswrap.__file__)' 2>&1); then
  die "$PYTHON cannot import mpswrap (install it into that environment: $PYTHON -m pip install <the mpswrap wheel, or a source tree>): $out"
fi
echo "install.sh: using mpswrap from $out"

PKG=$(dirname "$out")
refuse_changeable "the mpswrap package" "$PKG"
# What the shims check again on every prolog and epilog: each level of the interpreter, the
# file it links to, and the package (the package's own files are searched whole).
trusted_levels() {
  local p
  for p in "$@"; do
    while :; do echo "$p"; [ "$p" = / ] && break; p=$(dirname "$p"); done
  done | sort -u | tr '\n' ' '
}
TRUSTED=$(trusted_levels "$PYTHON" "$(readlink -f "$PYTHON")" "$PKG")
for p in $TRUSTED; do
  [[ $p =~ ^[A-Za-z0-9/._+-]+$ ]] || die "'$p' has characters other than A-Z a-z 0-9 / . _ + -"
done
bad=$(find "$PKG" \( ! -user 0 -o -perm /022 \) ! -type l -print -quit)
[ -z "$bad" ] || die "the mpswrap package has $bad, which a user other than root can change; the hooks run it as root"
# The task prolog runs as the job's user: interpreter and package must be readable by all.
if id nobody >/dev/null 2>&1 && command -v runuser >/dev/null; then
  (cd / && runuser -u nobody -- env -i PATH=/usr/bin:/bin "$PYTHON" -I -c 'import mpswrap' \
      >/dev/null 2>&1) ||
    warn "user 'nobody' cannot run '$PYTHON -I -c \"import mpswrap\"': the TaskProlog runs as the job user and will fail; make the interpreter and package world-readable"
fi

# The config file: hooks fail while it is missing (it is named explicitly), so say so now;
# if it is there, let mpswrap itself check every key and value.
if [ -e "$CONFIG" ]; then
  refuse_changeable "the config file" "$CONFIG"
  (cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$PYTHON" -I -m mpswrap config \
      --config "$CONFIG" >/dev/null) || die "mpswrap rejects $CONFIG (see the message above)"
  [ "$(stat -c %A "$CONFIG" | cut -c8)" = r ] ||
    warn "$CONFIG is not readable by other users: the TaskProlog (job user) cannot read it"
else
  warn "$CONFIG does not exist yet: the hooks fail until it does (see slurm/README.md)"
fi

# DEST: a root-owned directory; never write through a symlink someone planted.
if [ -L "$DEST" ]; then die "$DEST is a symbolic link; refusing"; fi
refuse_changeable "the shims' directory" "$(dirname "$DEST")"
mkdir -p "$DEST"
[ "$(stat -c %u "$DEST")" = 0 ] || die "$DEST is not owned by root"
chmod 0755 "$DEST"

# sed replacement text: escape & and the | delimiter (the allowed characters have neither,
# but keep it correct if the check above is ever relaxed).
esc() { printf '%s' "$1" | sed 's/[&|\\]/\\&/g'; }
py_esc=$(esc "$PYTHON"); conf_esc=$(esc "$CONFIG"); pkg_esc=$(esc "$PKG")
trusted_esc=$(esc "${TRUSTED% }")
for f in prolog task_prolog epilog; do
  tmp=$(mktemp "$DEST/.$f.XXXXXX")
  sed -e "s|@PYTHON@|$py_esc|g" -e "s|@CONFIG@|$conf_esc|g" -e "s|@PACKAGE@|$pkg_esc|g" \
      -e "s|@TRUSTED@|$trusted_esc|g" "$HERE/hook" >"$tmp"
  chown root:root "$tmp"
  chmod 0755 "$tmp"
  mv -f "$tmp" "$DEST/$f"
done
if grep -q '@PYTHON@\|@CONFIG@\|@PACKAGE@\|@TRUSTED@' "$DEST/prolog" "$DEST/task_prolog" "$DEST/epilog"; then
  die "placeholders left in $DEST (this is a bug)"
fi
echo "install.sh: installed $DEST/prolog, $DEST/task_prolog, $DEST/epilog"

if [ "$SPANK" = 1 ]; then
  tmp=$(mktemp "$DEST/.mpswrap_spank.XXXXXX")
  # A warning is an error: the plugin runs inside srun, sbatch and slurmstepd. CFLAGS (default
  # -O2) adds to the flags; the compiler's command and output are shown either way.
  read -r -a cflags <<<"${CFLAGS:--O2}"
  cc_argv=("$CC" -shared -fPIC -Wall -Wextra -Werror "${cflags[@]}" -I"$SPANK_INCLUDE" -o "$tmp"
           "$HERE/mpswrap_spank.c")
  echo "install.sh: ${cc_argv[*]}"
  if ! out=$("${cc_argv[@]}" 2>&1); then
    rm -f "$tmp"
    printf '%s\n' "$out" >&2
    die "building the SPANK plugin against $SPANK_INCLUDE/slurm/spank.h failed (compiler output above)"
  fi
  [ -z "$out" ] || printf '%s\n' "$out"
  chown root:root "$tmp"; chmod 0755 "$tmp"; mv -f "$tmp" "$DEST/mpswrap_spank.so"
  echo "install.sh: built $DEST/mpswrap_spank.so against $SPANK_INCLUDE/slurm/spank.h (no warnings)"
fi

cat <<EOF

Add to slurm.conf (the same on every node and on the controller), then
'scontrol reconfigure' (or restart slurmd):

Prolog=$DEST/prolog
Epilog=$DEST/epilog
TaskProlog=$DEST/task_prolog
PrologFlags=Alloc

(PrologFlags takes a comma list: if you already set it, add Alloc to it.)
Check with: scontrol show config | grep -i -e prolog -e epilog
EOF
if [ "$SPANK" = 1 ]; then
  cat <<EOF

For sbatch/salloc/srun --mps, add to plugstack.conf (the file PlugStackConfig names; default
beside slurm.conf), on every node where jobs are submitted or run, and add "spank" to
opt_in in $CONFIG:

optional $DEST/mpswrap_spank.so

Check with: sbatch --help | grep -e --mps
EOF
fi
