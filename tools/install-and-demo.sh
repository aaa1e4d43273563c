#!/usr/bin/env bash
# tools/install-and-demo.sh -- install mpswrap into a virtual environment and run its demo.
#   bash tools/install-and-demo.sh [--clients N] [--simulate auto|yes|no]
# As root on Debian/Ubuntu it installs python3-venv if missing. VENV overrides the location
# (default /opt/mpswrap/venv as root, ~/.local/share/mpswrap/venv otherwise). It installs this
# source tree; WHEEL=path/to/mpswrap-*.whl installs that wheel instead (CI: the one it built).
# mpswrap needs Python >= 3.10 (README, Requirements); PYTHON=python3.11 overrides python3.
# It ends by printing how to put mpswrap on PATH, and exits with the demo's status.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
if [ "$(id -u)" = 0 ]; then VENV=${VENV:-/opt/mpswrap/venv}; else VENV=${VENV:-$HOME/.local/share/mpswrap/venv}; fi

# pip refuses an interpreter older than pyproject's requires-python, and says so.
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "install python3-venv first (apt-get install python3-venv)" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv >/dev/null
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q "${WHEEL:-$REPO}"
echo "installed: $("$VENV/bin/mpswrap" --version) in $VENV"
rc=0
"$VENV/bin/mpswrap" demo "$@" || rc=$?
# The venv's bin is not on PATH, and putting all of it there would put its python and pip
# before the system's: a link to the one command is enough.
# The wheel puts the man page and the completion under $VENV/share: man-db finds the page from
# a PATH entry's ../share/man, bash-completion 2.12+ the completion from the command's real
# path; with the link, man and older bash-completion need links of their own.
if [ "$(id -u)" = 0 ]; then links=/usr/local; else links=$HOME/.local; fi
comp=share/bash-completion/completions
cat <<EOF

mpswrap is installed in $VENV/bin, which is not on PATH. To run it as 'mpswrap':
  ln -s $VENV/bin/mpswrap $links/bin/mpswrap     # once, for every shell
  export PATH="$VENV/bin:\$PATH"              # or: this shell only
Its man page and bash completion are in $VENV/share: man finds the page while $VENV/bin
is on PATH, bash-completion 2.12+ finds the completion either way; else link them:
  mkdir -p $links/share/man/man1 $links/$comp
  ln -s $VENV/share/man/man1/mpswrap.1 $links/share/man/man1/
  ln -s $VENV/$comp/mpswrap.bash $links/$comp/
On a Slurm cluster, users get it with 'module load mpswrap' (slurm/README.md, Install).
EOF
exit "$rc"
