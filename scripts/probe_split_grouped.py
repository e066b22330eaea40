"""Split-K for the grouped tensor-core path's down projection (notes/perf.md v22): per (model, tokens), the
grouped step with the table's plans, then with the down projection split 2 / 3 / 4 and with both projections
split 2; the bench's routing and timer, weights rotated past L2. Why: Mixtral's down GEMM at 16 tokens is
7 live tiles x 64 N tiles = 448 programs of 112 K steps on 132 SMs x 4 slots, one uneven wave.
Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_split_grouped.py $OUT"""
import dataclasses
import sys

import torch

from int4lab.bench import timing
from int4lab.receipts import provenance
from int4lab.tune.sweep import PROBE_METHOD, grouped_probe_row, keep_row, time_plan_pairs

out_dir = sys.argv[1]
dev = torch.device("cuda")
torch.manual_seed(0)
res = {"provenance": provenance("python3 scripts/probe_split_grouped.py $OUT"), "method": PROBE_METHOD, "rows": []}
for model, T in (("mixtral", 16), ("mixtral", 32), ("mixtral", 64), ("mixtral", 8), ("olmoe", 64), ("qwen3", 64)):
    x, ids, tw, w, act, nbytes, (p_gu, p_dn) = grouped_probe_row(model, T, dev, timing.l2_bytes())
    variants = {"table": (p_gu, p_dn)}
    for sk in (2, 3, 4):
        variants[f"down_sk{sk}"] = (p_gu, dataclasses.replace(p_dn, split_k=sk))
    variants["both_sk2"] = (dataclasses.replace(p_gu, split_k=2), dataclasses.replace(p_dn, split_k=2))
    row = {"model": model, "tokens": T, "copies": len(w), "bytes": nbytes, "n_active": act,
           "plan_gate_up": dataclasses.asdict(p_gu), "plan_down": dataclasses.asdict(p_dn),
           "us": time_plan_pairs(x, ids, tw, w, variants)}
    del w
    keep_row(res, row, f"{out_dir}/probe_split_grouped_h200.json")
