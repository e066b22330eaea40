"""Do other tile plans win on the tensor-core rows now that the tile loads its scales a step ahead (notes/perf.md
v33)? Per (model, tokens): moe_decode_grouped under the table's plan pair and under variants of it (more warps,
wider N, deeper stages, a longer K step, a shorter tile), alternating twice; the bench's routing and timer,
weights rotated past L2. Variants of another block_k fold their blocks in another order, so only the time and
the error against the table's output are kept.
    PYTHONPATH=$PWD python3 scripts/probe_plans_v33.py $OUT      # -> $OUT/probe_plans_v33_h200.json
"""
import dataclasses
import sys

import torch

from int4lab.bench import timing
from int4lab.kernels.moe import moe_decode_grouped
from int4lab.receipts import provenance
from int4lab.tune.sweep import PROBE_METHOD, grouped_probe_row, keep_row, time_plan_pairs

ROWS = (("mixtral", 16), ("mixtral", 32), ("mixtral", 64), ("olmoe", 32), ("olmoe", 64), ("qwen3", 64))


def variants(pp):
    """(label, (gate_up plan, down plan)): the table's pair first, then the same change applied to both."""
    out = {"table": pp}
    bm = pp[0].block_m

    def both(**kw):
        return tuple(dataclasses.replace(p, **kw) for p in pp)
    out["w8"] = both(num_warps=8)
    out["bn128_w8"] = both(block_n=128, num_warps=8)
    out["s4"] = both(num_stages=4)
    out["bk256_w8"] = both(block_k=256, num_warps=8)
    if bm >= 16:
        out["bm_half"] = both(block_m=bm // 2, half_tiles=bm // 2 >= 16)
    else:
        out["bm16_half"] = both(block_m=16, half_tiles=True)
    return out


out_dir = sys.argv[1]
dev = torch.device("cuda")
torch.manual_seed(0)
res = {"provenance": provenance("python3 scripts/probe_plans_v33.py $OUT"), "method": PROBE_METHOD, "rows": []}
for model, T in ROWS:
    x, ids, tw, w, act, nbytes, pp = grouped_probe_row(model, T, dev, timing.l2_bytes())
    vs = variants(pp)
    row = {"model": model, "tokens": T, "copies": len(w), "bytes": nbytes,
           "plans": {k: [str(p) for p in v] for k, v in vs.items()}, "max_abs_diff_vs_table": {},
           "same_bits_as_table": {}}
    ref = moe_decode_grouped(x, ids, tw, *w[0], plan=pp).float()
    for label, plans in vs.items():
        o = moe_decode_grouped(x, ids, tw, *w[0], plan=plans).float()
        row["max_abs_diff_vs_table"][label] = float((o - ref).abs().max())
        row["same_bits_as_table"][label] = bool(torch.equal(o, ref))
    row["us"] = time_plan_pairs(x, ids, tw, w, vs)
    del w
    keep_row(res, row, f"{out_dir}/probe_plans_v33_h200.json")
