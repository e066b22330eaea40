#!/usr/bin/env bash
# One GPU call: the real-checkpoint path at the published widths. Per architecture, in its
# own process (a crash or timeout loses only that one): a synthetic checkpoint of --layers decoder layers,
# the gate on it by path (cuda, then device_map auto with a GPU/host max_memory split), save / reload of the
# quantised model, decode tokens/s int4 vs bf16; the receipt is merged after each architecture.
# Usage (on the GPU machine, repo root, $OUT set by the device tool; carry .whl for transformers 5.23):
#   INT4LAB_GIT_COMMIT=<sha> bash lab/realscale_run.sh
# Give the sha literally (the checkout travels without a trustworthy .git). LAYERS=2 and ARCHS override.
# Writes under $OUT: realscale_h200.json (the receipt), realscale_log.txt.
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/realscale_log.txt"
RECEIPT=data/receipts/realscale_h200.json
WORK=/tmp/realscale_work
LAYERS=${LAYERS:-2}
ARCHS=${ARCHS:-olmoe qwen3_moe mixtral}
t0=$(date +%s)
{
# The project pins transformers 5.23 (the image has 5.17): install the carried wheel ahead of the image's.
wheels=$(ls .whl/transformers-*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels || echo "wheel install failed"
fi
python3 -c "import torch, transformers, accelerate, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'triton', triton.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
rm -f "$RECEIPT"
for arch in $ARCHS; do
  # per-architecture wall limits (seconds): the whole call stays under 7 minutes
  case $arch in mixtral) lim=170;; qwen3_moe) lim=120;; *) lim=100;; esac
  echo "== $arch (limit ${lim}s, $(( $(date +%s) - t0 )) s in)"
  timeout $lim python3 -m lab.realscale --arch $arch --layers $LAYERS --workdir $WORK --out "$RECEIPT"
  echo "== $arch rc=$?"
  rm -rf "$WORK/$arch"
done
cp "$RECEIPT" "$OUT/realscale_h200.json" 2>/dev/null || echo "no receipt written"
echo "== done in $(( $(date +%s) - t0 )) s"
} 2>&1 | grep --line-buffered -v "Loading weights\|Writing model shards" | tee "$LOG"
