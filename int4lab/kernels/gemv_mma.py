"""Decode GEMV on int4-b32 on the tensor cores: a teaching variant, in no plan-table row.

What it is for: it shows how per-32-block int32 dot products come out of one int8 MMA (below), and it is
the measured alternative to the dp4a kernel (gemv_dp4a.py, every table row): on the H200 it ran 3.8x
slower on 14336x4096 (notes/perf.md, v1-v3), because a batch-1 GEMV leaves 15/16 of every MMA idle and
the block-diagonal operands cost registers and shuffles. It runs only when a plan says kind="mma"
(plan.MMA_PLAN); it shares the launcher, the quantising prologue numerics and the one-launch split-K
epilogue (epilogue.finish_rows) with the dp4a kernel, so tests hold both to the same bits.

Shape legend: E = experts, N = out features, K = in features, R = activation rows (tokens x top-k).

    out[r, n] = sum_b  xs[r, b] * ws[e, n, b] * sum_{k in block b} xq[r, k] * (nib[e, n, k] - 8),  e = eids[r]

Why it is exact: each 32-term block sum has |term| <= 127 * 8, so |sum| <= 32 * 1016 = 32512 < 2**15:
an int32 holds it with room to spare and no rounding happens until the float32 scale products.

How the block sums come out of one MMA (the trick this file is built around). A weight tile of BLOCK_N
rows and BLOCK_K = 512 columns is the MMA's A operand. The activation becomes a block-diagonal B of
shape [BLOCK_K, 16]: column j holds x's 32 codes of scale block j and zeros elsewhere, so
A @ B = [BLOCK_N, 16] is exactly the 16 per-block int32 dot products, ready for their scales. The
zeros are the padding an M=16 MMA needs anyway; int8 MMA throughput is far above what the weight bytes
can feed. Two more choices keep the per-weight ALU work to one op:
  * no nibble interleave: the low nibbles (even k) and high nibbles (odd k) are two separate A tiles,
    each against the matching even/odd half of x (a dot product does not care how k is ordered, as long
    as both operands are permuted alike);
  * no "- 8" per weight: the MMA multiplies the raw nibble (0..15) and the block's 8 * sum(x) is
    subtracted once per block afterwards.
The plan's `defer_reduce` variant (v2 in notes/perf.md) moves every cross-thread reduction out of the K
loop: [BLOCK_N, 16] float32 partials are summed once at the end, and codes are decoded signed
(nib - 8 = the two's-complement nibble of nib ^ 8) so no 8 * sum(x) correction is needed.

Bytes per call: weights R_distinct_experts * N * K * (1/2 + 2/32) = 0.5625 bytes per weight; x and out
as gemv_dp4a.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import finish_rows, routed_expert
from .quant import rint, silu_mul


@triton.jit
def _quant_pairs(fe, fo, diag, USE_ASM: tl.constexpr):
    """Quantise one tile of float activations exactly like quant_x_rows_ref, in block-diagonal form.

    fe, fo float32 [HALF]: x at k = 2p and 2p + 1; diag [HALF, NB]: byte p is in block p // 16.
    Returns (be, bo int8 [HALF, NB], s float32 [NB]).
    """
    amax = tl.maximum(tl.max(tl.where(diag, tl.abs(fe)[:, None], 0.0), axis=0),
                      tl.max(tl.where(diag, tl.abs(fo)[:, None], 0.0), axis=0))
    s = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)) + 1e-12
    inv = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    ip = tl.sum(tl.where(diag, inv[None, :], 0.0), axis=1)      # each byte's block 1/s (exact: one term)
    qe = rint(fe * ip, USE_ASM)
    qo = rint(fo * ip, USE_ASM)
    qe = tl.minimum(tl.maximum(qe, -127.0), 127.0).to(tl.int8)
    qo = tl.minimum(tl.maximum(qo, -127.0), 127.0).to(tl.int8)
    be = tl.where(diag, qe[:, None], 0).to(tl.int8)
    bo = tl.where(diag, qo[:, None], 0).to(tl.int8)
    return be, bo, s


@triton.jit
def gemv_int4_b32_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, eid_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
    # Dimensions
    R, N, K, E, stride_x, stride_xs,
    # Meta-parameters
    X_MODE: tl.constexpr, ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
    TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_EIDS: tl.constexpr,
    HAS_W: tl.constexpr, DEFER_REDUCE: tl.constexpr, NB_PAD: tl.constexpr, USE_ASM: tl.constexpr,
):
    """One program owns out[r, n0 : n0 + BLOCK_N] restricted to K-split `split` (grid: N tiles, split, R).

    Activation row r is x row r // ROWS_PER_X: int8 [*, K] with float32 scales [*, K/32] (X_CODES),
    float [*, K] (X_FLOAT) or float [*, 2K] gate|up (X_SWIGLU). w uint8 [E, N, K/2] (even k in the low
    nibble), ws float16 [E, N, K/32]; eids int [R]. Output and partials as epilogue.finish_rows says.
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    r = tl.program_id(2)
    HALF: tl.constexpr = BLOCK_K // 2          # bytes of one weight row per tile
    NB: tl.constexpr = BLOCK_K // 32           # scale blocks per tile; NB_PAD = max(NB, 16) is the MMA's N

    e, valid = routed_expert(eid_ptr, r, E, HAS_EIDS)      # guard under capture: bad id -> expert 0, NaN row

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_p = tl.arange(0, HALF)
    offs_j = tl.arange(0, NB_PAD)                            # columns >= NB (block_k 256) stay zero
    diag = (offs_p[:, None] // 16) == offs_j[None, :]        # byte p belongs to scale block p // 16
    w_rows = w_ptr + e * N * (K // 2) + offs_n[:, None].to(tl.int64) * (K // 2)
    s_rows = ws_ptr + e * N * (K // 32) + offs_n[:, None].to(tl.int64) * (K // 32)
    xr = r // ROWS_PER_X
    x_row = x_ptr + xr.to(tl.int64) * stride_x
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, NB_PAD], dtype=tl.float32)     # DEFER_REDUCE: per-block partial sums

    # Split s owns K tiles [s * TILES_PER_SPLIT, (s + 1) * TILES_PER_SPLIT); tiles past K are fully masked.
    for i in range(0, TILES_PER_SPLIT):
        t = split * TILES_PER_SPLIT + i
        p = t * HALF + offs_p                                  # byte index along the packed row
        p_mask = p < K // 2
        kb = t * NB + offs_j
        kb_mask = (offs_j < NB) & (kb < K // 32)
        wb = tl.load(w_rows + p[None, :], mask=n_mask[:, None] & p_mask[None, :], other=0)
        if DEFER_REDUCE:
            # signed codes straight from the byte: nib - 8 is the 4-bit two's-complement value of nib ^ 8,
            # so one xor for both nibbles, then sign-extending shifts; no correction term afterwards
            wx = wb ^ 0x88
            lo = (wx << 4).to(tl.int8, bitcast=True) >> 4      # code of k = 2p     (-8..7)
            hi = wx.to(tl.int8, bitcast=True) >> 4             # code of k = 2p + 1 (-8..7)
        else:
            lo = (wb & 15).to(tl.int8, bitcast=True)           # nibble of k = 2p     (0..15)
            hi = (wb >> 4).to(tl.int8, bitcast=True)           # nibble of k = 2p + 1 (0..15)
        if X_MODE == 0:
            xe = tl.load(x_row + 2 * p, mask=p_mask, other=0)
            xo = tl.load(x_row + 2 * p + 1, mask=p_mask, other=0)
            be = tl.where(diag, xe[:, None], 0).to(tl.int8)    # block-diagonal activations [HALF, NB]
            bo = tl.where(diag, xo[:, None], 0).to(tl.int8)
            xs = tl.load(xs_ptr + xr * stride_xs + kb, mask=kb_mask, other=0.0)
        else:
            fe = tl.load(x_row + 2 * p, mask=p_mask, other=0.0).to(tl.float32)
            fo = tl.load(x_row + 2 * p + 1, mask=p_mask, other=0.0).to(tl.float32)
            if X_MODE == 2:                                    # SwiGLU as swiglu_quant_rows computes it
                ue = tl.load(x_row + K + 2 * p, mask=p_mask, other=0.0).to(tl.float32)
                uo = tl.load(x_row + K + 2 * p + 1, mask=p_mask, other=0.0).to(tl.float32)
                fe = silu_mul(fe, ue)
                fo = silu_mul(fo, uo)
            be, bo, xs = _quant_pairs(fe, fo, diag, USE_ASM)
        d = tl.dot(lo, be, out_dtype=tl.int32) + tl.dot(hi, bo, out_dtype=tl.int32)   # [BLOCK_N, NB]
        ws = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & kb_mask[None, :], other=0.0)
        if DEFER_REDUCE:
            # no reduction across threads inside the K loop: [BLOCK_N, NB] partials, summed once at the end
            acc2 += d.to(tl.float32) * (ws.to(tl.float32) * xs[None, :])
        else:
            xsum = tl.sum(be.to(tl.int32) + bo.to(tl.int32), axis=0)
            d = d - 8 * xsum[None, :]                          # (nib - 8) applied once per block
            acc += tl.sum(d.to(tl.float32) * (ws.to(tl.float32) * xs[None, :]), axis=1)

    if DEFER_REDUCE:
        acc = tl.sum(acc2, axis=1)
    rows = r + tl.zeros([1], tl.int32)
    finish_rows(acc[None, :], valid, rows, rows >= 0, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, R, N, pid_n,
                tl.num_programs(0), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)
