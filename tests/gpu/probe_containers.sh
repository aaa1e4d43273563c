#!/usr/bin/env bash
# probe_containers.sh OUTDIR -- what a real MPS client needs of the namespaces and mounts a
# container runtime gives it. One daemon (root's, in OUTDIR's pipe directory) serves a
# PyTorch client started under `unshare` with one namespace or mount changed at a time, and
# once as an unprivileged user in a user namespace. For each case: the client's exit code and
# last line, whether the server listed it (and by which PID: the host's or the namespace's),
# and whether terminate_client by the host PID ended it. Root on a GPU machine; touches no GPU
# setting. Findings are recorded, not judged: the exit code is 1 only if the probe could not
# run or left MPS processes behind.
set -u
out=${1:?usage: probe_containers.sh OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/containers.txt") 2>&1
PY=$(command -v "${PROBE_PYTHON:-python3}")
P=/tmp/probe-ct/pipe L=/tmp/probe-ct/log W=/tmp/probe-ct/work
rm -rf /tmp/probe-ct
mkdir -p $P $L $W
chmod 755 /tmp/probe-ct $W
export CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_LOG_DIRECTORY=$L
# The daemon's owner sends its commands: root, then (CTL_USER) the unprivileged user.
ctl() {
  if [ -n "${CTL_USER:-}" ]; then
    echo "$*" | runuser -u "$CTL_USER" -- env CUDA_MPS_PIPE_DIRECTORY=$P nvidia-cuda-mps-control
  else
    echo "$*" | nvidia-cuda-mps-control
  fi
}
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
date -u +%FT%TZ
uname -r
unshare --version | head -1
sysctl kernel.unprivileged_userns_clone kernel.apparmor_restrict_unprivileged_userns 2>/dev/null
# Job users see the machine's PyTorch only through PYTHONPATH (gpu-lab.md).
SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
cat >$W/client.py <<'EOF'
# A PyTorch client: CUDA work for SECONDS, its own view of its PID first.
import os, sys, time
tag, seconds = sys.argv[1], float(sys.argv[2])
import torch
x = torch.ones(1 << 20, device="cuda")
print(f"started pid-in-ns {os.getpid()} uid {os.getuid()}", flush=True)
end = time.time() + seconds
while time.time() < end:
    x.mul_(1.0)
    torch.cuda.synchronize()
    time.sleep(0.01)
print("done", flush=True)
EOF
chmod 644 $W/client.py

CUDA_VISIBLE_DEVICES="$UUID" nvidia-cuda-mps-control -d || { echo "PROBE FAILED: no daemon"; exit 1; }

# case NAME -- COMMAND...: run the client under COMMAND, look at the server's list, then end
# the client by its host PID through terminate_client (if listed) and record how it ended.
case_run() {
  local name=$1 started=0 host="" listed="" inns="" line mark
  shift 2
  mark=$(wc -l <$L/control.log 2>/dev/null || echo 0)
  echo "=== $name: $*"
  rm -f "$W/$name.out"
  timeout 45 "$@" "$W/client.py" "ct-$name" 12 >"$W/$name.out" 2>&1 &
  local runner=$!
  for _ in $(seq 300); do  # up to 30 s for CUDA to start (or the client to fail)
    grep -q "^started" "$W/$name.out" 2>/dev/null && { started=1; break; }
    kill -0 $runner 2>/dev/null || break
    sleep 0.1
  done
  host=$(pgrep -f "client.py ct-$name " | while read -r p; do
    [ "$(readlink /proc/"$p"/exe 2>/dev/null | grep -c python)" = 1 ] && echo "$p"; done | tail -1)
  inns=$(grep -o "pid-in-ns [0-9]*" "$W/$name.out" | awk '{print $2}')
  local servers
  servers=$(ctl get_server_list)
  for s in $servers; do listed="$listed $(ctl "get_client_list $s" | tr '\n' ' ')"; done
  echo "started=$started host_pid=${host:-none} pid_in_ns=${inns:-none} servers=[${servers//$'\n'/ }] listed=[${listed# }]"
  if [ -n "$host" ] && [ -n "$servers" ]; then
    for s in $servers; do
      if echo " $listed " | grep -q " $host "; then
        echo "terminate_client $s $host -> $(ctl "terminate_client $s $host" | tr '\n' ' ')"
      fi
    done
  fi
  local t0=$SECONDS
  wait $runner
  local rc=$?
  line=$(tail -3 "$W/$name.out" | tr '\n' '|')
  echo "exit=$rc after $((SECONDS - t0)) s; output tail: $line"
  echo "control.log for this case (client and credential lines):"
  tail -n +"$((mark + 1))" $L/control.log 2>/dev/null | grep -E "CLIENT|credential|rror|uid" | head -8
}

case_run baseline -- "$PY"
case_run ipc -- unshare --ipc "$PY"
case_run pid -- unshare --pid --fork --mount-proc "$PY"
case_run net -- unshare --net "$PY"
# shellcheck disable=SC2016 # the inner shell expands them
case_run mount-no-pipe -- unshare --mount sh -c 'mount -t tmpfs none /tmp/probe-ct/pipe && exec "$0" "$@"' "$PY"
# shellcheck disable=SC2016
case_run mount-private-shm -- unshare --mount sh -c 'mount -t tmpfs none /dev/shm && exec "$0" "$@"' "$PY"
case_run apptainer-like -- unshare --mount --pid --fork --mount-proc --ipc "$PY"
case_run podman-like-ipc-host -- unshare --mount --pid --fork --mount-proc --net --uts "$PY"
case_run podman-like-all -- unshare --mount --pid --fork --mount-proc --net --uts --ipc "$PY"

echo "=== user namespaces (an unprivileged user's own daemon)"
id mpsprobe >/dev/null 2>&1 || useradd -M -d /tmp mpsprobe
ctl quit
sleep 1
cp $L/control.log "$out/control-root.log" 2>/dev/null
L=/tmp/probe-ct/log-user
mkdir -p $L
chown mpsprobe $P $L
chmod 700 $P $L
runuser -u mpsprobe -- env CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_LOG_DIRECTORY=$L \
  CUDA_VISIBLE_DEVICES="$UUID" nvidia-cuda-mps-control -d
CTL_USER=mpsprobe
case_run user-baseline -- runuser -u mpsprobe -- env CUDA_MPS_PIPE_DIRECTORY=$P PYTHONPATH="$SITE" "$PY"
case_run user-ns-root-mapped -- runuser -u mpsprobe -- env CUDA_MPS_PIPE_DIRECTORY=$P PYTHONPATH="$SITE" unshare --user --map-root-user "$PY"
case_run user-ns-unmapped -- runuser -u mpsprobe -- env CUDA_MPS_PIPE_DIRECTORY=$P PYTHONPATH="$SITE" unshare --user "$PY"
case_run other-uid -- runuser -u nobody -- env CUDA_MPS_PIPE_DIRECTORY=$P PYTHONPATH="$SITE" "$PY"
ctl quit
sleep 2
echo "=== server.log (tail)"
tail -30 $L/server.log 2>/dev/null
echo "=== control.log (tail)"
tail -30 $L/control.log 2>/dev/null
cp $L/control.log "$out/control-user.log" 2>/dev/null
left=$(pgrep -c -f nvidia-cuda-mps)
echo "MPS processes left: $left"
[ "$left" = 0 ]
