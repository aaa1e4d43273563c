#!/usr/bin/env bash
# down.sh STATE_DIR -- stop the test cluster that up.sh started in STATE_DIR.
#
# Stops, by PID only (never by process name):
#   1. all jobs (scancel, while slurmctld is still up), waiting for epilogs;
#   2. slurmd x N and slurmctld (pid files in STATE_DIR/run);
#   3. leftovers that belong to THIS cluster: slurmstepd processes, job tasks,
#      processes spawned by our prolog/epilog (e.g. MPS daemons a test started)
#      and daemons whose pid file was lost, recognised by
#      SLURM_CONF=STATE_DIR/etc/slurm.conf in /proc/PID/environ plus
#      comm=slurmstepd|slurmd|slurmctld or SLURMD_NODENAME=* in the environ;
#      then any process whose command line or environment names a path under
#      STATE_DIR/ (hooks may start daemons with a fresh environment, e.g. MPS
#      control daemons whose pipe directory lives in STATE_DIR);
#   4. munged (pid file, then the same environ test with comm=munged);
#   5. the network namespaces and bridge of ISOLATE=netns (STATE_DIR/run/netns).
# SIGTERM first, SIGKILL after STOP_TIMEOUT (default 5) seconds (slurmstepd: SIGKILL at once).
# Idempotent: nothing running -> exit 0.  Logs stay in STATE_DIR/log unless
# PURGE=1, which removes STATE_DIR entirely.
# Exit status non-zero (with "down.sh: ERROR") only if something survived SIGKILL.
#
# This is the project's own copy of the lab harness (shared/lab/down.sh); it adds
# the STATE_DIR/ path test of step 3 and is shellcheck-clean.
set -uo pipefail

die() { echo "down.sh: ERROR: $*" >&2; exit 1; }
log() { echo "down.sh: $*" >&2; }
[ $# -eq 1 ] || die "usage: $0 STATE_DIR"
[ -d "$1" ] || { log "no such directory $1: nothing to do"; exit 0; }
D=$(cd "$1" && pwd -P)
STOP_TIMEOUT=${STOP_TIMEOUT:-5}
export SLURM_CONF=$D/etc/slurm.conf
T0=$(date +%s.%N)

# pid is running (a zombie counts as gone: PID 1 here reaps late)
running() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
            [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
# pid from a pid file, only if it still runs the expected program (no PID reuse).
# NB: Debian's binaries are /usr/sbin/slurmctld-wlm etc. behind alternatives
# symlinks, so /proc/PID/exe ends in "-wlm"; /proc/PID/comm is "slurmctld".
pid_of() { local p comm; p=$(cat "$1" 2>/dev/null) || return 1; [[ $p =~ ^[0-9]+$ ]] || return 1
           running "$p" || return 1
           comm=$(cat "/proc/$p/comm" 2>/dev/null) || return 1
           [ "$comm" = "$2" ] || return 1; echo "$p"; }
# stop PID... : TERM, wait, KILL   (FIRST_SIG=KILL stop_pids ... to skip TERM)
stop_pids() {
  local p left=() i
  [ $# -gt 0 ] || return 0
  for p in "$@"; do kill -"${FIRST_SIG:-TERM}" "$p" 2>/dev/null; done
  for ((i=0; i<STOP_TIMEOUT*10; i++)); do
    left=(); for p in "$@"; do running "$p" && left+=("$p"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  log "SIGKILL to ${left[*]} (ignored SIGTERM for ${STOP_TIMEOUT}s)"
  for p in "${left[@]}"; do kill -KILL "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${left[@]}"; do running "$p" && { log "pid $p survived SIGKILL"; return 1; }; done
  return 0
}
# ancestors: " PID PPID ... 1 " of this script (never stopped, whatever they mention)
ancestors() {
  local q=$$ anc=" $$ "
  while [ "$q" -gt 1 ]; do q=$(awk '{print $4}' "/proc/$q/stat" 2>/dev/null) || break; anc+="$q "; done
  echo "$anc"
}
# ours COMM_REGEX [env]: running processes of THIS cluster that have no (valid) pid
# file.  All of them carry SLURM_CONF=$D/etc/slurm.conf in their initial
# environment (up.sh exports it before starting anything; slurmd passes it on
# to slurmstepd, to prolog/epilog and to job tasks).  Selected are those that
# also have a daemon name matching COMM_REGEX, or (with "env") SLURMD_NODENAME
# in their environment (which only slurmd sets: prolog/epilog, anything they
# spawned, e.g. an MPS daemon, and job tasks).  A test runner that merely exported
# SLURM_CONF matches neither and is left alone; so are our own ancestors.
ours() {
  local e c p env anc
  anc=$(ancestors)
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [[ $anc == *" $p "* ]] && continue
    env=$(tr '\0' '\n' 2>/dev/null <"$e") || continue   # kernel threads etc.
    grep -qxF "SLURM_CONF=$D/etc/slurm.conf" <<<"$env" || continue
    c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    if [[ $c =~ ^($1)$ ]] || { [ "${2:-}" = env ] && grep -q '^SLURMD_NODENAME=' <<<"$env"; }; then
      running "$p" && echo "$p"
    fi
  done
}

# mentions_state [SKIP_PID]: running processes (not our ancestors) whose command line or
# environment contains "$D/".  Catches what hooks started with a fresh environment.
mentions_state() {
  local f p anc
  anc=$(ancestors)
  for f in /proc/[0-9]*/cmdline; do
    p=${f#/proc/}; p=${p%/cmdline}
    [[ $anc == *" $p "* ]] || [ "$p" = "${1:-}" ] && continue
    # -a: NUL-separated text; no pipe, so no SIGPIPE games under pipefail
    grep -qsaF -- "$D/" "$f" "/proc/$p/environ" && running "$p" && echo "$p"
  done
}

rc=0
ctld=$(pid_of "$D/run/slurmctld.pid" slurmctld) || ctld=""
# 1. cancel jobs while the controller can still run their epilogs
if [ -n "$ctld" ] && [ -f "$SLURM_CONF" ]; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// }" ]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086  # one argument per job id
    timeout 10 scancel $jobs 2>/dev/null
    for ((i=0; i<STOP_TIMEOUT*10; i++)); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1
    done
  fi
fi
# 2. slurmd(s) and slurmctld, in parallel
pids=()
for pf in "$D"/run/slurmd.*.pid; do [ -e "$pf" ] || continue
  p=$(pid_of "$pf" slurmd) && pids+=("$p"); done
[ -n "$ctld" ] && pids+=("$ctld")
stop_pids "${pids[@]}" || rc=1
# 3. leftovers: slurmstepd, job tasks, prolog/epilog children, daemons whose pid file was lost
# slurmstepd ignores SIGTERM by design: SIGKILL it (its tasks get TERM below)
mapfile -t left < <(ours slurmstepd)
if [ ${#left[@]} -gt 0 ]; then
  log "killing leftover slurmstepd of this cluster: ${left[*]}"
  FIRST_SIG=KILL stop_pids "${left[@]}" || rc=1
fi
mapfile -t left < <(ours 'slurmd|slurmctld' env)
if [ ${#left[@]} -gt 0 ]; then
  log "stopping leftover processes of this cluster: ${left[*]}"
  stop_pids "${left[@]}" || rc=1
fi
# anything else naming a path under STATE_DIR/ (munged is still needed: skip it here)
munged_pid=$(pid_of "$D/run/munged.pid" munged) || munged_pid=""
mapfile -t left < <(mentions_state "$munged_pid")
if [ ${#left[@]} -gt 0 ]; then
  log "stopping leftover processes that use $D: ${left[*]}"
  stop_pids "${left[@]}" || rc=1
fi
# 4. munged last (slurmd/slurmctld need it to shut down cleanly)
p=$(pid_of "$D/run/munged.pid" munged) && { stop_pids "$p" || rc=1; }
mapfile -t left < <(ours munged); [ ${#left[@]} -eq 0 ] || { stop_pids "${left[@]}" || rc=1; }

# 5. network namespaces / bridge made by up.sh ISOLATE=netns (veths go with them)
if [ -f "$D/run/netns" ]; then
  while read -r kind name; do
    case "$kind" in
      ns)   ip netns del "$name" 2>/dev/null || { ip netns list | grep -qw "$name" && { log "cannot delete netns $name"; rc=1; }; } ;;
      link) ip link del "$name" 2>/dev/null || true ;;
    esac
  done < <(tac "$D/run/netns")
  rm -f "$D/run/netns"
fi
rm -f "$D"/run/*.pid "$D/run/up.ok" "$D/munge/sock/munge.sock"*
if [ "${PURGE:-0}" = 1 ]; then
  if [ -e "$D/.mpswrap-slurm-state" ]; then rm -rf "${D:?}"; else log "not purging $D: no up.sh marker in it"; fi
fi
[ $rc = 0 ] || die "some processes could not be stopped"
log "$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "down in %.2fs", b-a}')"
