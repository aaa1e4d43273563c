#!/usr/bin/env bash
# container-debs.sh [DIR] -- download the .debs the GPU tier's phase `container-ranks` needs
# (tests/gpu/probe_container_ranks.sh) into DIR (default: .debs/ of this tree), for a GPU
# machine without network: Podman with crun and conmon, their configuration, bubblewrap, and
# the libraries an Ubuntu 24.04 server may lack. Install there with
#   dpkg -i --force-depends .debs/*.deb
# (--force-depends: these are Debian 12's; Ubuntu names some of their dependencies otherwise,
# e.g. libgpgme11t64, and the container network stack is not needed: the probe runs --net=none).
# conmon needs GLib, which a minimal Ubuntu 24.04 lacks (conmon exits 127: "outdated conmon").
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$REPO/.debs}
PKGS=(podman crun conmon catatonit golang-github-containers-common
      golang-github-containers-image bubblewrap uidmap libsubid4 libgpgme11 libassuan0 libyajl2
      libdevmapper1.02.1 libglib2.0-0)
mkdir -p "$DEST"
cd "$DEST"
apt-get download "${PKGS[@]}"
files=()
for p in "${PKGS[@]}"; do files+=("$p"_*.deb); done
du -ch "${files[@]}"
