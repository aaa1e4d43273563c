#!/usr/bin/env bash
# startup_costs.sh PYTHON -- where a Python start of mpswrap's per-rank path goes on this
# machine: the bare interpreter (with and without site-packages), its dependencies, the
# modules a per-rank supervisor imports, and -X importtime's heaviest entries. Prints a report.
set -uo pipefail
PY=${1:-python3}
fail=0  # 1 once a measured command failed: its time would mean nothing
median_ms() {  # median_ms ARGS... : median wall time of 11 runs of PY ARGS
  "$PY" - "$@" <<'PYEOF' || { echo "FAILED: python $*"; fail=1; }
import statistics, subprocess, sys, time
times = []
for _ in range(11):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *sys.argv[1:]], check=True, stdout=subprocess.DEVNULL)
    times.append(time.perf_counter() - t0)
print(f"{statistics.median(times) * 1000:7.1f} ms  python {' '.join(sys.argv[1:])}")
PYEOF
}
date -u +%FT%TZ; "$PY" -VV; nproc
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-} PYTHONPATH=${PYTHONPATH:-}"
# Python's own modules without bytecode are compiled at every start (nothing is written under
# PYTHONDONTWRITEBYTECODE): a distribution's python3 package installs them compiled.
"$PY" - <<'PYEOF'
import importlib.util, os, sysconfig
lib = sysconfig.get_path("stdlib")
names = ["typing", "dataclasses", "inspect", "logging", "pathlib", "argparse", "json", "shutil"]
have = [n for n in names if os.path.exists(importlib.util.cache_from_source(
    importlib.util.find_spec(n).origin))]
print(f"stdlib {lib}: bytecode for {len(have)} of {len(names)} of {', '.join(names)}")
PYEOF
median_ms -S -c pass
median_ms -I -c pass
median_ms -c pass
median_ms -c "import psutil"
median_ms -c "import filelock"
median_ms -c "import mpswrap"
median_ms -c "import mpswrap.entry.launch"
median_ms -m mpswrap --version
echo "--- -X importtime, import mpswrap.entry.launch: heaviest cumulative entries (us)"
"$PY" -X importtime -c "import mpswrap.entry.launch" 2>&1 >/dev/null \
  | awk -F'|' 'NR > 1 { print $2 "|" $3 }' | sort -n -r | head -30
echo "--- site-packages .pth files"
"$PY" -c 'import site; print(*site.getsitepackages(), sep="\n")' | while read -r d; do
  ls "$d"/*.pth 2>/dev/null
done
exit $fail
