"""Split-K for the grouped tensor-core path's down projection (notes/perf.md v22): per (model, tokens), the
grouped step with the table's plans, then with the down projection split 2 / 3 / 4 and with both projections
split 2; the bench's routing and timer, weights rotated past L2. Why: Mixtral's down GEMM at 16 tokens is
7 live tiles x 64 N tiles = 448 programs of 112 K steps on 132 SMs x 4 slots, one uneven wave.
Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_split_grouped.py $OUT"""
import dataclasses
import json
import sys

import torch

from int4lab.bench import timing
from int4lab.kernels.moe import moe_decode_grouped
from int4lab.kernels.plan import grouped_plan
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import moe_setup

out_dir = sys.argv[1]
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)
res = {"provenance": provenance("python3 scripts/probe_split_grouped.py $OUT"),
       "method": "int4lab.bench.timing (median of 20 replays, p10 / p90); variants alternate, twice", "rows": []}
for model, T in (("mixtral", 16), ("mixtral", 32), ("mixtral", 64), ("mixtral", 8), ("olmoe", 64), ("qwen3", 64)):
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    L = T * A
    x, ids, tw, w, act, nbytes = moe_setup(m, T, dev, l2)
    copies = len(w)
    p_gu, p_dn = grouped_plan(2 * I, H, L, E, dev), grouped_plan(H, I, L, E, dev)
    variants = {"table": (p_gu, p_dn)}
    for sk in (2, 3, 4):
        variants[f"down_sk{sk}"] = (p_gu, dataclasses.replace(p_dn, split_k=sk))
    variants["both_sk2"] = (dataclasses.replace(p_gu, split_k=2), dataclasses.replace(p_dn, split_k=2))
    row = {"model": model, "tokens": T, "copies": copies, "bytes": nbytes, "n_active": act,
           "plan_gate_up": dataclasses.asdict(p_gu), "plan_down": dataclasses.asdict(p_dn), "us": {}}
    for rep in range(2):
        for label, pp in variants.items():
            s = timing.summarise(timing.time_calls(
                [lambda i=i: moe_decode_grouped(x, ids, tw, *w[i], plan=pp) for i in range(copies)]))
            row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
    res["rows"].append(row)
    print(model, T, {k: [v[0] for v in vs] for k, vs in row["us"].items()}, flush=True)
    json.dump(res, open(f"{out_dir}/probe_split_grouped_h200.json", "w"), indent=1)
    del w
    torch.cuda.empty_cache()
