"""The routed MoE step with and without PDL (the down GEMV as a programmatic dependent launch of gate_up),
per model at 1, 2 and 4 tokens (the rows where moe_decode_step takes the routed path), timed alternately
three times each in one process with the bench's timer and routing; weights rotated past L2 (notes/perf.md
v21b). Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_pdl.py $OUT"""
import json
import sys

import torch

from int4lab.bench import timing
from int4lab.kernels.moe import moe_decode_routed
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import moe_setup

out_dir = sys.argv[1]
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)
res = {"provenance": provenance("python3 scripts/probe_pdl.py $OUT"),
       "method": "int4lab.bench.timing (median of 20 replays, p10 / p90), PDL off and on alternately, 3 times",
       "rows": []}
for T in (1, 2, 4):
    for model, m in MODELS.items():
        x, ids, tw, w, _, nbytes = moe_setup(m, T, dev, l2)
        copies = len(w)
        row = {"model": model, "tokens": T, "copies": copies, "bytes": nbytes, "pdl": [], "no_pdl": []}
        for rep in range(3):
            for pdl in (False, True):
                s = timing.summarise(timing.time_calls(
                    [lambda i=i: moe_decode_routed(x, ids, tw, *w[i], pdl=pdl) for i in range(copies)]))
                row["pdl" if pdl else "no_pdl"].append([round(s["us"], 3), round(s["p10_us"], 3),
                                                        round(s["p90_us"], 3)])
        a = moe_decode_routed(x, ids, tw, *w[0], pdl=False)
        b = moe_decode_routed(x, ids, tw, *w[0], pdl=True)
        row["same_bits"] = bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))
        res["rows"].append(row)
        print(model, T, "no_pdl", [r[0] for r in row["no_pdl"]], "pdl", [r[0] for r in row["pdl"]],
              row["same_bits"], flush=True)
        json.dump(res, open(f"{out_dir}/probe_pdl_h200.json", "w"), indent=1)
        del w
        torch.cuda.empty_cache()
