"""Accuracy cases of the decode kernels against float64 references: chapter 03 tabulates and plots these.

Shape legend: E = experts, N = out features, K = in features, R = activation rows, T = tokens, A = top-k.

Each case draws fresh random weights and activations, runs one kernel into a NaN-poisoned buffer and
reports max|out - ref| / max|ref| (the issue's bound is 2**-7) and the fraction of outputs equal, bit
for bit, to the reference rounded once to bf16 (what an exact kernel with one final rounding gives).
"""
from __future__ import annotations

import torch

from .format import dequant_int4_ref, pack_int4_b32, quant_x_rows_ref
from .kernels.gemv import gemv_int4_b32, gemv_ref, int4_linear
from .kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
from .kernels.moe import moe_decode_grouped, moe_decode_ref, moe_decode_step
from .kernels.quant import quant_x_rows

BOUND = 2.0 ** -7


def _row(kernel, shape, out, ref):
    out, ref = out.float().cpu(), ref.float().cpu()
    scale = float(ref.abs().max())
    return {"kernel": kernel, "shape": shape, "unwritten": int(out.isnan().sum()),
            "rel_err": float((out - ref).abs().max()) / scale,
            "exact_frac": float((out == ref.bfloat16().float()).float().mean())}


def _poisoned(shape, device):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)


def gemv_case(R, N, K, E, device, split_k=None):
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(E, N, K) * 0.1))
    xq, xs = quant_x_rows(torch.randn(R, K).bfloat16().to(device))
    eids = torch.randint(0, E, (R,), dtype=torch.int32, device=device)
    out = gemv_int4_b32(xq, xs, p, s, eids, N, K, out=_poisoned((R, N), device), split_k=split_k)
    name = "gemv_int4_b32" + (f" split_k={split_k}" if split_k else "")
    return _row(name, f"R{R} {N}x{K} E{E}", out, gemv_ref(xq, xs, p, s, eids, N, K))


def linear_case(R, N, K, device, act):
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(N, K) * 0.1))
    x = torch.randn(R, K).bfloat16().to(device)
    out = int4_linear(x, p, s, act=act, out=_poisoned((R, N), device))
    w = dequant_int4_ref(p.cpu(), s.cpu(), N, K).double()
    xd = x.cpu().double()
    if act == "int8":
        q, sc = quant_x_rows_ref(x.cpu())
        xd = (q.double().reshape(R, -1, 32) * sc.double()[..., None]).reshape(R, K)
    return _row(f"int4_linear act={act}", f"R{R} {N}x{K}", out, (xd @ w.T).float())


def grouped_case(L, N, K, E, device, block_m=16):
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(E, N, K) * 0.1))
    ids = torch.randint(0, E, (L,), dtype=torch.int32, device=device)
    t = build_group_tiles(ids, E, block_m)
    xq, xs = quant_x_rows(torch.randn(L, K).bfloat16().to(device))
    o = t.order.long()
    out = gemm_int4_b32_grouped(xq[o], xs[o], p, s, t.row0, t.rows, t.group, out=_poisoned((L, N), device),
                                block_m=block_m)
    return _row("gemm_int4_b32_grouped", f"L{L} {N}x{K} E{E}", out, gemv_ref(xq[o], xs[o], p, s, ids[o], N, K))


def moe_case(T, A, E, H, I, device, grouped=False):
    gp, gs = (t.to(device) for t in pack_int4_b32(torch.randn(E, 2 * I, H) * 0.2))
    dp, ds = (t.to(device) for t in pack_int4_b32(torch.randn(E, H, I) * 0.2))
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).int().to(device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    fn = moe_decode_grouped if grouped else moe_decode_step
    out = fn(x, ids, tw, gp, gs, dp, ds)
    return _row(fn.__name__, f"T{T} A{A} E{E} H{H} I{I}", out, moe_decode_ref(x, ids, tw, gp, gs, dp, ds))
