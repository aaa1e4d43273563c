#!/usr/bin/env bash
# mpswrap/slurm/uninstall.sh -- remove the shims that install.sh put in DEST
# (usually run as `mpswrap uninstall-hooks`).
#
#   uninstall.sh [--dest /usr/local/libexec/mpswrap] [--modulefile DIR] [--force] [--prog NAME]
#
# Remove the Prolog=, Epilog= and TaskProlog= lines from slurm.conf and reconfigure FIRST:
# while slurm.conf still names a missing prolog, every job on the node fails its prolog
# and Slurm drains the node.  If scontrol can reach the cluster and still reports hooks in
# DEST, this script refuses unless --force.  Only files that carry install.sh's marker are
# removed (--modulefile: the modules in DIR/mpswrap too); a directory is removed if that
# leaves it empty.  Idempotent.  Messages start with NAME: (default uninstall.sh; mpswrap
# uninstall-hooks passes uninstall-hooks).
set -euo pipefail

ME=uninstall.sh  # the name messages start with: --prog
# Run by mpswrap (--prog): its one-line error form, "mpswrap: uninstall-hooks: ..."
die() {
  if [ -n "$PREFIX" ]; then echo "$PREFIX$ME: $*" >&2; else echo "$ME: ERROR: $*" >&2; fi
  exit "${DIE_CODE:-1}"  # 2 where the command line is wrong for this user (not root)
}
PREFIX=""
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

DEST=/usr/local/libexec/mpswrap FORCE=0 MODULES=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) [ $# -ge 2 ] || usage; DEST=$2; shift 2 ;;
    --modulefile) [ $# -ge 2 ] || usage; MODULES=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --prog) [ $# -ge 2 ] || usage; ME=$2; PREFIX="mpswrap: "; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "$ME: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ $DEST = /* ]] || die "'$DEST' is not an absolute path"
[ -L "$DEST" ] && die "$DEST is a symbolic link; refusing"
[ "$(id -u)" = 0 ] || DIE_CODE=2 die "run as root: the hooks are root's (install-hooks installed them as root)"

# remove_marked FILE MARKER WHAT: FILE if it is a plain file of root's (no link, no FIFO) and a
# line of its first 4 KiB starts with MARKER (a regex).
remove_marked() {
  [ -e "$1" ] || [ -L "$1" ] || return 0
  if [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %u "$1")" = 0 ] &&
     head -c 4096 "$1" | grep -Eq "^$2"; then
    rm -f "$1"; echo "$ME: removed $1"
  else echo "$ME: $1 is not $3: left alone" >&2; fi
}
if [ -L "$DEST" ] || { [ -e "$DEST" ] && [ ! -d "$DEST" ]; }; then
  die "$DEST is not a directory: no shims of mpswrap there"
fi
[ -d "$DEST" ] || [ -n "$MODULES" ] || { echo "$ME: $DEST does not exist: nothing to do"; exit 0; }

if [ "$FORCE" = 0 ] && command -v scontrol >/dev/null; then
  if conf=$(timeout 10 scontrol show config 2>/dev/null) &&
     grep -E '^(Prolog|Epilog|TaskProlog)(\[[0-9]+\])? ' <<<"$conf" | grep -qF "$DEST/"; then
    grep -E '^(Prolog|Epilog|TaskProlog)(\[[0-9]+\])? ' <<<"$conf" >&2
    die "slurm.conf still points at $DEST: remove those lines and reconfigure first (or --force)"
  fi
  # The SPANK plugin: a plugstack.conf line that names it as "required" would fail every
  # sbatch and srun once it is gone.
  stack=$(sed -n 's/^PlugStackConfig *= *//p' <<<"${conf:-}")
  if [ -n "$stack" ] && [ -r "$stack" ] && grep -v '^[[:space:]]*#' "$stack" | grep -qF "$DEST/mpswrap_spank.so"; then
    die "$stack still names $DEST/mpswrap_spank.so: take that line out first (or --force)"
  fi
fi

# The modules (install.sh --modulefile), once nothing refused: only in a directory of root's
# that no other user can change (a shared, group-writable tree: removed by hand).
if [ -n "$MODULES" ] && [ -d "$MODULES/mpswrap" ]; then
  [[ $MODULES = /* ]] || die "'$MODULES' is not an absolute path"
  [ -L "$MODULES/mpswrap" ] && die "$MODULES/mpswrap is a symbolic link; refusing"
  [ "$(stat -c %u:%a "$MODULES/mpswrap")" = 0:755 ] ||
    die "$MODULES/mpswrap is not root's with mode 755: remove its mpswrap modules by hand"
  for p in "$MODULES"/mpswrap/*; do remove_marked "$p" '# mpswrap module: ' "an mpswrap module"; done
  if rmdir "$MODULES/mpswrap" 2>/dev/null; then echo "$ME: removed $MODULES/mpswrap"; fi
fi
[ -d "$DEST" ] || { echo "$ME: $DEST does not exist: nothing else to do"; exit 0; }

for f in prolog task_prolog epilog; do
  p=$DEST/$f
  [ -e "$p" ] || continue
  if grep -Eq '^# mpswrap Slurm shim[:,] ' "$p"; then  # ",": the marker of earlier shims
    rm -f "$p"; echo "$ME: removed $p"
  else
    echo "$ME: $p is not an mpswrap shim: left alone" >&2
  fi
done
# The SPANK plugin (install.sh --spank), known by a message of its own.
p=$DEST/mpswrap_spank.so
if [ -e "$p" ]; then
  if grep -aqF 'mpswrap: bad --mps policy' "$p"; then rm -f "$p"; echo "$ME: removed $p"
  else echo "$ME: $p is not mpswrap's plugin: left alone" >&2; fi
fi
remove_marked "$DEST/bin/mpswrap" '# mpswrap command: ' "mpswrap's command"
if rmdir "$DEST/bin" 2>/dev/null; then echo "$ME: removed $DEST/bin"; fi
if rmdir "$DEST" 2>/dev/null; then echo "$ME: removed $DEST"; fi
