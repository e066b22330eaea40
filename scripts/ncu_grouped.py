"""The grouped MoE kernels at Mixtral sizes, one launch of each after a warm-up: the tensor-core tile (bm32 bn64
bk128, tile-major) on the gate_up projection at 64 tokens, and the dp4a tile (bm1 bn32 bk512, tile-major) on
gate_up at 16 tokens; the plans are pinned (the tables of commit ba13219, which the receipt profiled), so a
later table does not change what is measured. Profiled on the GPU machine with
    ncu --clock-control none --kernel-name regex:grouped --launch-skip 2 --launch-count 2 --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \\
        --section SchedulerStats --section Occupancy python3 scripts/ncu_grouped.py
(data/receipts/ncu_grouped_h200.txt; notes/perf.md, v14). With --table: only the tensor-core gate_up at 64 tokens,
on this tree's table plan (bm32 with half-height loops; data/receipts/ncu_v30_h200.txt, notes/perf.md v31)."""
import sys

import torch
from int4lab.bench.peers import routing
from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
from int4lab.kernels.plan import GroupedPlan, grouped_plan, resolve_grouped
from int4lab.kernels.quant import quant_x_rows
from int4lab.shapes import MODELS
from int4lab.tune.sweep import dense_weights
dev = torch.device("cuda")
m = MODELS["mixtral"]
E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
gu = dense_weights(2 * I, H, E, dev)
calls = []
PLANS = {64: GroupedPlan(32, 64, 128, 4, 3, kind="mma", tile_major=True),
         16: GroupedPlan(1, 32, 512, 4, 2, tile_major=True)}
TABLE = "--table" in sys.argv
for tokens in (64,) if TABLE else (64, 16):
    ids = routing(m, tokens)[0].to(dev)
    p = (grouped_plan(2 * I, H, tokens * A, E, dev) if TABLE
         else resolve_grouped(PLANS[tokens], 2 * I, H, tokens * A, E, dev))
    tiles = build_group_tiles(ids, E, p.block_m)
    xq, xs = quant_x_rows(torch.randn(tokens, H, device=dev).bfloat16())
    calls.append(lambda xq=xq, xs=xs, tiles=tiles, p=p: gemm_int4_b32_grouped(
        xq, xs, *gu, tiles, rows_per_x=A, plan=p))
    print(tokens, "tokens:", p)
for _ in range(2):                       # compile + warm, then the profiled pair
    for c in calls:
        c()
torch.cuda.synchronize()
