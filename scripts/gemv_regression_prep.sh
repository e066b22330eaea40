#!/usr/bin/env bash
# Prepares diag/ (git-ignored; carry it) for the dense GEMV regression probe of notes/perf.md (bench at 555ecbc):
# the same int4_linear timed with the kernels of 194643f (diag/old), of this tree (no PYTHONPATH change), and of
# this tree with tl.sum back in place of fold_blocks in the GEMV (diag/sum).
# Here (with .git):   bash scripts/gemv_regression_prep.sh
# On the GPU (carry diag):
#   for v in old sum; do PYTHONPATH=$PWD/diag/$v python3 diag/time.py $v; done; PYTHONPATH=$PWD python3 diag/time.py head
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/diag/" .git/info/exclude 2>/dev/null || echo "/diag/" >> .git/info/exclude
rm -rf diag && mkdir -p diag/old diag/sum
git archive 194643f int4lab | tar -x -C diag/old
git archive HEAD int4lab | tar -x -C diag/sum
python3 - <<'PY'
p = "diag/sum/int4lab/kernels/gemv_dp4a.py"
s = open(p).read()
old = "finish_rows(fold_blocks(acc, BLOCK_N, NB)[None, :], valid, rows,"
assert old in s, "the GEMV's fold line moved: update this script"
open(p, "w").write(s.replace(old, "finish_rows(tl.sum(acc, axis=1)[None, :], valid, rows,"))
PY
cat > diag/time.py <<'PY'
import sys, torch
from int4lab.kernels import int4_linear
from int4lab.tune.sweep import time_copies, dense_weights
dev = torch.device("cuda")
for N, K in [(4096, 4096), (2048, 2048), (4096, 2048), (14336, 4096)]:
    copies = max(2, int(4 * 60e6 // (N * K * 0.5625)) + 1)     # rotated past 4x a 60 MB L2
    p, s = dense_weights(N, K, copies, dev)
    x = torch.randn(1, K, device=dev).bfloat16()
    us = time_copies(lambda i: int4_linear(x, p[i], s[i]), copies, 30)
    print(f"{sys.argv[1]:5s} {N}x{K} {us:7.2f} us", flush=True)
PY
echo "diag/ ready: carry it"
