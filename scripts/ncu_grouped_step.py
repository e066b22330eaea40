"""One int4 grouped MoE step (Mixtral, 64 tokens by default) for Nsight Compute: where the tensor-core tile's time goes
when it streams under the read floor. Profiled on the GPU machine with
    ncu --clock-control none --kernel-name regex:grouped_mma --launch-skip 4 --launch-count 2 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section InstructionStats --section LaunchStats python3 scripts/ncu_grouped_step.py [model] [tokens]
(data/receipts/ncu_grouped_mixtral{64,16}_h100.txt; notes/perf.md, v43b). The launch skip passes the first two steps:
the compile and the warm-up. scripts/ncu_grouped.py profiles single grouped GEMMs on pinned plans (v14, v31)."""
import sys

import torch

from int4lab.bench.peers import moe_inputs, prep_moe
from int4lab.shapes import MODELS

model, rows = (sys.argv[1] if len(sys.argv) > 1 else "mixtral"), int(sys.argv[2]) if len(sys.argv) > 2 else 64
gen = torch.Generator(device="cuda").manual_seed(0)
p = prep_moe("int4_b32_grouped", MODELS[model], moe_inputs(MODELS[model], rows, gen), copies=1)
for _ in range(3):                      # compile + warm, then the profiled launches
    y = p.calls[0]()
torch.cuda.synchronize()
err = float((y.float() - p.ref).abs().max() / p.ref.abs().max())
assert err < p.tol, f"grouped step off its reference: {err} >= {p.tol}"
print(f"{model} {rows} tokens: rel err {err:.2e}")
