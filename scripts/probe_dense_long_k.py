"""4096x14336 without split-K: whole-K programs with 16 warps (notes/perf.md v38).

Its table plan (bn32 bk1024 w4, split 4) pays the last-arriving program's finish at the end of the launch; the
no-split plans of the v7 sweep had at most 8 warps per program, too few bytes in flight for 128-256 programs. Each
plan below runs one program per N tile over all of K, alternating with the table's plan over ROUNDS rounds, the
sweep's timer (weights rotated past L2); ratio to the table per round, its median and 95 % interval.
    PYTHONPATH=$PWD python3 scripts/probe_dense_long_k.py $OUT      # -> $OUT/probe_v38_long_k_h200.json
"""
import json
import sys

import torch

from int4lab.bench.decide import median_ci
from int4lab.bench.timing import copies_for, l2_bytes
from int4lab.kernels import int4_linear
from int4lab.kernels.plan import GemvPlan, gemv_plan
from int4lab.receipts import provenance
from int4lab.tune.sweep import dense_weights, int4_bytes, time_copies

N, K, ROUNDS = 4096, 14336, 6
dev = torch.device("cuda")
torch.manual_seed(0)
copies = copies_for(int4_bytes(N, K), l2_bytes())
packed, scales = dense_weights(N, K, copies, dev)
x = torch.randn(1, K, device=dev).bfloat16()
plans = {"table": gemv_plan(N, K, 1, dev)}
for bn, bk, nw in ((32, 4096, 16), (16, 4096, 16), (16, 4096, 8), (32, 2048, 16), (64, 2048, 16), (64, 1024, 16)):
    plans[f"bn{bn}_bk{bk}_w{nw}_sk1"] = GemvPlan(block_n=bn, block_k=bk, num_warps=nw, num_stages=2, waves=0.25, split_k=1)
ref = int4_linear(x, packed[0], scales[0], plan=plans["table"])
res = {"provenance": provenance("python3 scripts/probe_dense_long_k.py $OUT"), "N": N, "K": K, "copies": copies,
       "method": f"int4lab.tune.sweep.time_copies (median of 20 replays); plans alternate over {ROUNDS} rounds",
       "plans": {k: str(p) for k, p in plans.items()}, "us": {}, "errors": {}}
for r in range(ROUNDS):
    for k, p in plans.items():
        if k in res["errors"]:
            continue
        try:
            res["us"].setdefault(k, []).append(time_copies(lambda i, p=p: int4_linear(x, packed[i], scales[i], plan=p),
                                                           copies))
        except Exception as e:                      # a plan that does not compile is a result too
            res["errors"][k] = f"{type(e).__name__}: {str(e)[:200]}"
res["max_rel_diff"] = {k: float((int4_linear(x, packed[0], scales[0], plan=p).float() - ref.float()).abs().max()
                                / ref.float().abs().max()) for k, p in plans.items() if k not in res["errors"]}
res["ratio_to_table"] = {k: dict(zip(("median", "lo", "hi"), median_ci([a / b for a, b in zip(v, res["us"]["table"])])))
                         for k, v in res["us"].items()}
for k, v in res["ratio_to_table"].items():
    print(f"{k:24s} {sorted(res['us'][k])[ROUNDS // 2]:7.2f} us  {v['median']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]")
print("errors:", res["errors"])
json.dump(res, open(f"{sys.argv[1]}/probe_v38_long_k_h200.json", "w"), indent=1)
