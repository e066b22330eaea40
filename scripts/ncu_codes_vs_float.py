"""One launch each of the Mixtral one-token gate_up GEMV (2 routed rows of a [28672, 4096] expert): x quantised
inside (float x) and on int8 codes prepared by quant_x_rows. Profiled on the GPU machine with
    ncu --clock-control none --kernel-name regex:gemv_dp4a --launch-skip 2 --launch-count 2 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \\
        --section Occupancy python3 scripts/ncu_codes_vs_float.py
(data/receipts/ncu_codes_vs_float_h200.txt; notes/perf.md, v12)."""
import torch
from int4lab.kernels.gemv import X_CODES, X_FLOAT, _launch_gemv
from int4lab.kernels.quant import quant_x_rows
from int4lab.tune.sweep import dense_weights
dev = torch.device("cuda")
E, A, H, I = 8, 2, 4096, 14336
gu = dense_weights(2 * I, H, E, dev)
x = torch.randn(1, H, device=dev).bfloat16()
xq, xs = quant_x_rows(x)
ids = torch.tensor([3, 5], dtype=torch.int32, device=dev)
for _ in range(2):                       # compile + warm, then the profiled pair
    _launch_gemv(x, None, *gu, ids, 2 * I, H, A, x_mode=X_FLOAT, rows_per_x=A)
    _launch_gemv(xq, xs, *gu, ids, 2 * I, H, A, x_mode=X_CODES, rows_per_x=A)
torch.cuda.synchronize()
