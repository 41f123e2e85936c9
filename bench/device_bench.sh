#!/bin/bash
# Issue #33 on a lent GPU machine, one prepared run (docs/gpu-validation.md, docs/performance.md):
#   the cuda-marked tests, then bench/device_table.py on the 3.1 GB Keras file rebuilt from its
#   skeleton (bench/h5_skeleton.py), then py-spy profiles of the cuda and CPU verifications when .tools/py-spy
#   was carried. Everything it reports goes under $OUT (the device tool's folder) or ./device_out.
set -u
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
since() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2; df -h /tmp | tail -1
  python3 -c "import torch, numpy, h5py; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'numpy', numpy.__version__, 'h5py', h5py.__version__)"
} 2>&1 | tee "$OUT/env.txt"
B=${BENCH_DIR:-/tmp/b}; mkdir -p "$B"
python3 bench/h5_skeleton.py fill bench/data/keras_big_skeleton.h5 "$B/big.h5" > "$OUT/fill.txt" 2>&1 &
FILL=$!
RNNCONVERT_CUDA_TESTS=1 timeout ${TEST_S:-150} python3 -m pytest -q -n 12 -p no:cacheprovider \
  tests/verify/test_cuda_verify.py tests/formats/cudnn_buffers/test_cudnn.py tests/verify/test_cuda_target_cpu.py \
  tests/performance/test_parallel.py > "$OUT/tests.txt" 2>&1
since "tests exit $?"; tail -25 "$OUT/tests.txt"
wait $FILL; since "filled"; ls -la "$B"; cat "$OUT/fill.txt"
timeout ${TABLE_S:-300} python3 bench/device_table.py "$B/big.h5" --repeat 2 ${OLD:+--old-exe "env PYTHONPATH=$PWD/.old python3 -m rnnconvert"} --json-out "$OUT/table.json" 2>&1 | tee "$OUT/table.txt"
since "table done"
if [ -x .tools/py-spy ]; then
  python3 -m rnnconvert "$B/big.h5" "$B/p.pt" --no-verify -q
  timeout 90 .tools/py-spy record -r 50 -f raw -o "$OUT/prof_cuda.raw" -- python3 -m rnnconvert verify "$B/big.h5" "$B/p.pt" --device cuda > /dev/null 2>&1
  since "profile cuda $?"
  [ -n "${PROF_CPU:-}" ] && timeout 90 .tools/py-spy record -r 50 -f raw -o "$OUT/prof_cpu.raw" -- python3 -m rnnconvert verify "$B/big.h5" "$B/p.pt" > /dev/null 2>&1
  since "profile cpu $?"
fi
since "total"
