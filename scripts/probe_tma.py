"""The weights through the Tensor Memory Accelerator (TMA): the one Hopper load path no probe has timed (notes/perf.md v42).

Every kernel on main brings its weights in with per-thread loads: 16-byte LDGs straight into registers (the dp4a
GEMV) or cp.async copies staged by Triton's pipeliner (the grouped tensor-core tile). A TMA load is one bulk copy
of a [rows, bytes] box into shared memory, issued by one thread and waited on through an mbarrier: no per-thread
addresses, and as many boxes in flight as there are stages. Each variant below is the tree's kernel with only the
weight load rewritten (exact text substitutions, each asserted to match once), fed a host-side TensorDescriptor
over the packed weights viewed as 2-D [E * N, row bytes or words]. Rows past an expert's N belong to the next
expert and are never stored; a box past the tensor's end or past K reads zeros, as the masked loads did, so the
bits are the tree's.
  no_finish  timing only, 4096x14336's split plan: the partials stored and nothing else (the finish's cost)
  dense    gemv_dp4a.py: the weight tile [BLOCK_N, BLOCK_K / 8] int32 words, the K loop as tl.range(num_stages=s)
           (the pipeliner only stages a loop with a dot by itself); issue 12's four big shapes, table plans
  grouped  grouped_mma.py: the weight tile [BLOCK_N, BLOCK_K / 2] bytes reshaped to [NB, BLOCK_N, 16]; the MoE
           step's six tensor-core rows, table plans, and the same with 4 stages or block_k 256
    PYTHONPATH=$PWD python3 scripts/probe_tma.py $OUT          # -> $OUT/probe_v42_tma_h200.json
    python3 scripts/probe_tma.py --check                        # interpreter: the variants give the tree's bits
--library (once the library has plan.tma, v42b): the MoE step's six tensor-core rows under the table's plans with
the weights through TMA and with plan.tma off (the threads' loads), alternating over GROUPED_ROUNDS_LIBRARY rounds:
    PYTHONPATH=$PWD python3 scripts/probe_tma.py $OUT --library   # -> $OUT/probe_v42b_tma_library_h200.json
"""
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from int4lab.tune.variants import compiled, grouped_case, load, sub

SRC = Path(__file__).resolve().parents[1] / "int4lab" / "kernels"
DP4A, GMMA = (SRC / "gemv_dp4a.py").read_text(), (SRC / "grouped_mma.py").read_text()
DENSE_STAGES = (2, 3, 4)
DENSE_SHAPES = ((4096, 14336), (14336, 4096), (28672, 4096), (28672, 8192))
GROUPED_ROWS = (("mixtral", 16), ("mixtral", 32), ("mixtral", 64), ("olmoe", 32), ("olmoe", 64), ("qwen3", 64))
DENSE_ROUNDS, GROUPED_ROUNDS, GROUPED_ROUNDS_LIBRARY = 6, 2, 3


def tma_dense(src, stages):
    """gemv_tile with its (non-prefetch) weight load from a descriptor, the K loop pipelined `stages` deep."""
    src = sub(src, "    offs_n, n_mask, w_rows, s_rows = expert_tile(w_ptr, ws_ptr, e, stride_we, stride_se, pid_n, N, KW, "
                   "KB, BLOCK_N)\n",
              "    offs_n, n_mask, w_rows, s_rows = expert_tile(ws_ptr, ws_ptr, e, stride_we, stride_se, pid_n, N, KW, "
              "KB, BLOCK_N)\n    w_row0 = (e * N + pid_n * BLOCK_N).to(tl.int32)\n")
    src = sub(src, "    for i in range(0, TILES_PER_SPLIT):\n        t = t0 + i\n",
              f"    for i in tl.range(0, TILES_PER_SPLIT, num_stages={stages}):\n        t = t0 + i\n")
    return sub(src, "wd = tl.load(w_rows + w_idx[None, :], mask=n_mask[:, None] & (w_idx < KW)[None, :], other=0)",
               "wd = w_ptr.load([w_row0, t * BLOCK_W])")


def no_finish(src):
    """Timing only (4096x14336, split 4): each program stores its float32 partial and stops; no arrival counter,
    no last-arriving sum, no bf16 output. What the split-K finish costs the launch (v38 left it unmeasured)."""
    return sub(src, "    finish_rows(y[None, :], valid, rows, rows >= 0, out_ptr, part_ptr, cnt_ptr, tw_ptr,\n"
                    "                split, R, N, pid_n, tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)\n",
               "    tl.store(part_ptr + (split * R + r) * N + offs_n, y, mask=n_mask)\n")


def tma_grouped(src):
    """grouped_mma._tile with its weight load from a descriptor (the pipeliner stages it with the dot's operands)."""
    src = sub(src, "    w_rows = w_ptr + e * stride_we + offs_n[None, :, None].to(tl.int64) * KH + offs_h[None, None, :]\n",
              "    w_row0 = (e * N + pid_n * BLOCK_N).to(tl.int32)\n")
    return sub(src, "wb = tl.load(w_rows + kb[:, None, None] * 16, mask=live[:, None, None] & n_mask[None, :, None], "
                    "other=0)",
               "wb = tl.permute(tl.reshape(w_ptr.load([w_row0, (split * TILES_PER_SPLIT + i) * (BLOCK_K // 2)]), "
               "[BLOCK_N, NB, 16]), (1, 0, 2))")


class Described:
    """A variant kernel launched as the tree's launcher launches the tree's: the weight argument (positional 2,
    [..., rows, row units]) becomes a TensorDescriptor of a [BLOCK_N, BLOCK_K / per_unit] box."""
    def __init__(self, kern, per_unit):
        self.kern, self.per_unit = kern, per_unit
        self.device_caches = getattr(kern, "device_caches", None)

    def __getitem__(self, grid):
        from triton.tools.tensor_descriptor import TensorDescriptor
        launch = self.kern[grid]

        def run(*args, **kw):
            w = args[2]
            desc = TensorDescriptor.from_tensor(w.reshape(-1, w.shape[-1]), [kw["BLOCK_N"], kw["BLOCK_K"] // self.per_unit])
            return launch(*args[:2], desc, *args[3:], **kw)
        return run


def dense_kernels():
    from int4lab.kernels import gemv
    out = {"tree": gemv.gemv_dp4a_kernel}
    for s in DENSE_STAGES:
        out[f"tma_s{s}"] = Described(load(tma_dense(DP4A, s), f"dp4a_tma{s}").gemv_dp4a_kernel, 8)
    out["no_finish"] = load(no_finish(DP4A), "dp4a_no_finish").gemv_dp4a_kernel
    return out


def grouped_kernels():
    from int4lab.kernels import grouped
    return {"tree": grouped.grouped_mma_kernel, "tma": Described(load(tma_grouped(GMMA), "gmma_tma").grouped_mma_kernel, 2)}


def check():
    """Interpreter: every variant gives the tree's bits on awkward shapes (N not a multiple of block_n, K tiles
    that do not split evenly, an expert with no rows)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from int4lab.kernels import gemv, grouped, int4_linear
    from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
    from int4lab.kernels.plan import GemvPlan, GroupedPlan
    torch.manual_seed(0)
    ok = True
    N, K = 72, 1536
    packed = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    scales = (torch.rand(N, K // 32) * 0.01 + 0.001).half()
    x = torch.randn(2, K).bfloat16()
    kerns = dense_kernels()
    kerns.pop("no_finish")                              # timing only: its output is not the product
    for sk in (1, 2):
        p = GemvPlan(block_n=32, block_k=512, num_warps=1, num_stages=1, waves=1.0, split_k=sk)
        outs = {}
        for label, k in kerns.items():
            gemv.gemv_dp4a_kernel = k
            outs[label] = int4_linear(x, packed, scales, plan=p)
        gemv.gemv_dp4a_kernel = kerns["tree"]
        same = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()}
        print("dense split", sk, same)
        ok &= all(same.values())
    E, packed, scales, xq, xs, ids = grouped_case()                 # expert 1: no rows
    kerns = grouped_kernels()
    for bk in (128, 256):
        p = GroupedPlan(block_m=4, block_n=32, block_k=bk, num_warps=1, num_stages=1, kind="mma", tile_major=True)
        tiles = build_group_tiles(ids, E, 4)
        outs = {}
        for label, k in kerns.items():
            grouped.grouped_mma_kernel = k
            outs[label] = gemm_int4_b32_grouped(xq, xs, packed, scales, tiles, plan=p)
        grouped.grouped_mma_kernel = kerns["tree"]
        same = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()}
        print("grouped block_k", bk, same)
        ok &= all(same.values())
    print("check", "passed" if ok else "FAILED")
    return 0 if ok else 1


def dense(res, path):
    from int4lab.bench.decide import median_ci
    from int4lab.bench.timing import copies_for, l2_bytes
    from int4lab.kernels import gemv, int4_linear
    from int4lab.kernels.plan import gemv_plan
    from int4lab.tune.sweep import dense_weights, int4_bytes, time_copies
    dev = torch.device("cuda")
    kerns = dense_kernels()
    for N, K in DENSE_SHAPES:
        torch.manual_seed(0)
        copies = copies_for(int4_bytes(N, K), l2_bytes())
        packed, scales = dense_weights(N, K, copies, dev)
        x = torch.randn(1, K, device=dev).bfloat16()
        p = gemv_plan(N, K, 1, dev)
        row = {"N": N, "K": K, "copies": copies, "plan": str(p), "us": {}, "errors": {}}
        outs = {}
        for _ in range(DENSE_ROUNDS):
            for label, k in kerns.items():
                if label in row["errors"] or (label == "no_finish" and p.split_k == 1):
                    continue                            # no_finish: split plans only (it writes float32 partials)
                gemv.gemv_dp4a_kernel = k
                try:
                    outs.setdefault(label, int4_linear(x, packed[0], scales[0], plan=p).clone())
                    row["us"].setdefault(label, []).append(
                        time_copies(lambda i: int4_linear(x, packed[i], scales[i], plan=p), copies))
                except Exception as e:                  # a variant that does not compile is a result too
                    row["errors"][label] = f"{type(e).__name__}: {str(e)[:300]}"
        gemv.gemv_dp4a_kernel = kerns["tree"]
        row["same_bits"] = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()
                            if k != "no_finish"}
        row["ratio_to_tree"] = {k: dict(zip(("median", "lo", "hi"), median_ci([a / b for a, b in zip(v, row["us"]["tree"])])))
                                for k, v in row["us"].items()}
        row["compiled"] = {k: compiled(kern) for k, kern in kerns.items()}
        res["dense"].append(row)
        print(N, K, row["same_bits"], {k: f"{sorted(v)[len(v) // 2]:.2f} us {row['ratio_to_tree'][k]['median']:.3f} "
                                          f"[{row['ratio_to_tree'][k]['lo']:.3f}, {row['ratio_to_tree'][k]['hi']:.3f}]"
                                       for k, v in row["us"].items()}, row["errors"], flush=True)
        Path(path).write_text(json.dumps(res, indent=1))
        del packed, scales
        torch.cuda.empty_cache()


def grouped_rows(res, path):
    from int4lab.bench import timing
    from int4lab.kernels import grouped
    from int4lab.kernels.moe import moe_decode_grouped
    from int4lab.tune.sweep import grouped_probe_row
    dev = torch.device("cuda")
    l2 = timing.l2_bytes()
    kerns = grouped_kernels()
    for model, T in GROUPED_ROWS:
        torch.manual_seed(0)
        x, ids, tw, w, act, nbytes, pp = grouped_probe_row(model, T, dev, l2)
        variants = {"tree": ("tree", pp), "tma": ("tma", pp),
                    "tma_s4": ("tma", tuple(dataclasses.replace(p, num_stages=4) if p.kind == "mma" else p for p in pp)),
                    "tma_bk256": ("tma", tuple(dataclasses.replace(p, block_k=256) if p.kind == "mma" else p for p in pp))}
        row = {"model": model, "tokens": T, "copies": len(w), "bytes": nbytes, "n_active": act,
               "plans": {k: [str(p) for p in v[1]] for k, v in variants.items()}, "us": {}, "errors": {}}
        outs = {}
        for _ in range(GROUPED_ROUNDS):
            for label, (kname, plans) in variants.items():
                if label in row["errors"]:
                    continue
                grouped.grouped_mma_kernel = kerns[kname]
                try:
                    outs.setdefault(label, moe_decode_grouped(x, ids, tw, *w[0], plan=plans).clone())
                    s = timing.summarise(timing.time_calls(
                        [lambda i=i: moe_decode_grouped(x, ids, tw, *w[i], plan=plans) for i in range(len(w))]))
                    row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
                except Exception as e:
                    row["errors"][label] = f"{type(e).__name__}: {str(e)[:300]}"
        grouped.grouped_mma_kernel = kerns["tree"]
        ref = outs["tree"].float()
        row["same_bits"] = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()}
        row["max_rel_diff"] = {k: float((o.float() - ref).abs().max() / ref.abs().max()) for k, o in outs.items()}
        row["compiled"] = {k: compiled(kern) for k, kern in kerns.items()}
        res["grouped"].append(row)
        print(model, T, row["same_bits"], {k: [v[0] for v in vs] for k, vs in row["us"].items()}, row["errors"], flush=True)
        Path(path).write_text(json.dumps(res, indent=1))
        del w
        torch.cuda.empty_cache()


def library(out_dir):
    """v42b: the library's own TMA path (plan.tma) against the same plans with it off, on the six tensor-core rows."""
    from int4lab.bench import timing
    from int4lab.kernels.moe import moe_decode_grouped
    from int4lab.receipts import provenance
    from int4lab.tune.sweep import grouped_probe_row
    dev = torch.device("cuda")
    l2 = timing.l2_bytes()
    path = Path(out_dir) / ("probe_v42b_bm_h200.json" if "--bm-only" in sys.argv else "probe_v42b_tma_library_h200.json")
    res = {"provenance": provenance("python3 scripts/probe_tma.py $OUT --library"),
           "method": "int4lab.bench.timing (median of 20 replays, p10 / p90) of moe_decode_grouped under the table's "
                     f"plans with plan.tma on and off, and TMA with block_k 256 or the other tile height; alternating, "
                     f"{GROUPED_ROUNDS_LIBRARY} rounds", "rows": []}
    for model, T in GROUPED_ROWS:
        torch.manual_seed(0)
        x, ids, tw, w, act, nbytes, pp = grouped_probe_row(model, T, dev, l2)
        # The levers TMA reopens (last measured on the threads' loads): block_k 256 (other bits: fewer K
        # tiles per split change the fp32 sum order) and the neighbouring tile height (same bits).
        other_m = {8: 16, 16: 8, 32: 16}
        variants = {"threads": tuple(dataclasses.replace(p, tma=False) for p in pp), "tma": pp,
                    "tma_bk256": tuple(dataclasses.replace(p, block_k=256) if p.kind == "mma" else p for p in pp),
                    "tma_bm_other": tuple(dataclasses.replace(p, block_m=other_m[p.block_m],
                                                              half_tiles=p.half_tiles and other_m[p.block_m] >= 16)
                                          if p.kind == "mma" else p for p in pp)}
        if "--bm-only" in sys.argv:   # the second call: the tile heights alone, after a first that refused 8 rows
            variants = {k: v for k, v in variants.items() if k in ("tma", "tma_bm_other")}
        row = {"model": model, "tokens": T, "copies": len(w), "bytes": nbytes, "n_active": act,
               "plans": {k: [str(p) for p in v] for k, v in variants.items()}, "us": {}}
        outs = {}
        row["errors"] = {}
        for _ in range(GROUPED_ROUNDS_LIBRARY):
            for label, plans in variants.items():
                if label in row["errors"]:
                    continue
                try:
                    outs.setdefault(label, moe_decode_grouped(x, ids, tw, *w[0], plan=plans).clone())
                    s = timing.summarise(timing.time_calls(
                        [lambda i=i: moe_decode_grouped(x, ids, tw, *w[i], plan=plans) for i in range(len(w))]))
                except Exception as e:  # a lever plan the tile cannot serve is a result, not the probe's end
                    row["errors"][label] = f"{type(e).__name__}: {str(e)[:300]}"
                    continue
                row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
        base = outs["threads" if "threads" in outs else "tma"]
        row["same_bits"] = {k: torch.equal(o.view(torch.int16), base.view(torch.int16))
                            for k, o in outs.items()}
        res["rows"].append(row)
        print(model, T, row["same_bits"], {k: [v[0] for v in vs] for k, vs in row["us"].items()}, flush=True)
        path.write_text(json.dumps(res, indent=1))
        del w
        torch.cuda.empty_cache()


THRESHOLD_ROWS = (("mixtral", 4), ("mixtral", 8), ("olmoe", 8), ("olmoe", 16), ("qwen3", 16), ("qwen3", 32))


def threshold(out_dir):
    """v42c: below 4 mean rows per expert, the table's one-row dp4a tile against the 8-row tensor-core tile
    with TMA (the dispatcher's threshold was measured on the threads' loads)."""
    from int4lab.kernels.plan import GROUPED_TABLE, resolve_grouped
    from int4lab.receipts import provenance
    from int4lab.shapes import MODELS
    from int4lab.tune.sweep import grouped_probe_row, time_plan_pairs
    from int4lab.bench import timing
    dev = torch.device("cuda")
    l2 = timing.l2_bytes()
    mma8 = next(p for m, _, p in GROUPED_TABLE["sm90"] if m == 4.0 and p.block_m == 8)
    path = Path(out_dir) / "probe_v42c_threshold_h200.json"
    res = {"provenance": provenance("python3 scripts/probe_tma.py $OUT --threshold"),
           "method": "int4lab.tune.sweep.time_plan_pairs (median of 20 replays, p10 / p90), 3 alternating rounds",
           "rows": []}
    for model, T in THRESHOLD_ROWS:
        torch.manual_seed(0)
        m = MODELS[model]
        x, ids, tw, w, act, nbytes, pp = grouped_probe_row(model, T, dev, l2)
        L, E = T * m.top_k, m.n_experts
        alt = (resolve_grouped(mma8, 2 * m.intermediate, m.hidden, L, E, dev),
               resolve_grouped(mma8, m.hidden, m.intermediate, L, E, dev))
        variants = {"table": pp, "mma8_tma": alt}
        row = {"model": model, "tokens": T, "mean_rows": L / min(E, L), "bytes": nbytes,
               "plans": {k: [str(p) for p in v] for k, v in variants.items()},
               "us": time_plan_pairs(x, ids, tw, w, variants, rounds=3)}
        res["rows"].append(row)
        print(model, T, {k: [v[0] for v in vs] for k, vs in row["us"].items()}, flush=True)
        path.write_text(json.dumps(res, indent=1))
        del w
        torch.cuda.empty_cache()


def main(out_dir):
    from int4lab.receipts import provenance
    path = Path(out_dir) / "probe_v42_tma_h200.json"
    res = {"provenance": provenance("python3 scripts/probe_tma.py $OUT"),
           "method": {"dense": f"int4lab.tune.sweep.time_copies (median of 20 replays); variants alternate over "
                               f"{DENSE_ROUNDS} rounds; ratio to the tree per round, median and 95 % interval",
                      "grouped": "int4lab.bench.timing (median of 20 replays, p10 / p90) of the MoE step "
                                 f"(moe_decode_grouped); variants alternate, {GROUPED_ROUNDS} rounds"},
           "dense": [], "grouped": []}
    dense(res, path)
    grouped_rows(res, path)


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(check())
    if "--threshold" in sys.argv:
        threshold(sys.argv[1])
    else:
        library(sys.argv[1]) if "--library" in sys.argv else main(sys.argv[1])
