#!/usr/bin/env bash
# probe_mps_start.sh OUTDIR -- how long MPS's own `nvidia-cuda-mps-control -d` takes for one
# GPU and for every GPU of the machine at once, without mpswrap: the floor under the prolog of
# a job of several GPUs (on four H200s mpswrap's prolog launched the four `-d` within 36 ms and
# they returned 220 to 426 ms later, 2026-11-28). Each round: a bare daemon with
# CUDA_VISIBLE_DEVICES=<index> in its own pipe and log directory, all of a round's launched
# together, each timed to its return, then `quit` and a wait until no MPS process is left.
# Rounds of four kinds: bare (`none`); the GPU named by UUID (`uuid`); by UUID and started as
# mpswrap starts it, as an unprivileged user in that user's directories, pinned to 4 CPUs
# (`asjob`); bare with a process holding NVML open on every GPU beside them (`held`).
# The GPUs' persistence mode is read and printed, never changed (nor any other GPU setting).
# Root on a GPU machine with no MPS process running; exit 1 if one is found or left behind.
set -u
out=${1:?usage: probe_mps_start.sh OUTDIR}; mkdir -p "$out"
exec > >(tee "$out/mps-start.txt") 2>&1
ROUNDS=${PROBE_ROUNDS:-3}
N=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | grep -c .)
work=$(mktemp -d /tmp/probe-mps-start.XXXXXX)
ms() { date +%s%3N; }
# The MPS programs themselves (not a shell whose command line names them).
MPS='^([^ ]*/)?nvidia-cuda-mps-(control|server)( |$)'
running() { pgrep -f "$MPS" >/dev/null; }
gone() {  # wait (10 s at most) until no MPS process is left; else say so and fail
  for _ in $(seq 100); do running || return 0; sleep 0.1; done
  echo "PROBE FAILED: MPS processes left: $(pgrep -fa "$MPS" | tr '\n' ';')"
  exit 1
}
if running; then
  echo "PROBE FAILED: MPS already running: $(pgrep -fa "$MPS" | tr '\n' ';')"
  exit 1
fi
holder=
trap '[ -n "$holder" ] && kill "$holder" 2>/dev/null; rm -rf "$work"' EXIT

mapfile -t UUIDS < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)
USER_=mpsstartprobe
id "$USER_" >/dev/null 2>&1 || useradd -M -d /tmp "$USER_"
chmod 755 "$work"

round() {  # round LABEL COUNT ROUND: COUNT daemons of kind LABEL launched together
  local label=$1 n=$2 r=$3 base=$work/$1-$2-$3 t0 i pids=() as=() dev
  [ "$label" = asjob ] && as=(setpriv --reuid="$USER_" --regid="$USER_" --init-groups
    env HOME=/tmp taskset -c 0-3)
  t0=$(ms)
  for ((i = 0; i < n; i++)); do
    mkdir -p "$base/g$i/pipe" "$base/g$i/log"
    [ "$label" = asjob ] && chown -R "$USER_:" "$base"
    dev=$i
    [ "$label" = uuid ] || [ "$label" = asjob ] && dev=${UUIDS[$i]}
    (
      s=$(ms)
      CUDA_VISIBLE_DEVICES=$dev CUDA_MPS_PIPE_DIRECTORY=$base/g$i/pipe \
        CUDA_MPS_LOG_DIRECTORY=$base/g$i/log "${as[@]}" nvidia-cuda-mps-control -d
      echo "$label gpus=$n round=$r g$i d_ms=$(($(ms) - s))"
    ) &
    pids+=($!)
  done
  wait "${pids[@]}"  # these launches, not the NVML holder
  echo "$label gpus=$n round=$r all_ms=$(($(ms) - t0))"
  for ((i = 0; i < n; i++)); do
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$base/g$i/pipe "${as[@]}" nvidia-cuda-mps-control
  done
  gone
}

nvidia-smi --query-gpu=index,persistence_mode --format=csv
for kind in none uuid asjob; do
  for ((r = 1; r <= ROUNDS; r++)); do round "$kind" 1 "$r"; round "$kind" "$N" "$r"; done
done
python3 -c '
import ctypes, time
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
print("holder: NVML open on every GPU", flush=True)
time.sleep(600)  # until the probe ends it
' &
holder=$!
sleep 2
for ((r = 1; r <= ROUNDS; r++)); do round held 1 "$r"; round held "$N" "$r"; done
exit 0
