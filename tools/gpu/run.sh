#!/bin/bash
# Checks of the torch device and the cuda backend on a GPU (docs/cuda.md, "Checks on a
# GPU"); the output lands in $OUT (default /tmp/out). Environment: CONFORMANCE=1 (the
# conformance suite's cuda cases on the GPU), SECTIONS (tools/gpu/checks.py's, default
# "views dlpack"), CASES (training cases, e.g. "mlp cnn"), BIG=1 (tools/gpu/big_buffer.py),
# PYTESTS (torch device test files to run on the GPU) and PYTEST_S (their time limit).
# Wheels in .whl/ (carried: packages the machine's image lacks, such as lief, which the
# cpu backend needs) are installed first; the package is installed in place (its native
# extension built, and the torch.compile backend's entry point registered).
cd "$(dirname "$0")/../.." || exit 1
site=/tmp/site
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
fi
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1 HOLOGRAM_TORCH_BACKEND=cuda
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $* ($(date +%T))"; }
{
log start; nvidia-smi -L
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/build.log" 2>&1 \
  || python3 setup.py build_ext --inplace >> "$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
python3 -c "import hologram_torch.native as n; n.report()" 2>&1 | tail -1
if [ -n "$CONFORMANCE" ]; then
  log conformance
  HOLOGRAM_TEST_GPU=1 timeout "${CONFORMANCE_S:-200}" python3 -m pytest tests/conformance \
    -k cuda -q -p no:cacheprovider -n "${WORKERS:-8}" 2>&1 | grep -vE "^\.+|Warning|warn" | tail -25
fi
for s in ${SECTIONS:-views dlpack}; do
  log "$s"; timeout 150 python3 tools/gpu/checks.py "$s" 2>&1 | grep -E "PASS|FAIL|ERROR|SUMMARY|Error|^  " | head -40
done
if [ -n "$BIG" ]; then log big; timeout 150 python3 tools/gpu/big_buffer.py 2>&1 | tail -25; fi
for c in $CASES; do
  log train "$c"
  timeout 60 python3 tools/gpu/train.py torch "$c" 2>&1 | grep -E "ROW|Error" | tail -3
  timeout 150 python3 tools/gpu/train.py hologram "$c" 2>&1 | grep -E "ROW|Error" | tail -3
  timeout 150 python3 tools/gpu/train.py hologram "$c" lazy 2>&1 | grep -E "ROW|Error" | tail -3
done
if [ -n "$PYTESTS" ]; then
  log pytest
  timeout "${PYTEST_S:-90}" python3 -m pytest $PYTESTS -q -p no:cacheprovider -p no:warnings \
    2>&1 | grep -vE "^\.+$" | tail -40
fi
log end
} 2>&1 | tee "$OUT/run.log"
