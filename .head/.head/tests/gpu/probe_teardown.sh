#!/usr/bin/env bash
# probe_teardown.sh OUTDIR -- how fast the real MPS ends many clients, three ways, for the
# epilog's per-client cost (about 160 ms a client with 48 clients on an H100, 2026-11-23):
#   serial:   one nvidia-cuda-mps-control process per terminate_client (what mpswrap does);
#   batched:  every terminate_client on the stdin of one control process;
#   shutdown: shutdown_server <pid> -f (man page; not yet seen on a real driver).
# After each: the clients' exit codes, server.log's verdicts, and whether a new client runs.
# Root on a GPU machine, the CUDA test client built (run_gpu_tier.sh does both); touches no
# GPU setting (compute mode, clocks, MIG, persistence stay as they are).
set -u
out=${1:?usage: probe_teardown.sh OUTDIR}; mkdir -p "$out"
exec > >(tee "$out/teardown.txt") 2>&1
CLIENT=${MPS_CONTRACT_CLIENT:-/opt/mpswrap-site/cuda_client}
COUNTS=${PROBE_CLIENTS:-12 48}  # client counts to try, each with every way
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
ms() { date +%s%3N; }
# How each way ends the clients is a finding; the exit code is 1 only if a round could not be
# set up (clients not listed) or MPS processes were left behind.
fail=0; failed() { echo "PROBE FAILED: $*"; fail=1; }
ctl() { echo "$*" | nvidia-cuda-mps-control; }

round() {  # round NAME N: a fresh daemon, N clients, end them the NAME way, report
  local name=$1 N=$2 dir=/tmp/probe-td-$1
  rm -rf "$dir"; mkdir -p "$dir/pipe" "$dir/log"
  export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
  CUDA_VISIBLE_DEVICES=$UUID nvidia-cuda-mps-control -d
  local pids=() i s listed t0 t1
  for ((i = 0; i < N; i++)); do "$CLIENT" --seconds 120 >/dev/null 2>&1 & pids+=($!); done
  for _ in $(seq 100); do  # wait until all N are listed
    s=$(ctl get_server_list | head -1)
    listed=$( [ -n "$s" ] && ctl "get_client_list $s" | grep -c . )
    [ "${listed:-0}" -ge "$N" ] && break; sleep 0.2
  done
  echo "== $name: $N clients listed by server $s"
  [ "${listed:-0}" -ge "$N" ] || failed "$name: only ${listed:-0} of $N clients listed"
  t0=$(ms)
  case $name in
    serial) for p in "${pids[@]}"; do ctl "terminate_client $s $p" >/dev/null; done ;;
    batched) for p in "${pids[@]}"; do echo "terminate_client $s $p"; done \
               | nvidia-cuda-mps-control | sort | uniq -c ;;
    shutdown) ctl "shutdown_server $s -f" ;;
  esac
  t1=$(ms)
  local codes=() left=()
  for _ in $(seq 150); do  # up to 15 s for the clients to go
    left=(); for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
    [ ${#left[@]} -eq 0 ] && break; sleep 0.1
  done
  if [ ${#left[@]} -gt 0 ]; then  # that way did not end them: the safe way, then a wait
    echo "$name: ${#left[@]} clients still running after 15 s; ending them with terminate_client"
    for p in "${left[@]}"; do ctl "terminate_client $s $p" >/dev/null; done
  fi
  for p in "${pids[@]}"; do wait "$p"; codes+=($?); done
  echo "$name: commands took $((t1 - t0)) ms, all clients gone after $(($(ms) - t0)) ms;" \
       "exit codes: $(printf '%s\n' "${codes[@]}" | sort | uniq -c | tr -s ' \n' ' ')"
  echo "server.log: $(grep -c 'Client termination succeeded' "$dir/log/server.log" 2>/dev/null) terminations," \
       "$(grep -ci 'fatal' "$dir/log/server.log" 2>/dev/null) fatal lines"
  t0=$(ms); "$CLIENT" --seconds 1 >/dev/null 2>&1; echo "a new client after it: exit $? in $(($(ms) - t0)) ms"
  t0=$(ms); ctl quit; echo "quit: $(($(ms) - t0)) ms"
  # By process name (control and server both show as nvidia-cuda-mps): -f would also match any
  # shell whose command line names them.
  for _ in $(seq 50); do pgrep -x nvidia-cuda-mps >/dev/null || break; sleep 0.1; done  # 5 s to go
  pgrep -x nvidia-cuda-mps >/dev/null && failed "LEFT: $(pgrep -ax nvidia-cuda-mps)"
  tail -3 "$dir/log/control.log"
}
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for n in $COUNTS; do
  for name in serial batched shutdown; do round "$name" "$n"; done
done
exit $fail
