#!/usr/bin/env bash
# probe_mps.sh OUTDIR -- record what the real nvidia-cuda-mps-control says and does, so the
# simulator (mpswrap/sim) can be checked against it. Root on a GPU machine; touches no GPU
# setting (compute mode, clocks, MIG, persistence stay as they are).
set -u
out=${1:?usage: probe_mps.sh OUTDIR}; mkdir -p "$out"
exec > >(tee "$out/probe.txt") 2>&1
# Commands that fail are findings, recorded; the exit code is 1 only if the probe itself could
# not run (no server) or left MPS processes behind.
fail=0; failed() { echo "PROBE FAILED: $*"; fail=1; }
c() { echo "\$ $*"; "$@"; echo "[exit $?]"; }
ctl() { echo "> $*"; echo "$*" | nvidia-cuda-mps-control; echo "[exit $?]"; }
P=/tmp/probe-mps/pipe L=/tmp/probe-mps/log
rm -rf /tmp/probe-mps; mkdir -p $P $L
export CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_LOG_DIRECTORY=$L
c nvidia-smi --query-gpu=index,uuid,name,driver_version,compute_mode,compute_cap --format=csv
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
c ls /usr/local/nvidia/bin
echo "== no daemon"; ctl get_server_list
echo "== start"; CUDA_VISIBLE_DEVICES=$UUID nvidia-cuda-mps-control -d; echo "[exit $?]"
sleep 0.3; c ls -la $P $L
echo "== second start"; CUDA_VISIBLE_DEVICES=$UUID nvidia-cuda-mps-control -d; echo "[exit $?]"
for cmd in get_server_list get_default_active_thread_percentage "set_default_active_thread_percentage 25" \
  get_default_active_thread_percentage "set_default_device_pinned_mem_limit 0 2G" \
  "get_default_device_pinned_mem_limit 0" "set_default_client_priority 1" get_default_client_priority \
  "no_such_command" "get_client_list 1" "get_server_status 1" "start_server -uid 0" get_server_list; do
  ctl "$cmd"
done
S=$(echo get_server_list | nvidia-cuda-mps-control | head -1)
[ -n "$S" ] || failed "no server listed after start_server"
ctl "get_server_status $S"; ctl "get_active_thread_percentage $S"
python3 - <<'PY' &
import torch, time, os
x = torch.ones(1000, device="cuda")
print("client", os.getpid(), "started", flush=True)
for _ in range(100):
    x = x * 1.0; torch.cuda.synchronize(); time.sleep(0.05)
print("client done", flush=True)
PY
CP=$!
sleep 4
ctl "get_client_list $S"
c ls -la /dev/shm
ctl "get_device_client_list"
ctl "ps"
ctl "terminate_client $S $CP"
wait $CP; echo "client exit $?"
c ls -la /dev/shm
echo "== quit"; ctl quit; sleep 0.3
c ls -la $P
c cat $L/control.log
c cat $L/server.log
echo "== quit -t with busy client"
CUDA_VISIBLE_DEVICES=$UUID nvidia-cuda-mps-control -d; sleep 0.3
python3 -c "import torch,time; x=torch.ones(10,device='cuda'); [ (x.mul_(1.0), torch.cuda.synchronize(), time.sleep(0.05)) for _ in range(200)]" &
CP=$!; sleep 4
time ctl "quit -t 2"
wait $CP; echo "client exit $?"
c tail -5 $L/control.log
echo "== versions"; python3 -c "import sys, psutil, filelock, pynvml, mpi4py; print(sys.version); print(psutil.__version__, filelock.__version__, mpi4py.__version__)"
c nproc; c cat /proc/cpuinfo | grep -c processor; id
echo "== concurrent control commands (8 at once), then concurrent terminate_client"
CUDA_VISIBLE_DEVICES=$UUID nvidia-cuda-mps-control -d; sleep 0.3
# Wait for these PIDs only: a bare wait hung here on the H100 (2026-11-23) after all 8 had ended.
qs=(); for i in 1 2 3 4 5 6 7 8; do (out=$(echo get_server_list | nvidia-cuda-mps-control 2>&1); echo "[$i] rc=$? out=$out") & qs+=($!); done; wait "${qs[@]}"
CPS=()
for i in 1 2 3 4; do /opt/mpswrap-site/cuda_client --seconds 60 & CPS+=($!); done
sleep 5
S=$(echo get_server_list | nvidia-cuda-mps-control | head -1)
ctl "get_client_list $S"
ts=(); for c in "${CPS[@]}"; do (out=$(echo "terminate_client $S $c" | nvidia-cuda-mps-control 2>&1); echo "term $c rc=$? out=$out") & ts+=($!); done; wait "${ts[@]}"
for c in "${CPS[@]}"; do wait "$c"; echo "client $c exit $?"; done
ctl quit; sleep 0.5
c grep -E "Cmd:|Cannot|fail|lock" $L/control.log
# By process name (control and server both show as nvidia-cuda-mps): -f would also match any
# shell whose command line names them.
for _ in $(seq 50); do pgrep -x nvidia-cuda-mps >/dev/null || break; sleep 0.1; done  # 5 s to go
if left=$(pgrep -ax nvidia-cuda-mps); then failed "left behind: $left"; fi
exit $fail
