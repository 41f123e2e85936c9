#!/bin/bash
# Issue #33, the second GPU-machine run (bench/device_sweep.py), with py-spy profiles when .tools/py-spy is carried.
set -u
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
since() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
B=${BENCH_DIR:-/tmp/b}; mkdir -p "$B"
python3 bench/h5_skeleton.py fill bench/data/keras_big_skeleton.h5 "$B/big.h5"; since filled
timeout ${SWEEP_S:-270} python3 bench/device_sweep.py "$B/big.h5" --json-out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.txt"
since "sweep done"
if [ -x .tools/py-spy ]; then
  rm -f "$B/p.pt"
  RNNCONVERT_THREADS=16 timeout 40 .tools/py-spy record -r 50 --native -f raw -o "$OUT/prof_conv16.raw" -- python3 -m rnnconvert "$B/big.h5" "$B/p.pt" -q > /dev/null 2>&1
  since "profile convert 16 $?"
  rm -f "$B/p.pt"
  RNNCONVERT_THREADS=1 timeout 40 .tools/py-spy record -r 50 -f raw -o "$OUT/prof_conv1.raw" -- python3 -m rnnconvert "$B/big.h5" "$B/p.pt" -q > /dev/null 2>&1
  since "profile convert 1 $?"
  timeout 40 .tools/py-spy record -r 50 -f raw -o "$OUT/prof_cuda.raw" -- python3 -m rnnconvert verify "$B/big.h5" "$B/p.pt" --device cuda > /dev/null 2>&1
  since "profile cuda $?"
fi
since "total"
