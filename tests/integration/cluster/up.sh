#!/usr/bin/env bash
# up.sh STATE_DIR -- bring up a throw-away, single-machine Slurm cluster for tests.
#
#   munged (private key + socket) + slurmctld + N x slurmd ("multiple-slurmd",
#   node1..nodeN, all on 127.0.0.1 with their own ports), fake GPUs as GRES,
#   a Prolog/Epilog that records their environment.  Everything (config, keys,
#   sockets, pid files, logs, spool, state) lives under STATE_DIR; nothing in
#   /etc is used or changed (apart from installing the Debian packages if they
#   are missing).  Verified on Debian 12 (bookworm), slurm-wlm 22.05.8, munge
#   0.5.15, as root, no systemd, no cgroup plugins, no GPU.
#
# This is the project's own copy of the lab harness (shared/lab/up.sh, tested
# there); tests/integration/harness.py drives it.  Differences from the lab copy:
# TASK_PROLOG is checked like PROLOG/EPILOG, and shellcheck-clean.
#
# Usage:   up.sh STATE_DIR            (then:  source STATE_DIR/env.sh)
# Stop:    down.sh STATE_DIR
#
# STATE_DIR must be empty or carry up.sh's marker file .mpswrap-slurm-state.
# up.sh only ever removes its own subdirectories (etc munge run log spool ctld
# dev records hooks) and env.sh; a caller that created STATE_DIR itself (e.g.
# with mktemp -d) may create the marker first and keep its own files beside
# them (the test harness installs the mpswrap hooks in STATE_DIR/hooks-installed
# before up.sh, because up.sh checks that the hooks exist).
#
# Idempotent: if the cluster in STATE_DIR is already up and healthy it exits 0
# at once; if it is half up (stale pid files, dead daemons) it is stopped
# (down.sh) and rebuilt from scratch.  Exits non-zero with "up.sh: ERROR: ..."
# and the tail of the relevant log on any failure.
#
# Knobs (environment variables, all optional):
#   NODES=1            number of slurmd daemons / nodes (node1..nodeN)
#   CPUS_PER_NODE=4    CPUs each node claims (may exceed the real cores:
#                      SlurmdParameters=config_overrides); = max concurrent
#                      1-CPU jobs per node
#   GPUS_PER_NODE=2    fake GPUs per node (gres "gpu"); 0 = no GRES at all
#   GPU_MINORS=        the device minor number of each fake GPU, in gres.conf order (default
#                      0 1 ... GPUS_PER_NODE-1); on a real GPU machine the real GPUs' minors
#                      (nvidia-smi -q: Minor Number), so that a gres position names that GPU
#   SHARING=mps        extra sharing GRES on those GPUs: mps | shard | none
#                      (do NOT configure both: 22.05 then computes a wrong
#                      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
#   MPS_PER_GPU=100    mps count per GPU   (SHARING=mps)
#   SHARDS_PER_GPU=4   shard count per GPU (SHARING=shard)
#   PROLOG=, EPILOG=   scripts to use as Prolog=/Epilog= (absolute paths,
#                      executable, readable by root; "none": no such line, e.g.
#                      for a test that adds the lines itself). Default: the built-in
#                      recorders below, which write the environment to
#                      STATE_DIR/records/{prolog,epilog}.JOBID.NODE.env and then
#                      exec STATE_DIR/hooks/{prolog,epilog} if it is executable
#                      (so a test can swap hooks without reconfiguring Slurm).
#   TASK_PROLOG=       script to use as TaskProlog= (absolute path; runs as the job
#                      user for each task; its "export NAME=value" lines reach the task;
#                      it must be readable and executable by job users)
#   EXTRA_CONF=        more slurm.conf lines (\n for newlines)
#   SELECT_PARAMS=CR_Core  SelectTypeParameters= (e.g. CR_Core,MULTIPLE_SHARING_GRES_PJ on
#                      23.11+: one job may take gres/mps shares of several GPUs of a node)
#   FEATURES=          Features= of every node (e.g. "mps", for --constraint=mps)
#   PROCTRACK=, TASK_PLUGIN=  default proctrack/linuxproc and task/none; the cgroup plugins
#                      need CGROUP_CONF (e.g. with ConstrainDevices=yes) and a cgroup v2 host
#   PROLOG_FLAGS=Alloc PrologFlags= value ("" for none). Alloc makes srun wait
#                      for a slow prolog; without it srun's launch RPC times
#                      out after ~2*MessageTimeout (20 s).
#   PROLOG_TIMEOUT=    PrologEpilogTimeout= seconds (default: unlimited)
#   CTLD_PORT=         slurmctld port (default: first free port from PORT_BASE)
#   PORT_BASE=6817     where the search for free ports starts (a second Slurm version's
#                      tier on the same machine runs from another base)
#   SLURMD_PORT=       first slurmd port (default: first free ports after it)
#   DEBUG_LEVEL=verbose  SlurmctldDebug/SlurmdDebug (info|verbose|debug|debug2)
#   SMOKE=1            run "srun -N$NODES hostname" at the end (0 = skip)
#   INSTALL=1          apt-get install the Debian packages if missing (0 = fail)
#   UP_TIMEOUT=30      seconds to wait for the nodes to become idle
#   CGROUP_CONF=       text of STATE_DIR/etc/cgroup.conf (\n for newlines), e.g.
#                      "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n" on a cgroup-v2-only
#                      machine without systemd (see ../notes/gpu-lab.md)
#   PLUGSTACK=         text of STATE_DIR/etc/plugstack.conf (\n for newlines): SPANK plugins
#                      (Slurm reads plugstack.conf beside slurm.conf: no slurm.conf line)
#   JOB_CONTAINER_CONF=  text of STATE_DIR/etc/job_container.conf (\n for newlines), for
#                      JobContainerType=job_container/tmpfs in EXTRA_CONF (which also needs
#                      PROLOG_FLAGS=Alloc,Contain)
#   ISOLATE=none       none : all slurmd on 127.0.0.1, `hostname` in jobs = real host
#                      uts  : each slurmd in its own UTS namespace, so `hostname`
#                             in a job (and in prolog/epilog) prints nodeK
#                      netns: uts + each slurmd in its own network namespace
#                             (10.213.X.1K on a private bridge 10.213.X.1 that
#                             this script creates; needs CAP_NET_ADMIN)
set -euo pipefail

die() { echo "up.sh: ERROR: $*" >&2; exit 1; }
log() { echo "up.sh: $*" >&2; }
now() { date +%s.%N; }
T0=$(now)

[ $# -eq 1 ] || die "usage: $0 STATE_DIR"
[ "$(id -u)" = 0 ] || die "must run as root (slurmd/prolog must run as root)"
mkdir -p "$1" || die "cannot create $1"
D=$(cd "$1" && pwd -P)       # absolute, symlink-free path
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# Safety: we rm -rf subdirectories of STATE_DIR (etc, run, ...), so only ever
# work in an empty directory or in one that up.sh has marked as its own.
[ "$D" != / ] || die "STATE_DIR must not be /"
if [ ! -e "$D/.mpswrap-slurm-state" ]; then
  [ -z "$(ls -A "$D")" ] || die "$D is not empty and was not made by up.sh; refusing to use it"
  touch "$D/.mpswrap-slurm-state"
fi

NODES=${NODES:-1}; CPUS_PER_NODE=${CPUS_PER_NODE:-4}; GPUS_PER_NODE=${GPUS_PER_NODE:-2}
SHARING=${SHARING:-mps}; MPS_PER_GPU=${MPS_PER_GPU:-100}; SHARDS_PER_GPU=${SHARDS_PER_GPU:-4}
PROLOG_FLAGS=${PROLOG_FLAGS-Alloc}; DEBUG_LEVEL=${DEBUG_LEVEL:-verbose}
SMOKE=${SMOKE:-1}; INSTALL=${INSTALL:-1}; UP_TIMEOUT=${UP_TIMEOUT:-30}; ISOLATE=${ISOLATE:-none}
case "$SHARING" in mps|shard|none) ;; *) die "SHARING must be mps, shard or none";; esac
case "$ISOLATE" in none|uts|netns) ;; *) die "ISOLATE must be none, uts or netns";; esac
[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive integer"
[[ $GPUS_PER_NODE =~ ^[0-9]+$ ]] || die "GPUS_PER_NODE must be an integer"
[ "$GPUS_PER_NODE" -gt 0 ] || SHARING=none
read -ra MINORS <<<"${GPU_MINORS:-$(seq -s ' ' 0 $((GPUS_PER_NODE - 1)))}"
[ "${#MINORS[@]}" = "$GPUS_PER_NODE" ] || die "GPU_MINORS names ${#MINORS[@]} minors for $GPUS_PER_NODE GPUs"
for m in "${MINORS[@]}"; do [[ $m =~ ^[0-9]+$ ]] || die "GPU_MINORS: '$m' is not a minor number"; done

export SLURM_CONF=$D/etc/slurm.conf

# ---------------------------------------------------------------- idempotency
alive() {  # alive PIDFILE -> 0 if the pid in it runs (zombies count as dead)
  local p st; p=$(cat "$1" 2>/dev/null) || return 1; [[ $p =~ ^[0-9]+$ ]] || return 1
  st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
if [ -f "$D/run/up.ok" ]; then
  healthy=1
  for pf in "$D"/run/munged.pid "$D"/run/slurmctld.pid "$D"/run/slurmd.*.pid; do
    alive "$pf" || healthy=0
  done
  if [ $healthy = 1 ] && timeout 10 scontrol ping >/dev/null 2>&1 &&
     ! timeout 10 sinfo -h -N -o '%t' | grep -qvE '^(idle|mix|alloc|comp)$'; then
    log "already up ($D); source $D/env.sh"; exit 0
  fi
  log "found a stale/partial cluster in $D: tearing it down first"
fi
if compgen -G "$D/run/*.pid" >/dev/null || [ -f "$D/run/netns" ]; then
  "$HERE/down.sh" "$D" || die "down.sh failed on the old state in $D"
fi

# From here on, a failure must not leave daemons/namespaces behind.
UP_OK=0
trap 'if [ $UP_OK != 1 ]; then log "cleaning up after failure (logs kept in $D/log)";
        "$HERE/down.sh" "$D" >&2 || true; fi' EXIT

# ------------------------------------------------------------------- packages
need=(slurmctld slurmd srun sinfo scontrol munged mungekey munge unmunge)
missing=0; for b in "${need[@]}"; do command -v "$b" >/dev/null || missing=1; done
if [ $missing = 1 ]; then
  [ "$INSTALL" = 1 ] || die "Slurm/munge not installed (apt-get install slurmctld slurmd slurm-client munge)"
  log "installing slurmctld slurmd slurm-client munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge; } >"${TMPDIR:-/tmp}/mpswrap-slurm-apt.log" 2>&1 ||
    { tail -20 "${TMPDIR:-/tmp}/mpswrap-slurm-apt.log" >&2; die "apt-get install failed"; }
  for b in "${need[@]}"; do command -v "$b" >/dev/null || die "$b still missing after install"; done
fi
T_INST=$(now)

# ------------------------------------------------------------ fresh state dir
# Wipe only what we own; keep the directory itself (the caller may have made it).
rm -rf "${D:?}"/{etc,munge,run,log,spool,ctld,dev,records,hooks} "${D:?}/env.sh"
mkdir -p "$D"/{etc,munge/key,munge/sock,run,log,spool,ctld,dev,records,hooks}
# Jobs of non-root users must reach slurm.conf and the munge socket: 0755 all
# the way (mktemp -d makes 0700!). munged insists on a 0700 key dir and on a
# socket dir that is executable by everyone.
chmod 0755 "$D" "$D"/{etc,munge,munge/sock,run,log,spool,ctld,dev,records,hooks}
chmod 0700 "$D/munge/key"
p=$D; while [ "$p" != / ]; do p=$(dirname "$p")
  if [ ! -x "$p" ] || [ "$(stat -c %A "$p" | cut -c10)" = - ]; then
    log "warning: $p is not world-traversable: jobs of non-root users will fail"
  fi
done

# ---------------------------------------------------------------------- ports
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
declare -A TAKEN=()
pick_port() {  # pick_port START -> first port >= START that nothing listens on
  local p=$1; while port_busy "$p" || [ -n "${TAKEN[$p]:-}" ]; do p=$((p+1)); done
  TAKEN[$p]=1; echo "$p"
}
CTLD_PORT=${CTLD_PORT:-$(pick_port "${PORT_BASE:-6817}")}; TAKEN[$CTLD_PORT]=1
port_busy "$CTLD_PORT" && die "CTLD_PORT $CTLD_PORT is in use"
SD_PORTS=(); next=${SLURMD_PORT:-$((CTLD_PORT+1))}
for ((i=1; i<=NODES; i++)); do p=$(pick_port "$next"); SD_PORTS+=("$p"); next=$((p+1)); done

# ------------------------------------------------------------------- hostname
# slurmctld only starts if SlurmctldHost names this machine (short hostname);
# the "(127.0.0.1)" part means nothing has to resolve it.  All slurmd listen
# on 127.0.0.1 (NodeAddr) with their own Port.
H=$(hostname -s)
getent hosts "$H" >/dev/null ||
  log "warning: hostname '$H' does not resolve (add '127.0.0.1 $H' to /etc/hosts if srun fails)"

# ----------------------------------------------------------- node isolation
# CTLD_ADDR: where slurmd and clients reach slurmctld; NODE_ADDR[k]: slurmd k.
CTLD_ADDR=127.0.0.1; NODE_ADDR=(); NODE_HOST=()
for ((n=1; n<=NODES; n++)); do NODE_ADDR+=(127.0.0.1); NODE_HOST+=("$H"); done
[ "$ISOLATE" = none ] || { command -v unshare >/dev/null || die "ISOLATE=$ISOLATE needs unshare (util-linux)"; }
if [ "$ISOLATE" != none ]; then NODE_HOST=(); for ((n=1; n<=NODES; n++)); do NODE_HOST+=("node$n"); done; fi
if [ "$ISOLATE" = netns ]; then
  { command -v ip >/dev/null && command -v nsenter >/dev/null; } || die "ISOLATE=netns needs ip (iproute2) and nsenter"
  [ "$NODES" -le 200 ] || die "ISOLATE=netns supports at most 200 nodes"
  tag=$(printf %s "$D" | md5sum | cut -c1-6)   # unique names per STATE_DIR
  X=$(( 16#${tag:0:2} % 250 + 1 ))             # pick a free 10.213.X.0/24
  for ((i=0; i<250; i++)); do
    ip -o -4 addr show | grep -q " 10\.213\.$X\." || break; X=$(( X % 250 + 1 ))
  done
  ip -o -4 addr show | grep -q " 10\.213\.$X\." && die "no free 10.213.X.0/24 subnet"
  br=mpswb$tag; CTLD_ADDR=10.213.$X.1
  : >"$D/run/netns"                           # what down.sh must delete
  { ip link add "$br" type bridge && echo "link $br" >>"$D/run/netns" &&
    ip addr add "$CTLD_ADDR/24" dev "$br" && ip link set "$br" up; } ||
    die "cannot create bridge $br (need CAP_NET_ADMIN)"
  NODE_ADDR=()
  for ((n=1; n<=NODES; n++)); do
    ns=mpsw-$tag-n$n; addr=10.213.$X.$((10+n)); NODE_ADDR+=("$addr")
    { ip netns add "$ns" && echo "ns $ns" >>"$D/run/netns" &&
      ip link add "mpsw$tag$n" type veth peer name eth0 netns "$ns" &&
      ip link set "mpsw$tag$n" master "$br" up &&
      ip -n "$ns" addr add "$addr/24" dev eth0 &&
      ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up; } ||
      die "cannot set up network namespace $ns"
  done
fi
# start_slurmd K: start slurmd for nodeK inside its namespaces (if any).
# NB: use nsenter --net, NOT "ip netns exec": the latter remounts /sys, which
# hides /sys/fs/cgroup, and slurmd 22.05 then dies with "Unable to initialize
# cgroup plugin" even with proctrack/linuxproc + task/none.
start_slurmd() {
  local k=$1 pre=()
  [ "$ISOLATE" = netns ] && pre=(nsenter "--net=/run/netns/mpsw-$tag-n$k")
  if [ "$ISOLATE" = none ]; then
    "${pre[@]}" slurmd -N "node$k"
  else
    # shellcheck disable=SC2016  # $1 is expanded by the inner sh, on purpose
    "${pre[@]}" unshare --uts sh -c 'hostname "$1" && exec slurmd -N "$1"' sh "node$k"
  fi
}

# ---------------------------------------------------------------------- munge
mungekey -c -b 1024 -k "$D/munge/key/munge.key" || die "mungekey failed"
munged --socket="$D/munge/sock/munge.sock" --key-file="$D/munge/key/munge.key" \
       --pid-file="$D/run/munged.pid" --seed-file="$D/munge/key/munged.seed" \
       --log-file="$D/log/munged.log" </dev/null >>"$D/log/munged.stdout" 2>&1 ||
  { tail "$D/log/munged.log" >&2; die "munged failed to start"; }
munge -n -S "$D/munge/sock/munge.sock" | unmunge -S "$D/munge/sock/munge.sock" >/dev/null ||
  die "munge round trip failed (see $D/log/munged.log)"

# ------------------------------------------------------------------ fake GPUs
# Slurm only needs File= to name a character device (it stat()s it; a regular
# file is rejected with "not a valid character or block device" and then no
# CUDA_VISIBLE_DEVICES/SLURM_JOB_GPUS is set at all).  We mknod c 195 N
# (the nvidia major; N from GPU_MINORS) under STATE_DIR; no driver is needed since
# nothing opens them.  If mknod is not allowed, fall back to distinct existing char devices.
gpu_files=()  # gpu_files[node-1] = space separated device paths
fallback=(/dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty)
for ((n=1; n<=NODES; n++)); do
  files=""
  for ((g=0; g<GPUS_PER_NODE; g++)); do
    f=$D/dev/node$n/nvidia$g; mkdir -p "$D/dev/node$n"; chmod 0755 "$D/dev/node$n"
    if ! mknod -m 0666 "$f" c 195 "${MINORS[g]}" 2>/dev/null; then
      [ "$g" -lt ${#fallback[@]} ] || die "mknod not permitted and GPUS_PER_NODE>${#fallback[@]}"
      f=${fallback[$g]}
    fi
    files+="$f "
  done
  gpu_files+=("$files")
done

# ----------------------------------------------------------- prolog / epilog
# Recorder: dump the exact environment slurmd gives us, atomically, then hand
# over to a hook (same environment, minus nothing; bash adds PWD/SHLVL/_).
# NB: slurmd gives prolog/epilog NO PATH, HOME or LANG; stdout/stderr are a
# pipe that slurmd reads until EOF (and logs on failure).
for ctx in prolog epilog; do
  cat >"$D/etc/$ctx.sh" <<EOF
#!/bin/bash
# generated by up.sh: record the $ctx environment, then run hooks/$ctx if any
out=$D/records/$ctx.\${SLURM_JOB_ID:-0}.\${SLURMD_NODENAME:-x}.env
{ echo "# uid=\$(id -u) ppid=\$PPID time=\$(date +%s.%N)"; env -0 | sort -z | tr '\0' '\n'; } >"\$out.tmp" && mv "\$out.tmp" "\$out"
[ -x $D/hooks/$ctx ] && exec $D/hooks/$ctx "\$@"
exit 0
EOF
  chmod 0755 "$D/etc/$ctx.sh"
done
PROLOG=${PROLOG:-$D/etc/prolog.sh}; EPILOG=${EPILOG:-$D/etc/epilog.sh}
for s in "$PROLOG" "$EPILOG" ${TASK_PROLOG:+"$TASK_PROLOG"}; do
  [ "$s" != none ] || continue
  { [[ $s = /* ]] && [ -x "$s" ]; } || die "prolog/epilog/task prolog '$s' is not an absolute path to an executable"
done
# The TaskProlog runs as the job user: a root-only file fails every task.
if [ -n "${TASK_PROLOG:-}" ] && [ "$(stat -c %A "$TASK_PROLOG" | cut -c8,10)" != rx ]; then
  log "warning: $TASK_PROLOG is not readable and executable by other users: tasks will fail"
fi

# ----------------------------------------------------------------- slurm.conf
GRES_TYPES=""; [ "$GPUS_PER_NODE" -gt 0 ] && GRES_TYPES=gpu
[ "$SHARING" = mps ] && GRES_TYPES+=",mps"; [ "$SHARING" = shard ] && GRES_TYPES+=",shard"
node_gres=""
[ -z "${FEATURES:-}" ] || node_gres="Features=$FEATURES "
if [ "$GPUS_PER_NODE" -gt 0 ]; then
  node_gres+="Gres=gpu:$GPUS_PER_NODE"
  [ "$SHARING" = mps ] && node_gres+=",mps:$((MPS_PER_GPU*GPUS_PER_NODE))"
  [ "$SHARING" = shard ] && node_gres+=",shard:$((SHARDS_PER_GPU*GPUS_PER_NODE))"
fi
{
cat <<EOF
# generated by up.sh for a single-machine test cluster (Slurm 22.05, Debian)
ClusterName=mpswrap
SlurmctldHost=$H($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
# root everywhere: no slurm user, no file ownership games
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/sock/munge.sock
StateSaveLocation=$D/ctld
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
SlurmctldDebug=$DEBUG_LEVEL
SlurmdDebug=$DEBUG_LEVEL
# no systemd, no cgroups: track processes via /proc, no task binding
ProctrackType=${PROCTRACK:-proctrack/linuxproc}
TaskPlugin=${TASK_PLUGIN:-task/none}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# no slurmdbd (so no sacct); finished jobs are appended to this text file
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
MailProg=/bin/true
SchedulerType=sched/backfill
# start batch jobs ~1 s after sbatch instead of up to ~3 s (srun starts at once)
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=${SELECT_PARAMS:-CR_Core}
MpiDefault=none
# nodes may claim more CPUs/memory than the machine has
SlurmdParameters=config_overrides
# a node that was DOWN comes back by itself when its slurmd registers
ReturnToService=2
InactiveLimit=0
# finished jobs stay visible to "scontrol show job" for 5 minutes
MinJobAge=300
KillWait=5
Waittime=0
EOF
[ "$PROLOG" = none ] || echo "Prolog=$PROLOG"
[ "$EPILOG" = none ] || echo "Epilog=$EPILOG"
[ -n "$PROLOG_FLAGS" ] && echo "PrologFlags=$PROLOG_FLAGS"
[ -n "${TASK_PROLOG:-}" ] && echo "TaskProlog=$TASK_PROLOG"
[ -n "${EXTRA_CONF:-}" ] && printf "%b\n" "$EXTRA_CONF"
[ -n "${PROLOG_TIMEOUT:-}" ] && echo "PrologEpilogTimeout=$PROLOG_TIMEOUT"
[ -n "$GRES_TYPES" ] && echo "GresTypes=$GRES_TYPES"
for ((n=1; n<=NODES; n++)); do
  echo "NodeName=node$n NodeHostname=${NODE_HOST[n-1]} NodeAddr=${NODE_ADDR[n-1]} Port=${SD_PORTS[n-1]} CPUs=$CPUS_PER_NODE RealMemory=1000 $node_gres State=UNKNOWN"
done
echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$D/etc/slurm.conf"

{
echo "# generated by up.sh: fake GPUs (character devices, never opened)"
echo "AutoDetect=off"
for ((n=1; n<=NODES; n++)); do
  for f in ${gpu_files[n-1]}; do
    echo "NodeName=node$n Name=gpu File=$f"
    [ "$SHARING" = mps ] && echo "NodeName=node$n Name=mps Count=$MPS_PER_GPU File=$f"
    [ "$SHARING" = shard ] && echo "NodeName=node$n Name=shard Count=$SHARDS_PER_GPU File=$f"
  done
done
} >"$D/etc/gres.conf"
chmod 0644 "$D/etc/slurm.conf" "$D/etc/gres.conf"
# cgroup.conf, only when asked (the GPU machine has cgroup v2 only and no systemd)
if [ -n "${CGROUP_CONF:-}" ]; then printf "%b" "$CGROUP_CONF" >"$D/etc/cgroup.conf"; chmod 0644 "$D/etc/cgroup.conf"; fi
if [ -n "${PLUGSTACK:-}" ]; then printf "%b" "$PLUGSTACK" >"$D/etc/plugstack.conf"; chmod 0644 "$D/etc/plugstack.conf"; fi
if [ -n "${JOB_CONTAINER_CONF:-}" ]; then
  printf "%b" "$JOB_CONTAINER_CONF" >"$D/etc/job_container.conf"; chmod 0644 "$D/etc/job_container.conf"
fi

cat >"$D/env.sh" <<EOF
# source me: points the Slurm client commands at the test cluster in $D
export SLURM_CONF=$D/etc/slurm.conf
EOF

# -------------------------------------------------------------------- daemons
cd /   # daemons must not pin the caller's cwd
T_CONF=$(now)
slurmctld -c </dev/null >>"$D/log/slurmctld.stdout" 2>&1 ||
  { tail -n 20 "$D/log/slurmctld.log" "$D/log/slurmctld.stdout" >&2 || true; die "slurmctld failed to start"; }
for ((n=1; n<=NODES; n++)); do
  start_slurmd "$n" </dev/null >>"$D/log/slurmd.node$n.stdout" 2>&1 ||
    { tail -n 20 "$D/log/slurmd.node$n.log" "$D/log/slurmd.node$n.stdout" >&2 || true; die "slurmd node$n failed to start"; }
done

# ------------------------------------------------------------ wait until idle
deadline=$(( $(date +%s) + UP_TIMEOUT ))
while :; do
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
  nidle=$(grep -cE ' idle$' <<<"$states" || true)
  [ "$nidle" = "$NODES" ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "--- sinfo:" >&2; sinfo -N -o '%N %t %E' >&2 || true
    tail -n 15 "$D/log/slurmctld.log" "$D"/log/slurmd.node*.log >&2 || true
    die "nodes not idle after ${UP_TIMEOUT}s (logs in $D/log)"
  fi
  sleep 0.1
done
alive "$D/run/slurmctld.pid" || die "slurmctld died (see $D/log/slurmctld.log)"
T_IDLE=$(now)

if [ "$SMOKE" = 1 ]; then
  out=$(timeout 60 srun -Q -N"$NODES" -n"$NODES" hostname 2>&1) ||
    { echo "$out" >&2; tail -n 15 "$D"/log/slurmd.node*.log >&2; die "smoke test 'srun -N$NODES hostname' failed"; }
fi
T_END=$(now)
touch "$D/run/up.ok"; UP_OK=1
log "$(awk -v a="$T0" -v b="$T_INST" -v c="$T_CONF" -v d="$T_IDLE" -v e="$T_END" \
  -v n="$NODES" -v p="$CTLD_PORT" -v dir="$D" 'BEGIN { printf "up in %.2fs (prep+packages %.2fs, daemons->idle %.2fs, smoke job %.2fs): %d node(s), slurmctld port %s; source %s/env.sh", e-a, b-a, d-c, e-d, n, p, dir }')"
