#!/usr/bin/env bash
# probe_container_ranks.sh OUTDIR -- a real CUDA client as a containerised rank of
# `mpswrap run`: in a rootful Podman container (its root the host's, bound; no registry) and
# under bubblewrap set up as Apptainer sets up a container (own mount, PID and IPC
# namespaces). For each: with `mpswrap container-args`' flags the client attaches, is verified
# (summary "1 attached"), is listed by the server by its host PID, and a SIGTERM to
# `mpswrap run` ends it through terminate_client ("1 ended by terminate_client", exit 143);
# Podman also with --ipc=host; without the bind mpswrap refuses the rank (exit 2), and the same
# container started without mpswrap runs the client without MPS (the server never lists it).
# Every case ends with one "RESULT case=... ok=yes|no ..." line, whatever the others did;
# every step is bounded. Root on a GPU machine (podman, crun, conmon, bwrap: tools/
# container-debs.sh fetches their .debs); touches no GPU setting. Exit 1 if a case's result
# differs from the how-to's (docs/howto-containers.md) or something was left running.
# The functions below are called by name ("${runtime}"_rank), which shellcheck cannot follow.
# shellcheck disable=SC2317
set -u
out=${1:?usage: probe_container_ranks.sh OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/container-ranks.txt") 2>&1
PY=$(command -v "${PROBE_PYTHON:-python3}")
CLIENT=${MPS_CONTRACT_CLIENT:-/opt/mpswrap-site/cuda_client}
# How the running client's command line starts (the simulator's runs as python -m …).
PATTERN=${PROBE_CLIENT_PATTERN:-^$CLIENT --seconds}
W=/tmp/pcr ROOT=/tmp/pcr/root
export MPSWRAP_USER_RUN_DIR=$W/run  # under $W: a tmpfs over $W hides it in a container
rm -rf "$W"; mkdir -p "$ROOT" "$W/run" "$W/logs"; chmod 700 "$W/run"
# Podman asks for higher open-files and process limits than a machine may allow (crun:
# setrlimit RLIMIT_NOFILE, RLIMIT_NPROC: Operation not permitted; on the GPU machine even a
# process limit equal to the hard limit): limits well below the machine's instead.
hard=$(ulimit -Hn); [ "$hard" = unlimited ] && hard=65536
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=4096:4096"]\n' "$hard" "$hard" \
  >"$W/containers.conf"
export CONTAINERS_CONF=$W/containers.conf
mpswrap() { "$PY" -m mpswrap "$@"; }
failed=0
date -u +%FT%TZ
if ! { podman --version && conmon --version; } >/dev/null 2>&1 &&
   compgen -G "${DEBS:-.debs}/podman_*.deb" >/dev/null; then
  dpkg -i --force-depends "${DEBS:-.debs}"/*.deb >/dev/null 2>&1
fi
for t in podman crun conmon bwrap; do echo "$t: $(command -v $t) $($t --version 2>&1 | head -1)"; done
for t in podman conmon crun; do  # a library the carried .debs still lack names itself here
  command -v "$t" >/dev/null && ldd "$(command -v "$t")" | grep "not found" | sed "s/^/$t: /"
done
# The GPU's device files, for Podman's --device (the container's /dev is its own).
DEVICES=()
for d in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
  [ -c "$d" ] && DEVICES+=(--device "$d")
done

# "${NS[@]}" CMD...: CMD in a mount namespace of its own where $ROOT is the host's root
# (rbind): the container's root, as no registry is reachable. crun refuses cgroups in hybrid
# mode (the umount: harmless where they are unified).
# shellcheck disable=SC2016  # $0 and $@ are the inner shell's
NS=(unshare -m --propagation private sh -c
    'umount /sys/fs/cgroup/unified 2>/dev/null; mount --rbind / "$0" && exec "$@"' "$ROOT")
podman_rank() {  # podman_rank FLAGS... -- PROGRAM...: the rank's command line
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
  # $W hidden (its root is the host's): the job's directory is there only through FLAGS' bind.
  echo podman run --rm --cgroups=disabled --net=none "${DEVICES[@]}" --tmpfs "$W" "${flags[@]}" \
    --rootfs "$ROOT" "$@"
}
bwrap_rank() {  # bwrap_rank FLAGS... -- PROGRAM...: as Apptainer; $W hidden but what FLAGS bind
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
  echo bwrap --ro-bind / / --dev-bind /dev /dev --proc /proc --tmpfs "$W" "${flags[@]}" \
    --unshare-pid --unshare-ipc --die-with-parent -- "$@"
}
result() {  # result CASE OK DETAILS...
  local name=$1 ok=$2; shift 2
  [ "$ok" = yes ] || failed=1
  echo "RESULT case=$name ok=$ok $*"
}
summary_of() { grep -o 'summary: node.*' "$1" | tail -1; }
ours() {  # ours PID: the process is this probe's (its environment or command names $W)
  grep -qs "$W" /proc/"$1"/environ /proc/"$1"/cmdline
}
host_client_pid() {  # the host PID of this probe's running client, or nothing
  local p
  for p in $(pgrep -f "$PATTERN"); do ours "$p" && { echo "$p"; return; }; done
}
listed_by_server() {  # listed_by_server PID: the server of the client's pipe lists PID
  local pid=$1 pipe s
  pipe=$(tr '\0' '\n' </proc/"$pid"/environ 2>/dev/null | sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p')
  [ -n "$pipe" ] || pipe=$(find "$W/run" -maxdepth 5 -type d -name pipe 2>/dev/null | head -1)
  for s in $(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control); do
    echo "get_client_list $s" | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control |
      grep -x "$pid" >/dev/null && return 0
  done
  return 1
}

# attach NAME RUNTIME [EXTRA...]: a 15 s client, verified (--verify-attach fail): exit 0 and
# "1 attached" only if the check saw the server list it.
attach() {
  local name=$1 runtime=$2 log=$W/logs/$1.log rc flags
  shift 2
  flags=$(mpswrap container-args "$runtime")
  # shellcheck disable=SC2046,SC2086  # the flags and the command line are words
  timeout 120 "${NS[@]}" "$PY" -m mpswrap run -n 1 --verify-attach fail --verify-timeout 60 -- \
    $("${runtime}"_rank $flags "$@" -- "$CLIENT" --seconds 15) >"$log" 2>&1
  rc=$?
  sed 's/^/  /' "$log" | tail -8
  local sum; sum=$(summary_of "$log")
  [ $rc = 0 ] && echo "$sum" | grep -q ' 1 attached' && ok=yes || ok=no
  result "$name" "$ok" "rc=$rc summary=[$sum]"
}

# terminate NAME RUNTIME: a 300 s client; once the server lists it by its host PID, SIGTERM
# to mpswrap run: exit 143 and "1 ended by terminate_client".
terminate() {
  local name=$1 runtime=$2 log=$W/logs/$1.log rc=none flags pid="" listed=no sup
  flags=$(mpswrap container-args "$runtime")
  # shellcheck disable=SC2046,SC2086
  timeout 180 "${NS[@]}" "$PY" -m mpswrap run -n 1 -- \
    $("${runtime}"_rank $flags -- "$CLIENT" --seconds 300) >"$log" 2>&1 &
  local runner=$!
  for _ in $(seq 600); do  # up to 60 s for CUDA to start and the server to list it
    pid=$(host_client_pid)
    [ -n "$pid" ] && listed_by_server "$pid" && { listed=yes; break; }
    kill -0 $runner 2>/dev/null || break
    sleep 0.1
  done
  echo "  client host pid ${pid:-none}, listed by the server: $listed"
  ps -o pid,ppid,user,args -p "${pid:-1}" 2>/dev/null | sed 's/^/  /'
  # The supervisor: timeout's child (unshare and its shell exec it), not its guard.
  sup=$(pgrep -P "$runner" | head -1)
  [ -n "$sup" ] && kill -TERM "$sup"
  wait $runner; rc=$?
  sed 's/^/  /' "$log" | tail -8
  local sum; sum=$(summary_of "$log")
  [ "$listed" = yes ] && [ "$rc" = 143 ] && echo "$sum" | grep -q ' 1 ended by terminate_client' &&
    ok=yes || ok=no
  result "$name" "$ok" "listed=$listed host_pid=${pid:-none} rc=$rc summary=[$sum]"
}

# refused NAME RUNTIME [FLAGS...]: the rank without the bind (FLAGS: the variables): exit 2
# and one line, nothing started.
refused() {
  local name=$1 runtime=$2 log=$W/logs/$1.log rc
  shift 2
  # shellcheck disable=SC2046
  timeout 60 "${NS[@]}" "$PY" -m mpswrap run -n 1 -- \
    $("${runtime}"_rank "$@" -- "$CLIENT" --seconds 5) >"$log" 2>&1
  rc=$?
  sed 's/^/  /' "$log"
  [ $rc = 2 ] && grep -q 'does not bind the MPS pipe directory' "$log" &&
    ! grep -q 'GPU daemon(s)' "$log" && ok=yes || ok=no
  result "$name" "$ok" "rc=$rc"
}

# unbound NAME RUNTIME [FLAGS...]: the same container without mpswrap and without the bind,
# pointed at a running daemon (a bare one, under $W): the client runs without MPS (exit 0),
# and no server ever starts for it.
unbound() {
  local name=$1 runtime=$2 log=$W/logs/$1.log rc servers
  local pipe=$W/bare/pipe logs=$W/bare/log
  shift 2
  mkdir -p "$pipe" "$logs"
  CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_LOG_DIRECTORY=$logs timeout 30 nvidia-cuda-mps-control -d
  # shellcheck disable=SC2046
  CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 90 "${NS[@]}" \
    $("${runtime}"_rank "$@" -- "$CLIENT" --seconds 5) >"$log" 2>&1
  rc=$?
  servers=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control)
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 30 nvidia-cuda-mps-control
  for _ in $(seq 100); do [ -S "$pipe/control" ] || break; sleep 0.1; done
  sed 's/^/  /' "$log" | tail -4
  [ $rc = 0 ] && [ -z "$servers" ] && ok=yes || ok=no
  result "$name" "$ok" "rc=$rc servers=[${servers}]"
}

echo "=== podman"
attach podman-attach podman
attach podman-attach-ipc-host podman --ipc=host
terminate podman-terminate podman
refused podman-refused podman -e CUDA_MPS_PIPE_DIRECTORY -e MPSWRAP_TREE
unbound podman-without-bind-or-mpswrap podman -e CUDA_MPS_PIPE_DIRECTORY
echo "=== bubblewrap (as Apptainer)"
attach bwrap-attach bwrap
terminate bwrap-terminate bwrap
refused bwrap-refused bwrap
unbound bwrap-without-bind-or-mpswrap bwrap

left=$(for p in $(pgrep -f "nvidia-cuda-mps|$PATTERN"); do ours "$p" && echo "$p"; done | tr '\n' ' ')
[ -z "$left" ] || { echo "left running: $left"; ps -o pid,args -p "${left// /,}"; failed=1; }
result all "$([ $failed = 0 ] && echo yes || echo no)" "left=[${left}]"
exit $failed
