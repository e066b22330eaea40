"""One int4 grouped MoE step (Mixtral, 64 tokens by default) for Nsight Compute: where the tensor-core tile's time goes
when it streams under the read floor. Profiled on the GPU machine with
    ncu --clock-control none --kernel-name regex:grouped_mma --launch-skip 2 --launch-count 2 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section InstructionStats python3 scripts/ncu_grouped.py [model] [tokens]
(data/receipts/ncu_grouped_*.txt; notes/perf.md, v43)."""
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
