"""The tensor-core grouped tile's weight decode (notes/perf.md v24): per (model, tokens) the grouped MoE step
with the table's plans, on the tree's grouped_mma_kernel and on the previous one (diag/grouped_mma_prev.py:
the file at the commit before v24, put there for the call and loaded as a module of int4lab.kernels, not
committed), and on the tree's kernel with half_tiles (v25: the table's tile of 16 or 32 rows, or 16 where
the table has 8, running the half-height loop for tiles of at most half their rows), alternating, twice; the
same bits are checked. The bench's routing and timer, weights rotated past L2.
Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_mma_order.py $OUT"""
import dataclasses
import importlib.util
import json
import sys

import torch

from int4lab.bench import timing
from int4lab.kernels import grouped
from int4lab.kernels.moe import moe_decode_grouped
from int4lab.kernels.plan import grouped_plan
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import moe_setup

spec = importlib.util.spec_from_file_location("int4lab.kernels._grouped_mma_prev", "diag/grouped_mma_prev.py")
_grouped_mma_prev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_grouped_mma_prev)
out_dir = sys.argv[1]
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)
kernels = {"prev": _grouped_mma_prev.grouped_mma_kernel, "tree": grouped.grouped_mma_kernel}
res = {"provenance": provenance("python3 scripts/probe_mma_order.py $OUT"),
       "method": "int4lab.bench.timing (median of 20 replays, p10 / p90); kernels alternate, twice", "rows": []}
for model, T in (("mixtral", 16), ("mixtral", 32), ("mixtral", 64), ("olmoe", 32), ("olmoe", 64), ("qwen3", 32),
                 ("qwen3", 64), ("mixtral", 8)):
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    x, ids, tw, w, act, nbytes = moe_setup(m, T, dev, l2)
    copies = len(w)
    pp = (grouped_plan(2 * I, H, T * A, E, dev), grouped_plan(H, I, T * A, E, dev))

    def halved(p):
        return dataclasses.replace(p, block_m=max(16, p.block_m), half_tiles=True) if p.kind == "mma" else p
    variants = {"prev": (kernels["prev"], pp), "tree": (kernels["tree"], pp),
                "half": (kernels["tree"], tuple(halved(p) for p in pp))}
    row = {"model": model, "tokens": T, "copies": copies, "bytes": nbytes, "n_active": act,
           "plans": [dataclasses.asdict(p) for p in pp], "us": {}}
    outs = {}
    for rep in range(2):
        for label, (kern, plans) in variants.items():
            grouped.grouped_mma_kernel = kern
            outs[label] = moe_decode_grouped(x, ids, tw, *w[0], plan=plans)
            s = timing.summarise(timing.time_calls(
                [lambda i=i: moe_decode_grouped(x, ids, tw, *w[i], plan=plans) for i in range(copies)]))
            row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
    grouped.grouped_mma_kernel = kernels["tree"]
    row["same_bits"] = all(torch.equal(outs["prev"].view(torch.int16), o.view(torch.int16)) for o in outs.values())
    res["rows"].append(row)
    print(model, T, row["same_bits"], {k: [v[0] for v in vs] for k, vs in row["us"].items()}, flush=True)
    json.dump(res, open(f"{out_dir}/probe_mma_order_h200.json", "w"), indent=1)
    del w
    torch.cuda.empty_cache()
