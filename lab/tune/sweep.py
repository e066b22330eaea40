"""Tune the GEMV launch plan on a GPU: time plan variants and MoE steps with the bench's timer.

    python -m lab.tune.sweep --out sweep.json [--budget-s 200] [--kinds dp4a]
    python -m lab.tune.sweep --pick --out sweep.json        # best dp4a plan, as JSON

This is the tuning tool (which row to put in `int4lab/kernels/plan.py`); the side-by-side comparison with
peers is `python -m lab.bench`. Timing is the bench's (`lab.bench.timing`): one CUDA graph over
`copies` calls, each on its own copy of the weights, copies x bytes > 4 x L2, median of 30 replays. Every
variant is passed to the launchers as an explicit `plan=` (no environment variable). Weights are random
bytes and random fp16 scales: the kernels' speed does not depend on the values. Shapes come from
`lab.bench.shapes`.

Shape legend: E = experts, N = out features, K = in features, A = experts per token, H = hidden, I = one
expert's intermediate width.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

from lab.bench.timing import copies_for, l2_bytes, summarise, time_calls
from lab.bench.traffic import gemv_bytes
from int4lab.kernels.gemv import int4_linear
from int4lab.kernels.moe import moe_decode_grouped, moe_decode_routed
from int4lab.kernels.plan import MAX_SPLIT_K, GemvPlan, GroupedPlan, gemv_plan, grouped_plan, num_sms
from lab.provenance import portable_command, write_receipt
from lab.bench.shapes import MODELS, all_shapes, by_priority

REPLAYS = 30
COMMAND = "python -m lab.tune.sweep"


def sweep_shapes() -> list[tuple[str, int, int]]:
    """(name, N, K) of every distinct decode GEMV, the targets' shapes first."""
    seen, out = set(), []
    for s in by_priority(all_shapes()):
        if (s.N, s.K) not in seen:
            seen.add((s.N, s.K))
            out.append((f"{s.model}.{s.layer}", s.N, s.K))
    return out


def int4_bytes(N, K) -> int:
    """Weight + scale bytes of one int4-b32 [N, K] matrix (what a GEMV must stream)."""
    return gemv_bytes("int4_b32", N, K) - 2 * (N + K)


def time_copies(call_on, copies: int, replays: int = REPLAYS) -> float:
    """Median us per call of call_on(i), i = 0..copies-1, all in one CUDA graph (the bench's timer)."""
    return summarise(time_calls([lambda i=i: call_on(i) for i in range(copies)], replays=replays))["us"]


PROBE_METHOD = "lab.bench.timing (median of 20 replays, p10 / p90); variants alternate, twice"


def grouped_probe_row(model: str, tokens: int, dev, l2: int):
    """One row of a grouped-plan probe: moe_setup's (x, ids, router weights, weight copies, active experts,
    bytes) and the table's (gate_up, down) plan pair for it."""
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    x, ids, tw, w, act, nbytes = moe_setup(m, tokens, dev, l2)
    pair = (grouped_plan(2 * I, H, tokens * A, E, dev), grouped_plan(H, I, tokens * A, E, dev))
    return x, ids, tw, w, act, nbytes, pair


def keep_row(res: dict, row: dict, path) -> None:
    """Append a probe row to `res`, print its medians and rewrite the receipt at `path` (a cut-off call keeps
    the rows it finished), then hand the cached GPU memory back (the caller drops the row's weights first)."""
    res["rows"].append(row)
    print(row["model"], row["tokens"], {k: [v[0] for v in vs] for k, vs in row["us"].items()}, flush=True)
    Path(path).write_text(json.dumps(res, indent=1))
    torch.cuda.empty_cache()


def time_plan_pairs(x, ids, tw, w, variants: dict, rounds: int = 2) -> dict:
    """moe_decode_grouped under each (gate_up, down) plan pair of `variants` in turn, `rounds` times (the probes'
    alternation, so a drift of the GPU hits every variant alike): label -> [[us, p10, p90] per round], each a
    graph of one call per weight copy in `w` (moe_setup's rotation past L2)."""
    out = {}
    for _ in range(rounds):
        for label, pair in variants.items():
            s = summarise(time_calls([lambda i=i, pair=pair: moe_decode_grouped(x, ids, tw, *w[i], plan=pair)
                                      for i in range(len(w))]))
            out.setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
    return out


def dense_weights(N, K, copies, dev):
    packed = torch.randint(0, 256, (copies, N, K // 2), dtype=torch.uint8, device=dev)
    scales = (torch.rand(copies, N, K // 32, device=dev) * 0.01 + 1e-3).half()
    return packed, scales


# dp4a grid (block_n, block_k, num_warps, waves), num_stages 2 (first swept at commit f7b7d20). With
# one launch per GEMV, waves 0.25 means "split K only when the grid would be tiny" (a split costs ~2 us of tail
# latency).
DP4A_GRID = [(bn, bk, nw, waves) for bn in (8, 16, 32) for bk in (1024, 2048, 4096) for nw in (4, 8)
             for waves in (0.25, 2.0)]


def variants(N, K, dev, full, kinds=("dp4a",)):
    """(label, GemvPlan) rows to try: the table's choice first, then the dp4a grid (all of it when `full`,
    else its waves-0.25 half)."""
    out = [("table", gemv_plan(N, K, 1, dev))]
    if "dp4a" in kinds:
        for bn, bk, nw, waves in DP4A_GRID if full else [g for g in DP4A_GRID if g[3] == 0.25]:
            p = GemvPlan(block_n=bn, block_k=bk, num_warps=nw, num_stages=2, waves=waves)
            out.append((f"dp4a_bn{bn}_bk{bk}_w{nw}_waves{waves:g}", gemv_plan(N, K, 1, dev, **dataclasses.asdict(p))))
    return out


def sweep_dense(name, N, K, dev, full, rows, deadline, kinds=("dp4a",), l2=60 * 2**20, replays=REPLAYS):
    nbytes = int4_bytes(N, K)
    copies = copies_for(nbytes, l2)
    packed, scales = dense_weights(N, K, copies, dev)
    x = torch.randn(1, K, device=dev).bfloat16()
    row = {"shape": name, "N": N, "K": K, "bytes_int4_b32": nbytes, "copies": copies}
    if "baselines" in kinds:                           # bf16 and W4A16; usually left to the bench
        wb = torch.randn(copies_for(N * K * 2, l2, cap=64), N, K, device=dev).bfloat16()
        row["bf16_us"] = time_copies(lambda i: torch.matmul(x, wb[i].t()), wb.shape[0], replays)
        del wb
        row["w4a16_us"] = time_copies(lambda i: int4_linear(x, packed[i], scales[i], act="bf16"), copies, replays)
    res = {}
    for label, p in variants(N, K, dev, full, kinds):
        if time.time() > deadline:
            row["truncated"] = True
            break
        try:
            us = time_copies(lambda i: int4_linear(x, packed[i], scales[i], plan=p), copies, replays)
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


# Big-shape split sweep: (block_n, block_k, num_warps, prefetch) x explicit split_k, one launch each.
SPLIT_CFGS = [(32, 1024, 4, False), (16, 2048, 4, False), (16, 1024, 4, False), (32, 1024, 4, True),
              (64, 512, 4, False)]
SPLIT_SHAPES = [(4096, 14336), (28672, 8192)]


def sweep_splits(dev, rows, deadline, l2=60 * 2**20, replays=REPLAYS):
    """Every SPLIT_CFGS plan at every split_k that divides its K tiles evenly (and 1), per SPLIT_SHAPES."""
    for N, K in SPLIT_SHAPES:
        nbytes = int4_bytes(N, K)
        copies = copies_for(nbytes, l2)
        packed, scales = dense_weights(N, K, copies, dev)
        x = torch.randn(1, K, device=dev).bfloat16()
        row = {"N": N, "K": K, "bytes_int4_b32": nbytes, "copies": copies, "us": {}}
        row["us"]["table"] = time_copies(lambda i: int4_linear(x, packed[i], scales[i]), copies, replays)
        # the bench's allocation: one tensor per copy (a clone each), not one [copies, N, K/2] block
        sep = [(packed[i].clone(), scales[i].clone()) for i in range(copies)]
        row["us"]["table_cloned"] = time_copies(lambda i: int4_linear(x, *sep[i]), copies, replays)
        del sep
        for bn, bk, nw, pf in SPLIT_CFGS:
            tiles = -(-K // bk)
            splits = {d for d in range(2, MAX_SPLIT_K + 1) if tiles % d == 0 and (N < 16384 or d == 2)}
            for sk in sorted({1} | splits):
                if time.time() > deadline:
                    row["truncated"] = True
                    break
                p = GemvPlan(block_n=bn, block_k=bk, num_warps=nw, num_stages=2, waves=1.0, split_k=sk, prefetch=pf)
                label = f"bn{bn}_bk{bk}_w{nw}{'_pf' if pf else ''}_sk{sk}"
                row["us"][label] = time_copies(lambda i: int4_linear(x, packed[i], scales[i], plan=p), copies,
                                               replays)
        best = min(row["us"], key=row["us"].get)
        row["best"] = best
        rows.append(row)
        print(f"splits {N:6d}x{K:<6d} table {row['us']['table']:7.2f}  best {row['us'][best]:7.2f} ({best})",
              flush=True)
        del packed, scales
        torch.cuda.empty_cache()


# Where the one-launch GEMV's time goes: the same weights with x quantised inside (float x, the default),
# with int8 codes prepared by a separate launch (no quantisation inside), and that launch alone.
CODES_SHAPES = [(4096, 14336), (28672, 8192), (14336, 4096), (4096, 4096), (2048, 2048), (2048, 768)]


def sweep_codes(dev, rows, l2=60 * 2**20, replays=REPLAYS):
    """Per CODES_SHAPES shape: int4_linear (x quantised in the GEMV), gemv_int4_b32 on codes, quant_x_rows, and
    quant + GEMV as two launches; per MoE model the one-token step's two GEMVs with and without their prologue."""
    from int4lab.kernels.gemv import X_CODES, X_FLOAT, X_SWIGLU, gemv_int4_b32
    from int4lab.kernels.launch import launch_gemv
    from int4lab.kernels.quant import quant_x_rows, swiglu_quant_rows
    for N, K in CODES_SHAPES:
        nbytes = int4_bytes(N, K)
        copies = copies_for(nbytes, l2)
        packed, scales = dense_weights(N, K, copies, dev)
        x = torch.randn(1, K, device=dev).bfloat16()
        xq, xs = quant_x_rows(x)
        e0 = torch.zeros(1, dtype=torch.int32, device=dev)
        row = {"N": N, "K": K, "bytes_int4_b32": nbytes, "copies": copies, "us": {}}
        row["us"]["float_x_one_launch"] = time_copies(lambda i: int4_linear(x, packed[i], scales[i]), copies, replays)
        row["us"]["codes_gemv_only"] = time_copies(
            lambda i: gemv_int4_b32(xq, xs, packed[i:i + 1], scales[i:i + 1], e0, N, K), copies, replays)
        row["us"]["quant_only"] = time_copies(lambda i: quant_x_rows(x), copies, replays)
        row["us"]["quant_then_codes_gemv"] = time_copies(
            lambda i: gemv_int4_b32(*quant_x_rows(x), packed[i:i + 1], scales[i:i + 1], e0, N, K), copies, replays)
        rows.append(row)
        print(f"codes {N:6d}x{K:<6d} " + "  ".join(f"{k} {v:6.2f}" for k, v in row["us"].items()), flush=True)
        del packed, scales
        torch.cuda.empty_cache()
    for model in MODELS:
        m = MODELS[model]
        E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
        gu = dense_weights(2 * I, H, E, dev)
        dn = dense_weights(H, I, E, dev)
        sets = E // A
        ids = torch.arange(E, device=dev, dtype=torch.int32)[torch.randperm(E, device=dev)].view(sets, A)
        tw = torch.softmax(torch.randn(1, A, device=dev), -1)
        x = torch.randn(1, H, device=dev).bfloat16()
        xq, xs = quant_x_rows(x)
        h = torch.randn(A, 2 * I, device=dev).bfloat16()
        hq, hs = swiglu_quant_rows(h)
        row = {"model": model, "us": {}}
        row["us"]["gate_up_float_x"] = time_copies(lambda i: launch_gemv(
            x, None, *gu, ids[i], 2 * I, H, A, x_mode=X_FLOAT, rows_per_x=A), sets, replays)
        row["us"]["gate_up_codes"] = time_copies(lambda i: launch_gemv(
            xq, xs, *gu, ids[i], 2 * I, H, A, x_mode=X_CODES, rows_per_x=A), sets, replays)
        row["us"]["down_swiglu_h"] = time_copies(lambda i: launch_gemv(
            h, None, *dn, ids[i], H, I, A, x_mode=X_SWIGLU, topk_w=tw), sets, replays)
        row["us"]["down_codes"] = time_copies(lambda i: launch_gemv(
            hq, hs, *dn, ids[i], H, I, A, x_mode=X_CODES, topk_w=tw), sets, replays)
        row["us"]["step_pdl"] = time_copies(lambda i: moe_decode_routed(x, ids[i:i + 1], tw, *gu, *dn), sets, replays)
        for bn, bk, nw, waves in ((16, 1024, 4, 0.25), (64, 1024, 8, 0.25), (32, 512, 4, 0.25), (32, 2048, 8, 0.25),
                                  (32, 1024, 4, 1.0)):
            p = GemvPlan(bn, bk, nw, 2, waves)
            label = f"bn{bn}_bk{bk}_w{nw}" + ("_waves1" if waves == 1.0 else "")
            row["us"][f"step_pdl_{label}"] = time_copies(
                lambda i: moe_decode_routed(x, ids[i:i + 1], tw, *gu, *dn, plan=p), sets, replays)
        rows.append(row)
        print(f"codes moe {model:8s} " + "  ".join(f"{k} {v:6.2f}" for k, v in row["us"].items()), flush=True)
        del gu, dn
        torch.cuda.empty_cache()


def sweep_moe(model, dev, rows, plans=(("table", None),), replays=REPLAYS):
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    gu = dense_weights(2 * I, H, E, dev)
    dn = dense_weights(H, I, E, dev)
    x = torch.randn(1, H, device=dev).bfloat16()
    sets = E // A                                       # disjoint routings: each call reads other experts
    ids = torch.arange(E, device=dev, dtype=torch.int32)[torch.randperm(E, device=dev)].view(sets, 1, A)
    tw = torch.softmax(torch.randn(1, A, device=dev), -1)
    nbytes = A * (int4_bytes(2 * I, H) + int4_bytes(H, I))
    row = {"model": model, "E": E, "topk": A, "H": H, "I": I, "bytes_int4_b32": nbytes, "copies": sets}
    for label, p in plans:
        for pdl in (False, True):
            key = f"us_{label}{'_pdl' if pdl else ''}"
            try:
                row[key] = time_copies(lambda i: moe_decode_routed(x, ids[i], tw, *gu, *dn, plan=p, pdl=pdl), sets,
                                       replays)
            except Exception as e:                     # PDL under capture is the thing being tried
                row[key.replace("us_", "error_")] = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        a = moe_decode_routed(x, ids[0], tw, *gu, *dn, pdl=False)
        b = moe_decode_routed(x, ids[0], tw, *gu, *dn, pdl=True)
        row["pdl_same_bits"] = bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))
    except Exception as e:
        row["pdl_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    rows.append(row)
    print(f"moe {model:8s} " + "  ".join(f"{k} {v:7.2f}" for k, v in row.items() if k.startswith("us_")),
          {k: v for k, v in row.items() if "pdl_" in k or "error" in k}, flush=True)


# Grouped MoE step: (block_n, block_k, num_warps) tried for each block_m. The dp4a kernel unrolls its rows
# over one shared weight tile, so the tile is sized like the routed GEMV's (<= 64 weight words per thread,
# block_n * block_k / 8 / (32 * num_warps)); block_m adds one [block_n, block_k / 32] accumulator per row.
# The compile report (tune/resources.py) shows bk 512 tiles free of layout conversions (no SHFL) and bk 1024
# ones paying 64 shuffles per row, hence the order.
GROUPED_SHAPES = [(32, 512, 4), (16, 512, 4), (64, 512, 8), (32, 1024, 4), (16, 1024, 4), (32, 256, 4)]
GROUPED_TOKENS = (4, 16, 64, 2, 8, 32)


# Tensor-core tiles (block_m, block_n, block_k, num_warps, num_stages): block_k / 32 blocks per batched dot.
# A probe of bn 32-128 x bk 32-512 (commit 2e9630c): bn64 bk128 s3 won from 8 rows per expert; then its
# neighbourhood (commit 0544912); bk256 and bm32 bn128 lost everywhere. Tiles of 4 and 8 rows (the compiler pads
# the MMA; the float32 scaling covers only the tile's rows): bm8 bn64 wins at 4 mean rows, bm4 never (commit
# 1692f76). With the weights on the MMA's M side (fewer instructions, other register counts: bm32 bn64 239,
# bm32 bn32 128, bm16 bn128 168) the tiles of 4-32 rows were tried again (commit cf7e687).
MMA_GROUPED = [(4, 64, 128, 4, 3), (8, 64, 128, 4, 3), (16, 64, 128, 4, 3), (32, 64, 128, 4, 3),
               (8, 32, 128, 4, 3), (16, 32, 128, 4, 3), (32, 32, 128, 4, 3), (8, 128, 128, 4, 3),
               (16, 128, 128, 4, 3), (16, 64, 128, 4, 4), (32, 32, 128, 4, 4)]


def grouped_variants(L: int, E: int, K_min: int, mma_only: bool = False):
    """(label, GroupedPlan or None) to try for L routed rows over E experts: the table (None), then dp4a
    tiles of block_m around the mean rows per routed expert (each also tile-major), then tensor-core tiles
    (block_m 16, tile-major). `mma_only`: the table, the table's plan tile-major and the tensor-core tiles."""
    mean = L / max(1, min(E, L))
    bm0 = min(8, 1 << max(0, math.ceil(mean) - 1).bit_length())
    out = [("table", None)]
    if not mma_only:
        for bm in sorted({max(1, bm0 // 2), bm0, min(8, 2 * bm0)}):
            fits = [(bn, bk, nw) for bn, bk, nw in GROUPED_SHAPES
                    if bn * bk // 8 <= 64 * 32 * nw and bk <= max(128, 1 << (K_min - 1).bit_length())]
            for bn, bk, nw in fits[:2]:
                for major in (False, True):
                    out.append((f"dp4a_bm{bm}_bn{bn}_bk{bk}_w{nw}{'_tm' if major else ''}",
                                GroupedPlan(bm, bn, bk, nw, 2, tile_major=major)))
    else:
        out.append(("dp4a_bm4_bn32_bk512_w4_tm", GroupedPlan(4, 32, 512, 4, 2, tile_major=True)))
        out.append(("dp4a_bm1_bn32_bk512_w4_tm", GroupedPlan(1, 32, 512, 4, 2, tile_major=True)))
    if mean >= 2:
        for bm, bn, bk, nw, ns in MMA_GROUPED:
            out.append((f"mma_bm{bm}_bn{bn}_bk{bk}_w{nw}_s{ns}_tm",
                        GroupedPlan(bm, bn, bk, nw, ns, kind="mma", tile_major=True)))
    return out


def moe_setup(m, tokens: int, dev, l2: int):
    """One MoE row as the bench routes it: (x bf16 [T, H], ids int32 [T, A], router weights [T, A], weights,
    active experts, routed int4-b32 bytes). `weights` holds `copies` sets of E random experts, each
    (gate_up packed, scales, down packed, scales), so that copies x routed bytes > 4 x L2 (at most 16 sets)."""
    from lab.bench.peers import n_active, routing
    E, H, I = m.n_experts, m.hidden, m.intermediate
    ids_c, tw_c = routing(m, tokens)
    act = n_active(ids_c)
    nbytes = act * (int4_bytes(2 * I, H) + int4_bytes(H, I))
    copies = copies_for(nbytes, l2, cap=16)
    gu, dn = dense_weights(2 * I, H, copies * E, dev), dense_weights(H, I, copies * E, dev)
    w = [(gu[0][i * E:(i + 1) * E], gu[1][i * E:(i + 1) * E], dn[0][i * E:(i + 1) * E], dn[1][i * E:(i + 1) * E])
         for i in range(copies)]
    x = torch.randn(tokens, H, device=dev).bfloat16()
    return x, ids_c.to(dev), tw_c.to(dev), w, act, nbytes


def sweep_grouped(model, tokens, dev, rows, deadline, l2=60 * 2**20, replays=REPLAYS, mma_only=False):
    """Time the routed path and grouped variants for one (model, tokens): the bench's routing, random bytes.
"""
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    x, ids, tw, w, act, nbytes = moe_setup(m, tokens, dev, l2)
    copies = len(w)
    L = tokens * A
    row = {"model": model, "tokens": tokens, "E": E, "topk": A, "n_active": act, "bytes_int4_b32": nbytes,
           "copies": copies, "mean_rows_per_expert": L / min(E, L), "us": {}}
    row["us"]["routed"] = time_copies(lambda i: moe_decode_routed(x, ids, tw, *w[i]), copies, replays)
    ref = moe_decode_routed(x, ids, tw, *w[0]).float()
    for label, p in grouped_variants(L, E, min(H, I), mma_only):
        if time.time() > deadline:
            row["truncated"] = True
            break
        try:
            row["us"][label] = time_copies(lambda i: moe_decode_grouped(x, ids, tw, *w[i], plan=p), copies, replays)
            # every variant must agree with the routed path (same codes; float32 order may differ)
            got = moe_decode_grouped(x, ids, tw, *w[0], plan=p).float()
            row.setdefault("rel_err_vs_routed", {})[label] = float((got - ref).norm() / ref.norm())
        except Exception as e:                         # a variant that fails to compile is a result too
            row["us"][label] = f"{type(e).__name__}: {str(e)[:160]}"
    row["table_plan"] = dataclasses.asdict(grouped_plan(2 * I, H, L, E, dev))
    ok = {k: v for k, v in row["us"].items() if isinstance(v, float)}
    row["best"] = min(ok, key=ok.get)
    rows.append(row)
    print(f"grouped {model:8s} T{tokens:<3d} active {act:3d}  routed {row['us']['routed']:8.1f}  "
          f"table {ok.get('table', float('nan')):8.1f}  best {ok[row['best']]:8.1f} ({row['best']})", flush=True)
    del w
    torch.cuda.empty_cache()


def pick_plan(payload: dict, prefix: str = "dp4a_") -> dict | None:
    """The variant (by label prefix) with the smallest geometric mean of time over the shapes where every
    such variant was timed; returns its GemvPlan fields (without split_k: the plan's waves rule picks it)."""
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


KINDS = ("dp4a", "baselines")


def _read_sweep(path: Path) -> dict:
    """--pick's input: a sweep receipt; ValueError naming --out when it is missing or not one."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--out {str(path)!r} (with --pick) must be a readable sweep receipt: {e}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("dense"), list):
        raise ValueError(f"--out {str(path)!r} (with --pick) is not a dense sweep receipt (no 'dense' rows)")
    return rec


def _check_args(args) -> None:
    from int4lab.files import check_out_path
    bad = [k for k in args.kinds.split(",") if k not in KINDS]
    if bad or not args.kinds:
        raise ValueError(f"--kinds must be a comma list of {', '.join(KINDS)}, got {args.kinds!r}")
    if args.replays < 1 or args.full < 0 or not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise ValueError(f"--replays must be >= 1, --full >= 0 and --budget-s a positive number of seconds, got "
                         f"{args.replays}, {args.full}, {args.budget_s}")
    if args.tokens is not None and any(t < 1 for t in args.tokens):
        raise ValueError(f"--tokens must be ints >= 1, got {args.tokens}")
    check_out_path(args.out)
    if not torch.cuda.is_available():
        raise ValueError("lab.tune.sweep times kernels on a CUDA device; torch sees none here (--pick reads a "
                         "receipt without one)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON receipt to write")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting new variants after this")
    ap.add_argument("--full", type=int, default=4, help="how many leading shapes get the full variant grid")
    ap.add_argument("--kinds", default="dp4a", help="comma list: dp4a (gemv_dp4a.py), baselines (bf16, W4A16)")
    ap.add_argument("--no-moe", action="store_true", help="dense shapes only")
    ap.add_argument("--replays", type=int, default=REPLAYS, help="timed graph replays per variant (median)")
    ap.add_argument("--pick", action="store_true", help="read --out and print the best dp4a plan as JSON")
    ap.add_argument("--grouped", action="store_true",
                    help="time the MoE step's routed path and grouped variants per (model, tokens) instead")
    ap.add_argument("--probe", action="store_true",
                    help="probe: grouped tensor-core tiles per --tokens (and with the flags below, big-shape "
                         "splits and the one-token MoE with and without PDL) in one receipt")
    ap.add_argument("--with-moe", action="store_true", help="--probe: also the one-token MoE with / without PDL")
    ap.add_argument("--with-splits", action="store_true", help="--probe: also the big-shape split sweep")
    ap.add_argument("--with-codes", action="store_true",
                    help="--probe: also where the one-launch GEMV's time goes (x quantised inside vs codes)")
    ap.add_argument("--tokens", type=int, nargs="*", default=None,
                    help=f"--grouped: decode batches to time (default {GROUPED_TOKENS})")
    args = ap.parse_args(argv)
    try:
        if args.pick:
            print(json.dumps(pick_plan(_read_sweep(args.out))))
            return 0
        _check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    l2 = l2_bytes()
    torch.manual_seed(0)
    deadline = time.time() + args.budget_s
    dense, moe = [], []
    if args.probe:
        # the whole command line (token lists included), with the output's directory elided
        command = portable_command(" ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)]))
        splits, moe1, grouped = [], [], []
        payload = {"method": f"lab.bench.timing, median of {args.replays} replays; random weight bytes",
                   "l2_bytes": l2, "splits": splits, "moe": moe1, "grouped": grouped}
        for model in MODELS if args.with_moe else ():
            sweep_moe(model, dev, moe1, replays=args.replays)
            write_receipt(args.out, payload, command=command)
        for T in args.tokens if args.tokens is not None else (16, 32, 64):
            for model in MODELS:
                if time.time() < deadline:
                    sweep_grouped(model, T, dev, grouped, deadline, l2=l2, replays=args.replays, mma_only=True)
                    write_receipt(args.out, payload, command=command)
        if args.with_codes:
            payload["codes"] = codes = []
            sweep_codes(dev, codes, l2=l2, replays=args.replays)
            write_receipt(args.out, payload, command=command)
        if args.with_splits:
            sweep_splits(dev, splits, deadline + 90, l2=l2, replays=args.replays)
            write_receipt(args.out, payload, command=command)
        return 0
    if args.grouped:
        grouped = []
        payload = {"method": f"lab.bench.timing, median of {args.replays} replays; routing of "
                             "lab.bench.peers.routing; random weight bytes", "l2_bytes": l2, "grouped": grouped}
        for T in args.tokens or GROUPED_TOKENS:
            for model in MODELS:
                if time.time() < deadline:
                    sweep_grouped(model, T, dev, grouped, deadline, l2=l2, replays=args.replays)
                    write_receipt(args.out, payload, command=COMMAND + " --grouped")
        return 0
    payload = {"method": "lab.bench.timing: CUDA-graph replay, weights rotated until copies*bytes > 4x L2, "
                         f"median of {args.replays} replays", "l2_bytes": l2, "sms": num_sms(dev), "dense": dense,
               "moe": moe}
    for i, (name, N, K) in enumerate(sweep_shapes()):
        if time.time() > deadline:
            break
        sweep_dense(name, N, K, dev, i < args.full, dense, deadline, tuple(args.kinds.split(",")), l2=l2,
                    replays=args.replays)
        write_receipt(args.out, payload, command=COMMAND)
    for model in () if args.no_moe else MODELS:
        if time.time() > deadline + 60:
            break
        sweep_moe(model, dev, moe, plans=[("table", None)])
        write_receipt(args.out, payload, command=COMMAND)
    print(json.dumps({"written": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
