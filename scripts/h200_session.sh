#!/usr/bin/env bash
# One lent-GPU session: the suite on CUDA, a dp4a plan sweep, then every kernel timed beside its peers and
# the read floor (the bench stops starting measurements after its 300 s budget).
# Usage (on the GPU machine, repo root, $OUT set by the device tool; the checkout travels without .git):
#   INT4LAB_GIT_COMMIT=<sha> bash scripts/h200_session.sh [--with-pack]
# Writes under $OUT: cuda_tests_h200.txt, kernel_sweep_dp4a.json, plan.txt, decode_h200.json
# (and gptq_pack_h200.json with --with-pack).
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Carried wheels (git-ignored): gemlite for the peer column; transformers at the pinned version.
wheels=$(ls .whl/*.whl .carry/whl/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels || echo "wheel install failed"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
echo "== 1. test suite on CUDA (the GPU-relevant files; lm-eval is not on the image)"
timeout 150 python3 -m pytest -q -m "not notebook" -p no:cacheprovider tests/test_kernels.py \
  tests/test_w4a16_cutlass.py tests/test_cutlass_layout.py tests/test_format.py tests/test_gptq.py \
  tests/test_quantize.py 2>&1 | tee "$OUT/cuda_tests_h200.txt" | tail -15
echo "== 2. dp4a plan sweep ($(( $(date +%s) - t0 )) s in)"
timeout 120 python3 -m int4lab.tune.sweep --kinds dp4a --no-moe --budget-s 85 --full 2 \
  --out "$OUT/kernel_sweep_dp4a.json"
python3 -m int4lab.tune.sweep --pick --out "$OUT/kernel_sweep_dp4a.json" | tail -1 | tee "$OUT/plan.txt"
echo "== 3. side-by-side benchmark, committed plan table ($(( $(date +%s) - t0 )) s in)"
timeout 400 python3 -m int4lab.bench --out "$OUT/decode_h200.json"
if [ "${1:-}" = "--with-pack" ]; then
  echo "== 4. GPTQ pack time ($(( $(date +%s) - t0 )) s in)"
  timeout 45 python3 -m int4lab.bench_pack --device cuda 2>&1 | tail -5
  cp data/receipts/gptq_pack_h200.json "$OUT/" 2>/dev/null || echo "no gptq_pack_h200.json written"
fi
echo "== done in $(( $(date +%s) - t0 )) s"
