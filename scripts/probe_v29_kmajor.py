"""Do K-major weight scales (format.k_major_scales) speed up the MoE step (notes/perf.md v29)?

Per (model, tokens): moe_decode_step with the table's plans on the same experts, their scales row-major or
K-major (a load-time copy: same values, so the bits must match), alternating twice; the bench's routing and
timer, weights rotated past L2. The compiler report of the grouped tensor-core kernel is kept per row.
    PYTHONPATH=$PWD python3 scripts/probe_v29_kmajor.py $OUT     # -> $OUT/probe_v29_kmajor_h200.json
"""
import json
import sys

import torch

from int4lab.bench import timing
from int4lab.format import k_major_scales
from int4lab.kernels.grouped_mma import grouped_mma_kernel
from int4lab.kernels.moe import moe_decode_step
from int4lab.kernels.plan import grouped_plan, moe_grouped
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import moe_setup


def compiled(kern):
    """Registers, spills and shared bytes of each specialisation the run-time compiler made so far."""
    out = []
    try:
        for key, c in kern.device_caches[torch.cuda.current_device()][0].items():
            c._init_handles()
            out.append({"regs": c.n_regs, "spills": c.n_spills, "shared": c.metadata.shared, "key": str(key)[:300]})
    except Exception as e:       # a probe of what was timed: never lose the timings to the introspection
        out.append({"error": repr(e)})
    return out


out_dir = sys.argv[1]
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)
res = {"provenance": provenance("python3 scripts/probe_v29_kmajor.py $OUT"),
       "method": "int4lab.bench.timing (median of 20 replays, p10 / p90); layouts alternate, twice",
       "variants": ["row_major", "k_major"], "rows": []}
for model in ("mixtral", "olmoe", "qwen3"):
    for T in (1, 2, 4, 8, 16, 32, 64):
        m = MODELS[model]
        E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
        x, ids, tw, w, act, nbytes = moe_setup(m, T, dev, l2)
        copies = len(w)
        sets = {"row_major": w, "k_major": [(gp, k_major_scales(gs), dp, k_major_scales(ds)) for gp, gs, dp, ds in w]}
        grouped = moe_grouped(T, A, E, dev)
        row = {"model": model, "tokens": T, "copies": copies, "bytes": nbytes, "n_active": act, "grouped": grouped,
               "plans": [str(grouped_plan(2 * I, H, T * A, E, dev)), str(grouped_plan(H, I, T * A, E, dev))]
               if grouped else "routed (GEMV table)", "us": {}}
        outs = {}
        for rep in range(2):
            for label, ws in sets.items():
                outs[label] = moe_decode_step(x, ids, tw, *ws[0])
                s = timing.summarise(timing.time_calls([lambda i=i: moe_decode_step(x, ids, tw, *ws[i])
                                                        for i in range(copies)]))
                row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
        row["same_bits"] = torch.equal(outs["row_major"].view(torch.int16), outs["k_major"].view(torch.int16))
        row["compiled_grouped_mma"] = compiled(grouped_mma_kernel)
        res["rows"].append(row)
        print(model, T, row["same_bits"], {k: [v[0] for v in vs] for k, vs in row["us"].items()}, flush=True)
        json.dump(res, open(f"{out_dir}/probe_v29_kmajor_h200.json", "w"), indent=1)
        del w, sets
        torch.cuda.empty_cache()
