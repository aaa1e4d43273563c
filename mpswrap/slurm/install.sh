#!/usr/bin/env bash
# mpswrap/slurm/install.sh -- install mpswrap's Slurm hook shims on a node (run as root, on
# every node, like any other Prolog/Epilog). Usually run as `mpswrap install-hooks`.
#
#   install.sh --python /abs/path/to/python [--config /etc/mpswrap/mpswrap.conf]
#              [--dest /usr/local/libexec/mpswrap] [--spank [--slurm-include DIR]]
#              [--modulefile DIR] [--prog NAME]
#
# Installs the shim beside it (hook) as DEST/prolog, DEST/task_prolog and DEST/epilog (the
# name picks the hook) with the interpreter (@PYTHON@) and the admin config file (@CONFIG@)
# filled in, root-owned, mode 0755, and prints the slurm.conf lines.  It does not edit slurm.conf.
# Missing directories of DEST are made root's, mode 0755, below a level only root can change.
# --modulefile DIR also writes the environment module DIR/mpswrap/VERSION (Tcl: Lmod and
# Environment Modules both read it) that puts DEST/bin/mpswrap on users' PATH, sets
# MPSWRAP_CONFIG when the config file is not at its default path, puts the man page the wheel
# installs (<prefix>/share/man) on MANPATH and loads its bash completion.
# --spank also builds the SPANK plugin (mpswrap_spank.c: sbatch/salloc/srun --mps[=POLICY])
# with $CC (default cc, else gcc) against the installed Slurm's slurm/spank.h (found under
# --slurm-include DIR, /usr/include or /usr/local/include) into DEST/mpswrap_spank.so, and
# prints the plugstack.conf line. It builds with -Wall -Wextra -Werror (CFLAGS, default -O2,
# adds flags) and shows the compiler's command and output.
# Messages start with NAME: (default install.sh; mpswrap install-hooks passes install-hooks,
# and its errors then read as mpswrap's: "mpswrap: install-hooks: ...").
# Idempotent: running it again replaces the three files (atomically: a job starting at
# that moment sees the old or the new shim, never half of one).  Undo: uninstall.sh.
set -euo pipefail

ME=install.sh  # the name messages start with: --prog (install-hooks passes its own)
# Run by mpswrap (--prog): its one-line error form, "mpswrap: install-hooks: ..."
die() {
  if [ -n "$PREFIX" ]; then echo "$PREFIX$ME: $*" >&2; else echo "$ME: ERROR: $*" >&2; fi
  exit "${DIE_CODE:-1}"  # 2 where the command line is wrong for this user (not root)
}
PREFIX=""
warn() { echo "$ME: warning: $*" >&2; }
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
DEFAULT_CONFIG=/etc/mpswrap/mpswrap.conf  # where mpswrap looks without MPSWRAP_CONFIG
PYTHON="" CONFIG=$DEFAULT_CONFIG DEST=/usr/local/libexec/mpswrap SPANK=0 INCLUDE="" MODULES=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || usage; PYTHON=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || usage; CONFIG=$2; shift 2 ;;
    --dest)   [ $# -ge 2 ] || usage; DEST=$2; shift 2 ;;
    --spank)  SPANK=1; shift ;;
    --slurm-include) [ $# -ge 2 ] || usage; INCLUDE=$2; shift 2 ;;
    --modulefile) [ $# -ge 2 ] || usage; MODULES=$2; shift 2 ;;
    --prog) [ $# -ge 2 ] || usage; ME=$2; PREFIX="mpswrap: "; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "$ME: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$PYTHON" ] || { echo "$ME: --python is required" >&2; usage; }

# The paths are pasted into shell scripts (inside single quotes) and into slurm.conf, and
# Slurm splits its hook paths on nothing: allow plain path characters only.
for p in "$PYTHON" "$CONFIG" "$DEST" ${MODULES:+"$MODULES"}; do
  [[ $p = /* ]] || die "'$p' is not an absolute path"
  [[ $p =~ ^[A-Za-z0-9/._+-]+$ ]] || die "'$p' has characters other than A-Z a-z 0-9 / . _ + -"
done
[ "$(id -u)" = 0 ] || DIE_CODE=2 die "run as root: the hooks must be root-owned (slurmd runs them as root)"
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
# of them, or a directory above it, runs code as root. Every check below walks a path as the
# kernel resolves it (levels): from /, one component at a time, and where a component is a
# symbolic link, on through the levels of its target, so a link's own directory and every hop
# are judged (readlink -f would skip them: pyenv's /root behind a venv's bin/python). The
# shims check the same levels again (TRUSTED). As mpswrap/trust.py walks for root's reads.
levels() {  # levels PATH: each level of PATH in walk order, one a line; status 1 past 40 links
  local rest=${1#/} here="" part target links=0
  echo /
  while [ -n "$rest" ]; do
    part=${rest%%/*}
    if [[ $rest == */* ]]; then rest=${rest#*/}; else rest=""; fi
    case $part in "" | .) continue ;; ..) here=${here%/*}; continue ;; esac
    here=$here/$part
    echo "$here"
    [ -L "$here" ] || continue
    links=$((links + 1))
    [ "$links" -le 40 ] || return 1
    target=$(readlink "$here")
    if [[ $target == /* ]]; then here=""; else here=${here%/*}; fi
    rest=${target#/}${rest:+/$rest}
  done
}
# A level counts as safe when root owns it and neither group nor others may write it (a
# sticky directory, like /tmp, excepted; a link's own mode means nothing).
changeable() {  # changeable PATH: print the first level of PATH another user may change
  local p uid mode kind all
  all=$(levels "$1") || { echo "$1 (more than 40 symbolic links)"; return 0; }
  while read -r p; do
    IFS=: read -r uid mode kind < <(stat -c '%u:%a:%F' "$p") || { echo "$p (cannot stat)"; return 0; }
    [ "$uid" = 0 ] || { echo "$p (owned by uid $uid)"; return 0; }
    if [ "$kind" != "symbolic link" ] && (( (8#$mode & 8#022) != 0 )) &&
       ! { [ "$kind" = directory ] && (( (8#$mode & 8#1000) != 0 )); }; then
      echo "$p (mode $mode)"; return 0
    fi
  done <<<"$all"
  return 1
}
refuse_changeable() {  # refuse_changeable WHAT PATH
  local found
  if found=$(changeable "$2"); then
    die "$1 $2 can be changed by a user other than root: $found; the hooks run it as root"
  fi
}
refuse_changeable "the interpreter" "$PYTHON"

# The shims run "$PYTHON -I -m mpswrap": -I ignores PYTHONPATH, so mpswrap must be installed
# in that interpreter's own environment (pip install into it, not a PYTHONPATH trick).
if ! out=$(cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$PYTHON" -I -c \
      'import mpswrap, sys; sys.stdout.write(mpswrap.__file__)' 2>&1); then
  die "$PYTHON cannot import mpswrap (install it into that environment: $PYTHON -m pip install <the mpswrap wheel, or a source tree>): $out"
fi
# A program that is no Python (true, a shell script) answers nothing, or something else.
[[ $out =~ ^/[^[:space:]]*/mpswrap/__init__\.py$ ]] || {
  said=${out//[$'\n\r\t']/ }
  die "$PYTHON is not a Python interpreter with mpswrap: asked for mpswrap's file, it printed '${said:0:80}'"
}
echo "$ME: using mpswrap from $out"

PKG=$(dirname "$out")
refuse_changeable "the mpswrap package" "$PKG"
# What else that interpreter runs before and for mpswrap: its pyvenv.cfg, its site-packages
# directories and their .pth files (site runs a .pth's import lines at start), and the
# packages mpswrap imports (psutil, filelock, pynvml). One file another user can change
# among them runs that user's code as root, as the package itself would.
if ! env_out=$(cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$PYTHON" -I -c '
import glob, importlib.util, os, site, sys
cfg = os.path.join(sys.prefix, "pyvenv.cfg")
levels = [cfg] if os.path.exists(cfg) else []
for d in site.getsitepackages():
    if os.path.isdir(d):
        levels += [d, *sorted(glob.glob(os.path.join(d, "*.pth")))]
print("LEVELS", *levels)
found = [importlib.util.find_spec(m) for m in ("psutil", "filelock", "pynvml")]
print("DEPENDS", *(os.path.dirname(f.origin) if f.submodule_search_locations else f.origin
                   for f in found if f is not None and f.origin))' 2>&1); then
  die "$PYTHON cannot list its site-packages: $env_out"
fi
ENV_LEVELS=$(sed -n 's/^LEVELS//p' <<<"$env_out")
DEPENDS=$(sed -n 's/^DEPENDS//p' <<<"$env_out")
for p in $ENV_LEVELS $DEPENDS; do refuse_changeable "the interpreter's environment" "$p"; done
# What the shims check again on every prolog and epilog: each level of the interpreter, the
# file it links to, the package and its environment (the packages' own files are searched
# whole).
walked() {  # walked PATH...: the levels of every PATH, each once, in walk order
  local p
  for p in "$@"; do levels "$p" || die "$p: more than 40 symbolic links"; done | awk '!seen[$0]++'
}
# shellcheck disable=SC2086  # plain paths (checked below), one word each
WALKED=$(walked "$PYTHON" "$PKG" $ENV_LEVELS $DEPENDS)
TRUSTED=$(sort -u <<<"$WALKED" | tr '\n' ' ')
PACKAGES="$PKG${DEPENDS:+ $DEPENDS}"
PACKAGES=${PACKAGES//  / }
for p in $TRUSTED; do
  [[ $p =~ ^[A-Za-z0-9/._+-]+$ ]] || die "'$p' has characters other than A-Z a-z 0-9 / . _ + -"
done
for p in $PACKAGES; do
  bad=$(find "$p" \( ! -user 0 -o -perm /022 \) ! -type l -print -quit)
  [ -z "$bad" ] || die "$p has $bad, which a user other than root can change; the hooks run it as root"
done
# The task prolog runs as the job's user: interpreter and package must be readable by all.
# The level at fault, on the interpreter's way first: the first directory nobody cannot
# search (pyenv's /root, mode 0700, behind a venv's bin/python), or file it cannot read. A
# link's own mode means nothing: the walk goes on through its target's levels.
unreachable() {
  # shellcheck disable=SC2086,SC2016  # WALKED: plain paths (checked above); sh expands $p
  (cd / && runuser -u nobody -- sh -c 'for p; do
      if [ -L "$p" ]; then continue; fi
      if [ -d "$p" ]; then [ -x "$p" ] || { echo "$p"; exit; }; else [ -r "$p" ] || { echo "$p"; exit; }; fi
    done' sh $WALKED 2>/dev/null) || true
}
if id nobody >/dev/null 2>&1 && command -v runuser >/dev/null; then
  if ! (cd / && runuser -u nobody -- env -i PATH=/usr/bin:/bin "$PYTHON" -I -c 'import mpswrap' \
      >/dev/null 2>&1); then
    level=$(unreachable)
    why="make the interpreter and package world-readable"
    [ -z "$level" ] || why="$(stat -c '%n is mode %a, owner %U' "$level"): use an interpreter and package outside it, or open it to others"
    warn "user 'nobody' cannot run '$PYTHON -I -c \"import mpswrap\"': the TaskProlog runs as the job user and will fail; $why"
  fi
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

# A directory root installs into: root-owned, 0755; never written through a symlink someone
# planted. Missing levels are made one at a time, root's and 0755, and only below a level
# that no one but root can change; then the whole chain is checked as for an existing one.
# An existing directory keeps its mode; one that is made is root's, 0755 (00755: no setgid
# inherited from its parent). The chain is checked where symbolic links lead too (levels).
# "lenient": the modules' directories, which users, not root, run: a site's shared,
# group-writable modulefiles tree gets a warning.
ensure_dir() {  # ensure_dir WHAT DIR [lenient]
  local what=$1 dir=$2 lenient=${3:-} base missing=() level
  [ -L "$dir" ] && die "$dir is a symbolic link; refusing"
  base=$(dirname "$dir")
  while [ ! -e "$base" ] && [ ! -L "$base" ]; do missing=("$base" ${missing[@]+"${missing[@]}"}); base=$(dirname "$base"); done
  check_level "$what" "$base" "$lenient"
  for level in ${missing[@]+"${missing[@]}"}; do
    mkdir -m 0755 "$level"; chown root:root "$level"; chmod 00755 "$level"
    echo "$ME: created $level (root's, mode 0755)"
  done
  if [ -e "$dir" ]; then
    [ -d "$dir" ] || die "$dir is not a directory"
    [ "$(stat -c %u "$dir")" = 0 ] || die "$dir is not owned by root"
    check_level "$what" "$dir" "$lenient"
  else
    mkdir -m 0755 "$dir"; chown root:root "$dir"; chmod 00755 "$dir"
  fi
  level=$(shared_level "$dir")
  [ -z "$level" ] ||
    warn "$dir is under $level, which every user may write to: a job's private /tmp (job_container/tmpfs) hides it and a cleaner may remove it; install outside it (e.g. /usr/local/libexec/mpswrap)"
}
check_level() {  # check_level WHAT PATH [lenient]: refuse (or only warn) a changeable chain
  local found
  found=$(changeable "$2") || return 0
  [ -n "${3:-}" ] || die "$1 $2 can be changed by a user other than root: $found; the hooks run it as root"
  warn "$1 $2 can be changed by a user other than root ($found): they can change what 'module load' runs for users"
}
shared_level() {  # shared_level PATH: the first directory of PATH every user may write to
  local p=$1 mode
  while [ "$p" != / ]; do
    p=$(dirname "$p")
    mode=$(stat -L -c %a "$p")
    if (( (8#$mode & 8#002) != 0 )); then echo "$p"; return; fi
  done
}
ensure_dir "the shims' directory" "$DEST"

# sed replacement text: escape & and the | delimiter (the allowed characters have neither,
# but keep it correct if the check above is ever relaxed).
esc() { printf '%s' "$1" | sed 's/[&|\\]/\\&/g'; }
py_esc=$(esc "$PYTHON"); conf_esc=$(esc "$CONFIG"); pkg_esc=$(esc "${PACKAGES# }")
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
echo "$ME: installed $DEST/prolog, $DEST/task_prolog, $DEST/epilog"

# The module: users get the mpswrap the hooks run, alone on PATH (the environment's bin
# would put its python and pip before theirs), and the admin file's path where mpswrap
# would not look by itself. Tcl, not Lua: Lmod reads Tcl modulefiles too, Environment
# Modules (Debian's environment-modules, RHEL's) reads only Tcl.
install_file() {  # install_file MODE PATH: stdin to PATH, root's, atomically
  local tmp
  tmp=$(mktemp "$(dirname "$2")/.${2##*/}.XXXXXX")
  cat >"$tmp"; chown root:root "$tmp"; chmod "$1" "$tmp"; mv -f "$tmp" "$2"
}
# The man page and the bash completion script that the wheel installs under the environment's
# share/ (pyproject's data-files), for the module. DATA: the environment's prefix for them.
shared_file() {  # shared_file PATH WHAT: PATH if it is there (else a warning), checked as a module's
  if [ ! -f "$1" ]; then
    warn "$1 is missing (mpswrap installed from its wheel puts it there): the module $2"
    return 0
  fi
  [[ $1 =~ ^[A-Za-z0-9/._+-]+$ ]] || die "'$1' has characters other than A-Z a-z 0-9 / . _ + -"
  check_level "the module's $(basename "$1")" "$1" lenient
  echo "$1"
}
module_manpath() {  # the modulefile's MANPATH lines, or nothing
  local page
  page=$(shared_file "$DATA/share/man/man1/mpswrap.1" "sets no MANPATH")
  [ -n "$page" ] || return 0
  # The empty element keeps man's own search path where MANPATH was unset (man-db: an empty
  # element is the default path); Environment Modules and Lmod both keep one of it.
  printf '%s\n' "prepend-path MANPATH $DATA/share/man" "append-path MANPATH {}"
}
module_completion() {  # the modulefile's completion lines, or nothing
  local script spec func
  script=$(shared_file "$DATA/share/bash-completion/completions/mpswrap.bash" "loads no completion")
  [ -n "$script" ] || return 0
  # The script's own last line says how bash completes mpswrap: the module says the same,
  # with a loader function of that name that reads the script at the first <Tab>.
  spec=$(sed -n 's/^complete \(.*\) mpswrap$/\1/p' "$script")
  func=$(sed -n 's/.*-F \([A-Za-z0-9_]*\).*/\1/p' <<<"$spec")
  [[ $spec =~ ^[A-Za-z0-9_\ -]+$ && -n $func ]] || die "$script has no 'complete ... -F FUNCTION mpswrap' line"
  # 'complete' is a modulefile command of Environment Modules 5.1+ and Lmod 8.6.15+; older
  # releases skip the completion (and still load the rest).
  cat <<END
if {[info commands complete] ne {} && [info commands set-function] ne {}} {
    set-function $func {unset -f $func; . '$script' && $func "\$@"}
    complete bash mpswrap {$spec}
}
END
}
if [ -n "$MODULES" ]; then
  DATA=$(cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$PYTHON" -I -c \
    'import sysconfig; print(sysconfig.get_path("data"))')
  version=$(cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$PYTHON" -I -c \
    'import mpswrap; print(mpswrap.__version__)')
  [[ $version =~ ^[A-Za-z0-9._+-]+$ ]] || die "mpswrap's version '$version' cannot name a module"
  ensure_dir "the shims' directory" "$DEST/bin"
  install_file 0755 "$DEST/bin/mpswrap" <<END
#!/bin/sh
# mpswrap command: written by mpswrap install-hooks --modulefile (its module puts this
# directory on PATH); it runs the mpswrap that the hooks run.
exec '$PYTHON' -I -m mpswrap "\$@"
END
  ensure_dir "the modulefiles' directory" "$MODULES" lenient
  ensure_dir "the modulefiles' directory" "$MODULES/mpswrap" lenient
  setenv=""
  [ "$CONFIG" = "$DEFAULT_CONFIG" ] || setenv="setenv MPSWRAP_CONFIG $CONFIG"
  manpath=$(module_manpath) completion=$(module_completion)
  install_file 0644 "$MODULES/mpswrap/$version" <<END
#%Module1.0
# mpswrap module: written by mpswrap install-hooks --modulefile; replaced when it runs again.
module-whatis "mpswrap $version: many CUDA processes on one GPU through NVIDIA MPS"
proc ModulesHelp { } {
    puts stderr "mpswrap $version: 'mpswrap help' lists its commands and options; man mpswrap."
}
conflict mpswrap
prepend-path PATH $DEST/bin
$setenv
$manpath
$completion
END
  did="puts $DEST/bin/mpswrap on PATH${setenv:+, sets MPSWRAP_CONFIG=$CONFIG}"
  did+="${manpath:+, puts mpswrap(1) on MANPATH}${completion:+, loads the bash completion}"
  echo "$ME: wrote the module $MODULES/mpswrap/$version ('module load mpswrap' $did)"
fi

if [ "$SPANK" = 1 ]; then
  tmp=$(mktemp "$DEST/.mpswrap_spank.XXXXXX")
  # A warning is an error: the plugin runs inside srun, sbatch and slurmstepd. CFLAGS (default
  # -O2) adds to the flags; the compiler's command and output are shown either way.
  read -r -a cflags <<<"${CFLAGS:--O2}"
  cc_argv=("$CC" -shared -fPIC -Wall -Wextra -Werror "${cflags[@]}" -I"$SPANK_INCLUDE" -o "$tmp"
           "$HERE/mpswrap_spank.c")
  echo "$ME: ${cc_argv[*]}"
  if ! out=$("${cc_argv[@]}" 2>&1); then
    rm -f "$tmp"
    printf '%s\n' "$out" >&2
    die "building the SPANK plugin against $SPANK_INCLUDE/slurm/spank.h failed (compiler output above)"
  fi
  [ -z "$out" ] || printf '%s\n' "$out"
  chown root:root "$tmp"; chmod 0755 "$tmp"; mv -f "$tmp" "$DEST/mpswrap_spank.so"
  echo "$ME: built $DEST/mpswrap_spank.so against $SPANK_INCLUDE/slurm/spank.h (no warnings)"
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
if [ -n "$MODULES" ]; then
  cat <<EOF

Users get mpswrap with 'module load mpswrap' where $MODULES is on their MODULEPATH
('module use $MODULES' adds it).
EOF
fi
if [ "$SPANK" = 1 ]; then
  cat <<EOF

For sbatch/salloc/srun --mps, add to plugstack.conf (the file PlugStackConfig names; default
beside slurm.conf), on every node where jobs are submitted or run, and add "spank" to
opt_in in $CONFIG:

optional $DEST/mpswrap_spank.so

Check with: sbatch --help | grep -e --mps
EOF
fi
