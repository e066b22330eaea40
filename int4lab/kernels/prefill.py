"""Prefill: int4-b32 matmuls over many rows (scoring, calibration), weights decoded once per call.

Shape legend: R = rows (tokens), N = out features, K = in features, E = experts, H = hidden size,
I = expert intermediate size, k = experts per token, L = R * k routed rows (sorted by expert).

Motivation. The decode kernels (gemv*.py, grouped*.py, moe.py) read each int4 weight once per step and do
the dot products on CUDA cores: right for 1-16 rows, where the bytes are the cost. A scoring forward has
thousands of rows per weight; there the products are the cost, and they belong on the tensor cores.

Design, of the two ways to reach the tensor cores:
  (a) int8 tensor-core matmuls with the W4A8 numerics (an exact int32 dot per 32-block, times both scales,
      summed in float32): exact, but every 32-deep step of a 128 x 128 output tile needs 16 K scale FMAs on
      the CUDA cores beside the 512 K int8 MACs of the tensor cores, which run ~30x faster (H100): the
      epilogue costs about as much as the MMA, and bf16 speed would take a hand-scheduled kernel;
  (b) (this file) decode the weights once per call to bf16 [N, K] (experts: [E, N, K], routed experts only),
      quantise the activations exactly as W4A8 does and hand their dequantised values to cuBLAS (dense:
      torch.mm) or to a grouped bf16 GEMM (experts: torch._grouped_mm; a per-expert loop where absent).
      The GEMM is the same as the bf16 model's; the extra cost is the decode: read 0.5625 and write 2
      bytes per weight, then the GEMM reads the 2 bytes back (~4.6 bytes per weight per call), amortised
      over the rows that share the weight.

Numerics of (b), per output y[r, n] = sum_k a[r, k] * w[n, k], against `int4_matmul_ref`:
  * w = (nib - 8) * scale is exact in float32; the GEMM gets bf16(w), rounded once (round to nearest even).
  * act="int8": a = q * s, q the int8 codes and s the float32 scales of `quant_x_rows_ref` (same bits:
    `quant.quant_blocks`), the product one float32 multiply as the reference does; the GEMM gets bf16(a),
    rounded once. act="bf16": a = bf16(x) as in the reference; no further rounding.
  * bf16 has an 8-bit significand, so each rounding has relative error <= u = 2**-8; a product of the two
    bf16 operands is exact in float32 and the GEMM sums the products in float32 (cuBLAS with reduced-
    precision split-K reductions switched off for the call; the grouped GEMM accumulates in float32);
    the output is rounded to bf16 once, as in the reference.
  * Bound, with S = sum_k |a_k w_k|, g = (K + 1) * 2**-23 (a float32 sum in any order, each addition within
    one float32 ulp, covering tensor cores' truncating adds), for bf16 outputs y' (prefill) and y (ref):
        |y' - y| <= (2u + u^2 + 2g(1 + u)^2) * S + u * (|y'| + |y|) / (1 - u)    (W4A16: u in place of 2u + u^2)
    tests/lib/test_prefill.py asserts it, and that y' is the bf16 of the float64 sum of the rounded operands
    up to the float32 summation term alone (each operand rounded once, nothing else).
  * Size of the change: bf16(w) moves a weight by <= 2**-8 |w| <= s_w / 32, 1/16 of int4's own rounding
    (s_w / 2). bf16(a) moves an activation by <= 2**-8 |a| <= amax / 256, as much as int8's own rounding
    (s_x / 2 = amax / 254) at the block's largest values: up to twice the decode kernels' activation error
    per value, under 1.1x in rms for codes uniform in [-127, 127] and under 1.06x for Gaussian activations
    (asserted in tests/lib/test_prefill.py). lab.bench.prefill measures the effect on logits.
  * Why not fp16 operands (u = 2**-11): the GEMM needs one dtype for both, and fp16's range (65504, and
    subnormals below 2**-14) would need per-row scaling and range checks for activations and for scales
    above 8188, an fp32 GEMM output and a rescale epilogue: not simple; bf16 keeps float32's range.

Experts (`prefill_moe`), the decode kernels' semantics: h = bf16(gate_up(x)) per routed row; SwiGLU
silu(g) * u in float32 (`quant.silu_mul`; any other act_fn: act_fn(g) * u in float32), quantised and
dequantised like x (W4A16: rounded to bf16); y = bf16(down(a)) per routed row; out[t] = bf16(sum_j w[t, j]
* y[t, j]) with the router weights in float32, the k slots in order j = 0..k-1. Ids outside [0, E)
contribute nothing (as the CPU reference treats them). No host sync on the grouped-GEMM path.

Bytes per dense call: read N*K*(0.5 + 1/16) + 2*R*K, write 2*N*K + 2*R*K (decode + activations), then
the GEMM: read 2*N*K + 2*R*K, write 2*R*N.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .._checks import (FLOAT_DTYPES, check_devices, check_out, check_packed, check_rows_contiguous, check_shape,
                       check_tensor, interpreting)
from .epilogue import to_bf16_rne
from .quant import quant_blocks, silu_mul

TILE = 4096         # elements per program in every launch here: memory-bound tiles of 8-32 KB


@triton.jit
def dequant_bf16_kernel(
    # Pointers
    p_ptr, s_ptr, cnt_ptr, out_ptr,
    # Dimensions
    N, K,
    # Meta-parameters
    HAS_CNT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """packed uint8 [E, N, K/2] + scales fp16 [E, N, K/32] -> out bf16 [E, N, K] = bf16((nib - 8) * scale).

    Even k is the low nibble of byte k // 2. One program owns a BLOCK_N x BLOCK_K tile of one expert
    (program_id(2)); with HAS_CNT an expert whose row count cnt[e] is 0 is skipped (its tile left unwritten).
    """
    e = tl.program_id(2).to(tl.int64)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)     # byte index
    offs_s = tl.program_id(1) * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)   # scale index
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    live = offs_n < N
    if HAS_CNT:
        live = live & (tl.load(cnt_ptr + e) > 0)
    row = e * N + offs_n.to(tl.int64)                                          # [BLOCK_N]
    byte = tl.load(p_ptr + row[:, None] * (K // 2) + offs_b[None, :],
                   mask=live[:, None] & (offs_b < K // 2)[None, :], other=0).to(tl.int32)
    q = tl.reshape(tl.join((byte & 0xF) - 8, (byte >> 4) - 8), [BLOCK_N, BLOCK_K // 32, 32])   # even k low
    sc = tl.load(s_ptr + row[:, None] * (K // 32) + offs_s[None, :],
                 mask=live[:, None] & (offs_s < K // 32)[None, :], other=0.0).to(tl.float32)
    w = tl.reshape(q.to(tl.float32) * sc[:, :, None], [BLOCK_N, BLOCK_K])    # exact in float32
    mask = live[:, None] & (offs_k < K)[None, :]
    tl.store(out_ptr + row[:, None] * K + offs_k[None, :], to_bf16_rne(w), mask=mask)


@triton.jit
def act_rows_kernel(
    # Pointers
    x_ptr, map_ptr, out_ptr, q_ptr, s_ptr,
    # Dimensions
    R, K, stride_xr,
    # Meta-parameters
    HAS_MAP: tl.constexpr, SWIGLU: tl.constexpr, QUANT: tl.constexpr, STORE_CODES: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, USE_ASM: tl.constexpr,
):
    """out bf16 [R, K], row i from source row r = map[i] (or i) of x (SWIGLU: [*, 2K], gate columns first,
    v = silu(gate) * up in float32, else [*, K]): QUANT: bf16(q * s) with q, s of quant_x_rows_ref
    (STORE_CODES also writes q int8 [R, K] and s float32 [R, K/32]); else bf16(v). One program owns
    BLOCK_R rows x BLOCK_K columns, handled as BLOCK_R * BLOCK_K / 32 scale blocks of 32 values."""
    NB: tl.constexpr = BLOCK_K // 32
    blk = tl.arange(0, BLOCK_R * NB)                                           # [BLOCK_R * NB] blocks
    i = tl.program_id(0).to(tl.int64) * BLOCK_R + blk // NB                    # output row of each block
    kb = tl.program_id(1) * NB + blk % NB                                      # scale-block index
    offs = kb[:, None] * 32 + tl.arange(0, 32)[None, :]                        # column index [BLOCK_R * NB, 32]
    live = i < R
    mask = live[:, None] & (offs < K)
    if HAS_MAP:
        r = tl.load(map_ptr + i, mask=live, other=0).to(tl.int64)
    else:
        r = i
    src = x_ptr + r[:, None] * stride_xr + offs
    v = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    if SWIGLU:
        v = silu_mul(v, tl.load(src + K, mask=mask, other=0.0).to(tl.float32))
    if QUANT:
        q, s = quant_blocks(v, USE_ASM)
        v = q * s[:, None]                                                     # one float32 product, as the ref
        if STORE_CODES:
            tl.store(q_ptr + i[:, None] * K + offs, q.to(tl.int8), mask=mask)
            tl.store(s_ptr + i * (K // 32) + kb, s, mask=live & (kb < K // 32))
    tl.store(out_ptr + i[:, None] * K + offs, to_bf16_rne(v), mask=mask)


@triton.jit
def combine_slots_kernel(
    # Pointers
    y_ptr, map_ptr, w_ptr, out_ptr,
    # Dimensions
    T, H,
    # Meta-parameters
    TOPK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """out[t] = bf16(sum_{j < TOPK} w[t, j] * y[map[t, j]]) in float32, j in order; map[t, j] < 0 (an id
    outside [0, E)) contributes nothing. y bf16 [L, H], map int64 [T, TOPK], w float [T, TOPK]. One program
    owns BLOCK_T tokens x BLOCK_H columns."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = t < T
    mask = live[:, None] & (offs < H)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        row = tl.load(map_ptr + t * TOPK + j, mask=live, other=-1)
        ok = row >= 0
        wt = tl.where(ok, tl.load(w_ptr + t * TOPK + j, mask=live, other=0.0).to(tl.float32), 0.0)
        yv = tl.load(y_ptr + tl.maximum(row, 0)[:, None] * H + offs[None, :], mask=mask & ok[:, None], other=0.0)
        acc += wt[:, None] * yv.to(tl.float32)
    tl.store(out_ptr + t[:, None] * H + offs[None, :], to_bf16_rne(acc), mask=mask)


# ------------------------------------------------------------------------------------------ launchers

def dequant_int4_bf16(packed, scales, counts=None, out=None):
    """bf16 [N, K] or [E, N, K] = bf16(dequant_int4_ref(packed, scales)), bit for bit. counts (int [E]): experts
    with 0 rows are skipped and their slice of out left as it was (the grouped GEMM never reads it)."""
    check_tensor("packed", packed, (torch.uint8,), (2, 3))
    N, K = packed.shape[-2], packed.shape[-1] * 2
    check_packed(packed, scales, N, K)
    E = packed.shape[0] if packed.dim() == 3 else 1
    if counts is not None:
        check_tensor("counts", counts, (torch.int32, torch.int64), (1,))
        check_shape("counts", counts, (E,))
    dev = check_devices(packed=packed, scales=scales, counts=counts, out=out)
    packed, scales = packed.contiguous(), scales.contiguous()
    out = check_out("out", out, packed.shape[:-1] + (K,), torch.bfloat16, dev)
    bk = min(128, triton.next_power_of_2(K))
    bn = TILE // bk
    dequant_bf16_kernel[(triton.cdiv(N, bn), triton.cdiv(K, bk), E)](
        packed, scales, counts if counts is not None else packed, out, N, K,
        HAS_CNT=counts is not None, BLOCK_N=bn, BLOCK_K=bk)
    return out


def _check_act(act) -> None:
    if act not in ("int8", "bf16"):
        raise ValueError(f"act must be 'int8' (W4A8) or 'bf16' (W4A16), got {act!r}")


def act_rows(x, act: str, rows=None, swiglu: bool = False, codes: bool = False):
    """The GEMM's bf16 activations [R_out, K] from x [R, K] (swiglu: [R, 2K], gate first): row i from x[rows[i]]
    (rows int [R_out], default all rows). act "int8": bf16(q * s) of the W4A8 codes (codes=True also
    returns q int8 and s float32, bit-identical to quant_x_rows_ref); "bf16": bf16 of the value."""
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    _check_act(act)
    check_rows_contiguous("x", x)
    K = x.shape[1] // 2 if swiglu else x.shape[1]
    if K <= 0 or K % 32 or (swiglu and x.shape[1] % 2):
        raise ValueError(f"x.shape[-1] must be {'2K' if swiglu else 'K'} with K a positive multiple of 32, "
                         f"got {x.shape[1]}")
    if rows is not None:
        check_tensor("rows", rows, (torch.int32, torch.int64), (1,))
    dev = check_devices(x=x, rows=rows)
    R = x.shape[0] if rows is None else rows.shape[0]
    out = torch.empty(R, K, dtype=torch.bfloat16, device=dev)
    q = torch.empty(R, K, dtype=torch.int8, device=dev) if codes else out
    s = torch.empty(R, K // 32, dtype=torch.float32, device=dev) if codes else out
    bk = min(256, triton.next_power_of_2(K))
    br = TILE // bk                                                           # rows per program
    if R:
        act_rows_kernel[(triton.cdiv(R, br), triton.cdiv(K, bk))](
            x, rows if rows is not None else x, out, q, s, R, K, x.stride(0), HAS_MAP=rows is not None,
            SWIGLU=swiglu, QUANT=act == "int8", STORE_CODES=codes, BLOCK_R=br, BLOCK_K=bk,
            USE_ASM=not interpreting())
    return (out, q, s) if codes else out


def combine_slots(y, slot_rows, topk_w):
    """bf16 [T, H] = sum over the k slots of topk_w[t, j] * y[slot_rows[t, j]] (float32, slots in order;
    slot_rows < 0: no contribution). y bf16 [L, H], slot_rows int64 [T, k], topk_w float [T, k]."""
    T, A = topk_w.shape
    H = y.shape[1]
    dev = check_devices(y=y, slot_rows=slot_rows, topk_w=topk_w)
    out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    bh = min(1024, triton.next_power_of_2(H))
    bt = TILE // bh                                                           # tokens per program
    if T:
        combine_slots_kernel[(triton.cdiv(T, bt), triton.cdiv(H, bh))](
            y, slot_rows.contiguous(), topk_w.contiguous(), out, T, H, TOPK=A, BLOCK_T=bt, BLOCK_H=bh)
    return out


@contextlib.contextmanager
def fp32_accumulation(device):
    """cuBLAS bf16 GEMMs inside this block sum in float32 throughout (torch's default allows split-K
    partials reduced in bf16); the setting is restored on exit. No effect off CUDA."""
    if torch.device(device).type != "cuda":
        yield
        return
    m = torch.backends.cuda.matmul
    old = m.allow_bf16_reduced_precision_reduction
    m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_bf16_reduced_precision_reduction = old


def prefill_matmul(x, packed, scales, act: str = "int8"):
    """y bf16 [R, N] = x [R, K] @ W^T, W int4-b32 (packed [N, K/2], scales [N, K/32]), numerics in the module
    doc: the weights decoded once to bf16, the W4A8 (or W4A16) activations in bf16, a cuBLAS bf16 GEMM."""
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    check_tensor("packed", packed, (torch.uint8,), (2,))
    _check_act(act)
    K = packed.shape[1] * 2
    if x.shape[1] != K:
        raise ValueError(f"x must have K = packed.shape[1] * 2 = {K} columns, got {x.shape[1]}")
    check_devices(x=x, packed=packed)
    w = dequant_int4_bf16(packed, scales)                                      # bf16 [N, K]
    a = act_rows(x.contiguous(), act) if act == "int8" else x.to(torch.bfloat16)   # bf16 [R, K]
    with fp32_accumulation(x.device):
        return torch.mm(a, w.t())


def grouped_mm(a, w, offs, counts, grouped: bool | None = None):
    """bf16 [L, N]: rows offs[e-1]:offs[e] of a [L, K] times w[e]^T (w bf16 [E, N, K]); rows past offs[-1] are
    left unwritten. torch._grouped_mm when available (grouped None or True), else one torch.mm per expert."""
    if grouped is None:
        grouped = hasattr(torch, "_grouped_mm")
    if grouped:
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.bfloat16, device=a.device)
    start = 0
    with fp32_accumulation(a.device):
        for e, n in enumerate(counts.tolist()):                               # one host sync
            if n:
                torch.mm(a[start:start + n], w[e].t(), out=out[start:start + n])
            start += n
    return out


def prefill_moe(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales,
                act: str = "int8", act_fn=None, grouped: bool | None = None):
    """A MoE FFN over many tokens: x [R, H] -> bf16 [R, H] (module doc: the decode kernels' semantics through
    bf16 GEMMs). topk_ids int [R, k] (ids outside [0, E) contribute nothing), topk_w float [R, k];
    gate_up uint8 [E, 2I, H/2] + fp16 [E, 2I, H/32] (gate rows first), down uint8 [E, H, I/2] + fp16
    [E, H, I/32]. act_fn None: SwiGLU fused in the activation kernel; else act_fn(gate) * up in float32.
    grouped: torch._grouped_mm (None: when available) or a per-expert loop."""
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    check_tensor("topk_ids", topk_ids, (torch.int32, torch.int64), (2,))
    check_tensor("topk_w", topk_w, FLOAT_DTYPES, (2,))
    check_shape("topk_w", topk_w, topk_ids.shape)
    _check_act(act)
    E, I2, H = gate_up_packed.shape[0], gate_up_packed.shape[1], gate_up_packed.shape[2] * 2
    check_packed(gate_up_packed, gate_up_scales, I2, H, names=("gate_up_packed", "gate_up_scales"))
    check_packed(down_packed, down_scales, H, I2 // 2, names=("down_packed", "down_scales"))
    if x.shape[1] != H or topk_ids.shape[0] != x.shape[0] or down_packed.shape[0] != E:
        raise ValueError(f"x [R, H = {H}], topk_ids [R, k] and down_packed [E = {E}, H, I/2] must agree, got "
                         f"{tuple(x.shape)}, {tuple(topk_ids.shape)}, {tuple(down_packed.shape)}")
    R, k = topk_ids.shape
    dev = check_devices(x=x, topk_ids=topk_ids, topk_w=topk_w, gate_up_packed=gate_up_packed)
    if R == 0:
        return torch.empty(0, H, dtype=torch.bfloat16, device=dev)
    key = topk_ids.reshape(-1).long()
    valid = (key >= 0) & (key < E)
    key = torch.where(valid, key, E)                                          # invalid slots sort last
    order = torch.argsort(key, stable=True)                                   # [L] slot of each sorted row
    counts = torch.zeros(E + 1, dtype=torch.int32, device=dev).index_add_(
        0, key, torch.ones_like(key, dtype=torch.int32))[:E]                  # rows per expert, no host sync
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = act_rows(x.contiguous(), act, rows=order // k)                       # bf16 [L, H], sorted by expert
    h = grouped_mm(xs, dequant_int4_bf16(gate_up_packed, gate_up_scales, counts), offs, counts, grouped)
    del xs                                                                    # h: bf16 [L, 2I]
    if act_fn is None:
        a = act_rows(h, act, swiglu=True)                                     # bf16 [L, I]
    else:
        g, u = h.float().chunk(2, dim=-1)
        af = (act_fn(g) * u).contiguous()
        a = act_rows(af, act) if act == "int8" else af.to(torch.bfloat16)
    del h
    y = grouped_mm(a, dequant_int4_bf16(down_packed, down_scales, counts), offs, counts, grouped)   # [L, H]
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=dev)
    slot_rows = torch.where(valid, inv, -1).view(R, k)                       # sorted row of each (token, slot)
    return combine_slots(y, slot_rows, topk_w)
