#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): what the card is, the `gpu` tests, and the
# repeatability benchmark on the GPU configurations. Runs from the repository root with the
# machine's own python3 (its torch, botorch, gpytorch, pandas); the package by PYTHONPATH.
# Logs and JSON go to $OUT (default runs/gpu).
#   bash benchmarks/gpu_check.sh            # both, ~10 min on an H200 (tests ~5, benchmark ~5)
#   bash benchmarks/gpu_check.sh tests      # the gpu tests only
#   bash benchmarks/gpu_check.sh repeat 3   # the benchmark only, 3 repeats per configuration
set -u
what=${1:-all}; repeats=${2:-3}
# Time limits (s) of the two parts, to fit a lease: TESTS_TIMEOUT=250 REPEAT_TIMEOUT=220 bash ...
TESTS_TIMEOUT=${TESTS_TIMEOUT:-400}; REPEAT_TIMEOUT=${REPEAT_TIMEOUT:-330}
OUT=${OUT:-runs/gpu}; mkdir -p "$OUT"
export PYTHONPATH=$PWD CUBICML_LAB_CACHE_DIR=$OUT/cache PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
  nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active,temperature.gpu --format=csv,noheader,nounits
  $PY -c "import torch, botorch, gpytorch, pandas; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)); print('botorch', botorch.__version__, 'gpytorch', gpytorch.__version__, 'pandas', pandas.__version__)"
  nproc; cat /proc/loadavg
} 2>&1 | tee "$OUT/env.txt"
if [ "$what" != repeat ]; then
  timeout "$TESTS_TIMEOUT" $PY -m pytest -p no:cacheprovider -m gpu -s -rs -q --durations=0 tests/test_gpu.py tests/test_timing.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [ "$what" != tests ]; then
  timeout "$REPEAT_TIMEOUT" $PY benchmarks/measure_repeatability.py --device cuda --processes 1 --repeats "$repeats" --max-time-s 3 \
    --json "$OUT/gpu_repeat.json" > "$OUT/gpu_repeat.log" 2> "$OUT/gpu_repeat.err"
  echo "repeatability rc $?"; tail -5 "$OUT/gpu_repeat.err"; cat "$OUT/gpu_repeat.log"
fi
