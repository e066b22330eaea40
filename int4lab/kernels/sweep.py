"""Time GEMV launch-plan variants and MoE steps on a GPU: CUDA-graph replay, weights rotated past L2.

    python -m int4lab.kernels.sweep --out data/receipts/kernel_sweep_h200.json [--budget-s 200] [--phase a]

This is the kernel engineer's tuning tool (which plan row to put in plan.py); the side-by-side
comparison with peers is `python -m int4lab.bench`. Method (as the anchors in notes/perf.md):
one graph holds `copies` calls, each on its own copy of the weights, with copies * bytes > 4 x L2, so
every call streams its weights from HBM; time = median over replays of (graph time / copies).
Weights are random bytes and random fp16 scales: the kernels' speed does not depend on the values.
Shape legend: E = experts, N = out features, K = in features, A = experts per token.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from ..receipts import write_receipt
from .gemv import int4_linear
from .moe import moe_decode_step
from .plan import GemvPlan, choose_split_k, gemv_plan, num_sms, table_plan

# (name, N, K): the decode GEMV shapes of Mixtral, OLMoE and Qwen3-30B-A3B, as in the H200 anchors.
SHAPES = [("mixtral.expert.w1", 14336, 4096), ("mixtral.expert.w2", 4096, 14336), ("big", 28672, 8192),
          ("mixtral.q/o", 4096, 4096), ("mixtral.kv", 1024, 4096), ("olmoe.attn", 2048, 2048),
          ("olmoe.expert.down", 2048, 1024), ("qwen3.q", 4096, 2048), ("qwen3.o", 2048, 4096),
          ("qwen3.kv", 512, 2048), ("qwen3.expert.gate_up", 1536, 2048), ("qwen3.expert.down", 2048, 768)]
MOE = {"mixtral": (8, 2, 4096, 14336), "olmoe": (64, 8, 2048, 1024), "qwen3": (128, 8, 2048, 768)}
L2_BYTES = 60 * 2**20


def int4_bytes(N, K):
    return N * K // 2 + N * K // 32 * 2


def time_graph(calls, copies, reps=30) -> float:
    """Median microseconds per call of calls(i), i = 0..copies-1, captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(copies, 2)):
            calls(i)                                   # compile + warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            calls(i)
    g.replay()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b) * 1e3 / copies)
    return sorted(t)[len(t) // 2]


def n_copies(bytes_per_call, cap=256):
    return max(2, min(cap, -(-4 * L2_BYTES // bytes_per_call) + 1))


def dense_weights(N, K, copies, dev):
    packed = torch.randint(0, 256, (copies, N, K // 2), dtype=torch.uint8, device=dev)
    scales = (torch.rand(copies, N, K // 32, device=dev) * 0.01 + 1e-3).half()
    return packed, scales


# (block_n, block_k, num_warps, num_stages, waves): the first H200 sweep's two best tiles, each with the
# split-K rule at 4, 2 and 1 programs per SM (fewer splits = fewer reduce launches, fewer bytes in flight).
DP4A_CFGS = [(32, 1024, 4, 2, 4.0), (32, 1024, 4, 2, 2.0), (32, 1024, 4, 2, 1.0), (16, 512, 4, 3, 4.0),
             (16, 512, 4, 3, 2.0), (16, 1024, 4, 3, 2.0), (32, 512, 4, 3, 4.0), (64, 256, 4, 4, 4.0)]


def dp4a_variants(N, K, dev, full):
    """dp4a GemvPlan rows (gemv_dp4a.py); split-K from each row's waves rule."""
    out = []
    for bn, bk, nw, ns, waves in DP4A_CFGS if full else DP4A_CFGS[:6]:
        p = GemvPlan(block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=waves, fuse_quant=False,
                     kind="dp4a")
        out.append((f"dp4a_bn{bn}_bk{bk}_w{nw}_s{ns}_waves{waves:g}",
                    gemv_plan(N, K, 1, dev, **dataclasses.asdict(p))))
    return out


def variants(N, K, dev, full, kinds=("mma",)):
    """GemvPlan rows to try: the current table's choice first, then neighbours (v1 = both flags off)."""
    if "mma" not in kinds:
        return [("table", gemv_plan(N, K, 1, dev))] + dp4a_variants(N, K, dev, full)
    sms = num_sms(dev)
    # (block_n, block_k, num_warps, num_stages, defer_reduce, fuse_quant)
    cfgs = [(64, 512, 4, 4, True, True), (64, 512, 4, 4, True, False), (64, 512, 8, 3, True, True),
            (128, 512, 8, 3, False, True), (128, 512, 8, 3, True, True), (128, 512, 8, 3, True, False),
            (32, 512, 4, 4, True, True), (256, 512, 8, 3, True, True), (64, 256, 4, 4, True, False),
            (64, 256, 4, 4, True, True), (128, 256, 8, 4, True, False)]
    if not full:
        cfgs = cfgs[:2] + cfgs[3:5] + cfgs[8:10]
    out = [("table", gemv_plan(N, K, 1, dev))]
    for bn, bk, nw, ns, dr, fq in cfgs:
        k_tiles = -(-K // bk)
        auto = choose_split_k(-(-N // bn), k_tiles, sms, 4.0)
        for sk in sorted({1, auto} if full else {auto}):
            if sk <= k_tiles:
                out.append((f"bn{bn}_bk{bk}_w{nw}_s{ns}_sk{sk}{'_defer' if dr else ''}{'' if fq else '_sepquant'}",
                            GemvPlan(block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=4.0, split_k=sk,
                                     defer_reduce=dr, fuse_quant=fq)))
    return out


def sweep_dense(name, N, K, dev, full, rows, deadline, kinds=("mma",)):
    nbytes = int4_bytes(N, K)
    copies = n_copies(nbytes)
    packed, scales = dense_weights(N, K, copies, dev)
    x = torch.randn(1, K, device=dev).bfloat16()
    row = {"shape": name, "N": N, "K": K, "bytes_int4_b32": nbytes, "copies": copies}
    if "mma" in kinds:                                 # baselines; a dp4a-only sweep leaves them to the bench
        wb = torch.randn(n_copies(N * K * 2, cap=64), N, K, device=dev).bfloat16()
        row["bf16_us"] = time_graph(lambda i: torch.matmul(x, wb[i].t()), wb.shape[0])
        del wb
        row["w4a16_us"] = time_graph(lambda i: int4_linear(x, packed[i], scales[i], act="bf16"), copies)
    res = {}
    for label, p in variants(N, K, dev, full, kinds):
        if time.time() > deadline:
            row["truncated"] = True
            break
        try:
            us = time_graph(lambda i: int4_linear(x, packed[i], scales[i], plan=p), copies)
        except Exception as e:                         # a plan that fails to compile is a result too
            res[label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        res[label] = {"us": us, "TBps": nbytes / us / 1e6, "split_k": p.split_k, "plan": dataclasses.asdict(p)}
    row["int4_b32"] = res
    ok = {k: v["us"] for k, v in res.items() if "us" in v}
    if ok:
        best = min(ok, key=ok.get)
        row["best"], row["best_us"] = best, ok[best]
    rows.append(row)
    print(f"{name:24s} {N:6d}x{K:<6d} bf16 {row.get('bf16_us', float('nan')):7.2f}  "
          f"w4a16 {row.get('w4a16_us', float('nan')):7.2f}  "
          f"table {res.get('table', {}).get('us', float('nan')):7.2f}  best {row.get('best_us', float('nan')):7.2f} "
          f"({row.get('best')})", flush=True)


def sweep_moe(model, dev, rows, plans=(("table", None),)):
    E, A, H, I = MOE[model]
    gu = dense_weights(2 * I, H, E, dev)
    dn = dense_weights(H, I, E, dev)
    x = torch.randn(1, H, device=dev).bfloat16()
    sets = E // A                                       # disjoint routings: each call reads other experts
    ids = torch.arange(E, device=dev, dtype=torch.int32)[torch.randperm(E, device=dev)].view(sets, 1, A)
    tw = torch.softmax(torch.randn(1, A, device=dev), -1)
    nbytes = A * (int4_bytes(2 * I, H) + int4_bytes(H, I))
    row = {"model": model, "E": E, "topk": A, "H": H, "I": I, "bytes_int4_b32": nbytes, "copies": sets}
    for label, p in plans:
        row[f"us_{label}"] = time_graph(lambda i: moe_decode_step(x, ids[i], tw, *gu, *dn, plan=p), sets)
    rows.append(row)
    print(f"moe {model:8s} " + "  ".join(f"{k} {v:7.2f}" for k, v in row.items() if k.startswith("us_")), flush=True)


def pick_plan(payload: dict, prefix: str = "dp4a_") -> dict | None:
    """The variant (by label prefix) with the smallest geometric mean of time over the shapes where every
    such variant was timed; returns its GemvPlan fields (without split_k: the plan's waves rule picks it)."""
    import math
    dense = [r for r in payload["dense"] if any(k.startswith(prefix) for k in r.get("int4_b32", {}))]
    labels = set.intersection(*[{k for k, v in r["int4_b32"].items() if k.startswith(prefix) and "us" in v}
                                for r in dense]) if dense else set()
    if not labels:
        return None
    score = {lb: sum(math.log(r["int4_b32"][lb]["us"]) for r in dense) for lb in labels}
    best = min(score, key=score.get)
    plan = dict(dense[0]["int4_b32"][best]["plan"])
    plan.pop("split_k", None)
    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON receipt to write")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting new variants after this")
    ap.add_argument("--full", type=int, default=4, help="how many leading shapes get the full variant grid")
    ap.add_argument("--kinds", default="mma", help="comma list: mma (gemv.py variants), dp4a (gemv_dp4a.py)")
    ap.add_argument("--no-moe", action="store_true", help="dense shapes only")
    ap.add_argument("--pick", action="store_true", help="read --out and print the best dp4a plan as JSON")
    args = ap.parse_args(argv)
    if args.pick:
        print(json.dumps(pick_plan(json.loads(args.out.read_text()))))
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    deadline = time.time() + args.budget_s
    dense, moe = [], []
    payload = {"method": "CUDA-graph replay, weights rotated until copies*bytes > 4x L2, median of 30 replays",
               "sms": num_sms(dev), "dense": dense, "moe": moe}
    for i, (name, N, K) in enumerate(SHAPES):
        if time.time() > deadline:
            break
        sweep_dense(name, N, K, dev, i < args.full, dense, deadline, tuple(args.kinds.split(",")))
        write_receipt(args.out, payload, command="python -m int4lab.kernels.sweep")
    for model in () if args.no_moe else MOE:
        if time.time() > deadline + 60:
            break
        t = table_plan(dev)
        sweep_moe(model, dev, moe, plans=[("table", None), ("defer", dataclasses.replace(t, defer_reduce=True)),
                                          ("defer_sepquant", dataclasses.replace(t, defer_reduce=True,
                                                                                 fuse_quant=False))])
        write_receipt(args.out, payload, command="python -m int4lab.kernels.sweep")
    print(json.dumps({"written": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
