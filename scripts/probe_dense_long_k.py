"""4096x14336 without split-K: whole-K programs with 16 warps (notes/perf.md v38).

Its table plan (bn32 bk1024 w4, split 4) pays the last-arriving program's finish at the end of the launch; the
no-split plans of the v7 sweep had at most 8 warps per program, too few bytes in flight for 128-256 programs. Each
plan below runs one program per N tile over all of K, alternating with the table's plan over ROUNDS rounds, the
sweep's timer (weights rotated past L2); ratio to the table per round, its median and 95 % interval.
    PYTHONPATH=$PWD python3 scripts/probe_dense_long_k.py $OUT      # -> $OUT/probe_v38_long_k_h200.json
--order (v38b): the table's split plans with the grid in the order the routed GEMV's ROW_MAJOR flag gives (rows,
splits, N tiles): for one row the splits of one N tile launch side by side, so the programs running at one moment
read neighbouring segments of the same rows (same bits):
    PYTHONPATH=$PWD python3 scripts/probe_dense_long_k.py $OUT --order   # -> $OUT/probe_v38b_order_h200.json
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


def _setup():
    """(device, copies, packed [copies, N, K/2], scales [copies, N, K/32], x [1, K] bf16): weights rotated past L2."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    copies = copies_for(int4_bytes(N, K), l2_bytes())
    packed, scales = dense_weights(N, K, copies, dev)
    return dev, copies, packed, scales, torch.randn(1, K, device=dev).bfloat16()


def timed(calls: dict, copies: int) -> dict:
    """label -> per-round medians, the labels alternating over ROUNDS rounds."""
    us = {}
    for _ in range(ROUNDS):
        for k, c in calls.items():
            us.setdefault(k, []).append(time_copies(c, copies))
    return us


def order(out_dir):
    from int4lab.kernels.gemv import X_FLOAT, _launch_gemv
    dev, copies, packed, scales, x = _setup()
    calls, outs = {}, {}
    for sk in (4, 2, 7, 14):
        p = gemv_plan(N, K, 1, dev, split_k=sk)
        for rm in (False, True):
            def call(i, p=p, rm=rm):
                return _launch_gemv(x, None, packed[i:i + 1], scales[i:i + 1], None, N, K, 1, x_mode=X_FLOAT, plan=p,
                                    row_major=rm)
            label = f"split{sk}{'_splits_side_by_side' if rm else ''}"
            calls[label], outs[label] = call, call(0).clone()
    us = timed(calls, copies)
    base = "split4"
    res = {"provenance": provenance("python3 scripts/probe_dense_long_k.py $OUT --order"), "N": N, "K": K,
           "copies": copies, "method": f"int4lab.tune.sweep.time_copies; variants alternate over {ROUNDS} rounds",
           "us": us, "same_bits_per_split": {k: torch.equal(outs[k].view(torch.int16),
                                                            outs[k.split("_")[0]].view(torch.int16)) for k in outs},
           "ratio_to_table": {k: dict(zip(("median", "lo", "hi"), median_ci([a / b for a, b in zip(v, us[base])])))
                              for k, v in us.items()}}
    for k, v in res["ratio_to_table"].items():
        print(f"{k:28s} {sorted(us[k])[ROUNDS // 2]:7.2f} us  {v['median']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]")
    print("same bits:", res["same_bits_per_split"])
    json.dump(res, open(f"{out_dir}/probe_v38b_order_h200.json", "w"), indent=1)


def main(out_dir):
    dev, copies, packed, scales, x = _setup()
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
    json.dump(res, open(f"{out_dir}/probe_v38_long_k_h200.json", "w"), indent=1)


if __name__ == "__main__":
    order(sys.argv[1]) if "--order" in sys.argv else main(sys.argv[1])
