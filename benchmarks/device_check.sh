#!/usr/bin/env bash
# make bench-device: the checks to run whenever a machine with a GPU is at hand, in under 8
# minutes. It uses that machine's own Python and CUDA JAX (no venv: a CUDA JAX is not what
# `pip install jax` gives, and such machines often cannot download), with functrain from this
# checkout on PYTHONPATH; optax must be installed there (it is the peer every table compares
# against). Each step is bounded by `timeout`; all results land in benchmarks/results/device/.
#
#   1. the GPU it runs on (fails at once if JAX sees none);
#   2. the parity smoke: every optimizer of tests/registry.py against optax, 50 jitted steps,
#      on the GPU (tests/parity);
#   3. the key tables: the step-time benchmark against optax (benchmarks/run.py --quick), the
#      matrix optimizers (--quick), and low-bit state (one process, 10 reps).
#
# Usage: make bench-device  (or PYTHON=/path/to/python benchmarks/device_check.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${DEVICE_OUT:-benchmarks/results/device}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
step() {  # step NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, remember a failure
    local name=$1 limit=$2; shift 2
    echo "== $name (at most ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "== $name FAILED ($rc)"; status=1; }
}
step device 60 "$PY" -c "import jax, functrain; print(jax.__version__, jax.devices()); \
assert jax.default_backend() == 'gpu', 'no GPU: ' + str(jax.devices())"
[ "$status" = 0 ] || exit 1
step parity 150 "$PY" -m pytest -q -p no:cacheprovider tests/parity -x
step bench 120 "$PY" benchmarks/run.py --quick --no-plot --out "$OUT" --name bench
step matrix 90 "$PY" benchmarks/matrix_optimizers.py --quick --out "$OUT" --name matrix
step quantized 90 "$PY" benchmarks/quantized_state.py --processes 1 --reps 10 --out "$OUT"
echo "results in $OUT (status $status)"
exit $status
