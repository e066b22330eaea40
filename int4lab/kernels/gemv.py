"""Decode GEMV on int4-b32 weights: int8 activations, exact int32 block dots on the tensor cores.

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

Bytes per call (the floor the timing is judged against):
    weights  R_distinct_experts * N * K * (1/2 + 2/32)  =  0.5625 bytes per weight
    x, out   R * (K + K/32 * 4 + N * 2), plus split_k * R * N * 4 * 2 for the partials when split.
A 14336 x 4096 GEMV therefore moves 33.0 MB: 8.9 us at 3.7 TB/s.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import FLOAT_DTYPES, check_k, check_shape, check_tensor
from ..format import check_packed
from . import plan as _plan
from ._round import to_bf16_rne
from ._validate import check_contiguous, check_devices, check_ids, check_out, check_rows_contiguous, interpreting
from .gemv_dp4a import gemv_dp4a_kernel, routed_expert, store_row


# How the activation operand reaches the kernel (X_MODE):
X_CODES = 0     # int8 codes + float32 scales from quant_x_rows (the public gemv_int4_b32 contract)
X_FLOAT = 1     # float rows, quantised in the prologue of every tile (saves the quant launch)
X_SWIGLU = 2    # rows [gate (K) | up (K)] of a gate_up output: SwiGLU, then quantised (MoE down)


@triton.jit
def _quant_pairs(fe, fo, diag):
    """Quantise one tile of float activations exactly like quant_x_rows_ref, in block-diagonal form.

    fe, fo float32 [HALF]: x at k = 2p and 2p + 1; diag [HALF, NB]: byte p is in block p // 16.
    Returns (be, bo int8 [HALF, NB], s float32 [NB]).
    """
    amax = tl.maximum(tl.max(tl.where(diag, tl.abs(fe)[:, None], 0.0), axis=0),
                      tl.max(tl.where(diag, tl.abs(fo)[:, None], 0.0), axis=0))
    s = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)) + 1e-12
    sp = tl.sum(tl.where(diag, s[None, :], 0.0), axis=1)        # each byte's block scale (exact: one term)
    qe = tl.floor(tl.math.div_rn(fe, sp) + 0.5)
    qo = tl.floor(tl.math.div_rn(fo, sp) + 0.5)
    qe = tl.minimum(tl.maximum(qe, -127.0), 127.0).to(tl.int8)
    qo = tl.minimum(tl.maximum(qo, -127.0), 127.0).to(tl.int8)
    be = tl.where(diag, qe[:, None], 0).to(tl.int8)
    bo = tl.where(diag, qo[:, None], 0).to(tl.int8)
    return be, bo, s


@triton.jit
def gemv_int4_b32_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, eid_ptr, out_ptr, part_ptr,
    # Dimensions
    R, N, K, E, stride_x, stride_xs,
    # Meta-parameters
    X_MODE: tl.constexpr, ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_EIDS: tl.constexpr, WRITE_PARTIAL: tl.constexpr,
    DEFER_REDUCE: tl.constexpr, NB_PAD: tl.constexpr,
):
    """One program owns out[r, n0 : n0 + BLOCK_N] restricted to K-split `split` (grid: N tiles, split, R).

    Activation row r is x row r // ROWS_PER_X: int8 [*, K] with float32 scales [*, K/32] (X_CODES),
    float [*, K] (X_FLOAT) or float [*, 2K] gate|up (X_SWIGLU). w uint8 [E, N, K/2] (even k in the low
    nibble), ws float16 [E, N, K/32]; eids int [R]. Writes bf16 out [R, N], or float32 partials
    [split_k, R, N] when WRITE_PARTIAL.
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
            if X_MODE == 2:                                    # SwiGLU as swiglu_quant_kernel computes it
                ue = tl.load(x_row + K + 2 * p, mask=p_mask, other=0.0).to(tl.float32)
                uo = tl.load(x_row + K + 2 * p + 1, mask=p_mask, other=0.0).to(tl.float32)
                fe = fe / (1.0 + tl.exp(-fe)) * ue
                fo = fo / (1.0 + tl.exp(-fo)) * uo
            be, bo, xs = _quant_pairs(fe, fo, diag)
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
    store_row(out_ptr, part_ptr, acc, valid, split, r, R, N, offs_n, n_mask, WRITE_PARTIAL)


@triton.jit
def reduce_rows_kernel(
    # Pointers
    part_ptr, w_ptr, out_ptr,
    # Dimensions
    L, N,
    # Meta-parameters
    SK: tl.constexpr, TOPK: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[t, n] (bf16) = sum_j w[t, j] * sum_s part[s, t*TOPK + j, n], j and s in increasing order.

    part float32 [SK, L, N]; w float [T, TOPK] (or all ones when HAS_W is False); one program owns BLOCK
    columns of one output row. With TOPK = 1 and no weights this is reduce_partials; with weights it is
    the split-K reduce of the MoE down projection fused with the router-weighted combine.
    """
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, TOPK):
        row = t * TOPK + j
        y = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(0, SK):
            y += tl.load(part_ptr + (s * L + row).to(tl.int64) * N + offs, mask=mask, other=0.0)
        if HAS_W:
            acc += tl.load(w_ptr + row).to(tl.float32) * y
        else:
            acc += y
    tl.store(out_ptr + t.to(tl.int64) * N + offs, to_bf16_rne(acc), mask=mask)


@triton.jit
def gemv_w4a16_kernel(
    # Pointers
    x_ptr, w_ptr, ws_ptr, out_ptr,
    # Dimensions
    N, K, stride_xr,
    # Meta-parameters
    K_TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W4A16: out [R, N] bf16 = x [R, K] (float) @ dequant(w [N, K/2], ws [N, K/32])^T, float32 FMAs.

    One program owns out[r, n0 : n0 + BLOCK_N]; weights are decoded in registers, never written out.
    """
    pid_n = tl.program_id(0)
    r = tl.program_id(1)
    HALF: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_p = tl.arange(0, HALF)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * (K // 2)
    s_rows = ws_ptr + offs_n[:, None].to(tl.int64) * (K // 32)
    x_row = x_ptr + r * stride_xr
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for t in range(0, K_TILES):
        p = t * HALF + offs_p
        p_mask = p < K // 2
        m2 = n_mask[:, None] & p_mask[None, :]
        wb = tl.load(w_rows + p[None, :], mask=m2, other=0)
        s = tl.load(s_rows + (p // 16)[None, :], mask=m2, other=0.0).to(tl.float32)
        lo = ((wb & 15).to(tl.int32) - 8).to(tl.float32) * s
        hi = ((wb >> 4).to(tl.int32) - 8).to(tl.float32) * s
        xe = tl.load(x_row + 2 * p, mask=p_mask, other=0.0).to(tl.float32)
        xo = tl.load(x_row + 2 * p + 1, mask=p_mask, other=0.0).to(tl.float32)
        acc += tl.sum(lo * xe[None, :] + hi * xo[None, :], axis=1)
    tl.store(out_ptr + r.to(tl.int64) * N + offs_n, to_bf16_rne(acc), mask=n_mask)


def _check_x_codes(xq, xs, K):
    check_tensor("xq", xq, (torch.int8,), (2,))
    check_tensor("xs", xs, (torch.float32,), (2,))
    check_rows_contiguous("xq", xq)
    check_rows_contiguous("xs", xs)
    if xq.shape[1] != K:
        raise ValueError(f"xq must have shape (R, K) with K = {K}, got {tuple(xq.shape)}")
    check_shape("xs", xs, (xq.shape[0], K // 32))


_PLAN_FIELDS = ("block_n", "block_k", "num_warps", "num_stages", "waves", "defer_reduce", "fuse_quant", "kind")


def _launch_gemv(x, xs, packed, scales, eids, N, K, R, *, out=None, part=None, split_k=None, plan=None,
                 x_mode=X_CODES, rows_per_x=1, topk_w=None):
    """Launch without re-validating inputs (public callers validate). Returns bf16 out.

    out is [R, N]; or, when topk_w [T, A] is given (split_k > 1 only), [T, N] = the router-weighted
    combine of each token's A rows, fused into the split-K reduce.
    """
    dev = x.device
    if split_k is None and part is not None:
        check_tensor("part", part, (torch.float32,), (3,))
        split_k = part.shape[0]
    fields = {} if plan is None else {f: getattr(plan, f) for f in _PLAN_FIELDS}
    if plan is not None and split_k is None:
        split_k = plan.split_k
    p = _plan.gemv_plan(N, K, R, dev, split_k=split_k, **fields)
    sk = p.split_k
    A = 1 if topk_w is None else topk_w.shape[1]
    if topk_w is not None and sk == 1:
        raise ValueError("the fused combine needs split_k > 1; use combine_rows after a split_k = 1 GEMV")
    out = check_out("out", out, (R // A, N), torch.bfloat16, dev)
    if sk > 1:
        part = check_out("part", part, (sk, R, N), torch.float32, dev)
    if R == 0:
        return out
    grid = (triton.cdiv(N, p.block_n), sk, R)
    if p.kind == "dp4a":
        if x_mode != X_CODES:
            raise ValueError("a dp4a plan reads int8 codes: use it with fuse_quant=False")
        gemv_dp4a_kernel[grid](
            x.view(torch.int32), xs, packed.view(torch.int32), scales, eids if eids is not None else x, out,
            part if sk > 1 else out,
            R, N, K, packed.shape[0], x.stride(0) // 4, xs.stride(0),
            ROWS_PER_X=rows_per_x, TILES_PER_SPLIT=triton.cdiv(triton.cdiv(K, p.block_k), sk),
            BLOCK_N=p.block_n, BLOCK_K=p.block_k, HAS_EIDS=eids is not None, WRITE_PARTIAL=sk > 1,
            USE_ASM=not interpreting(), num_warps=p.num_warps, num_stages=p.num_stages)
    else:
        gemv_int4_b32_kernel[grid](
            x, xs if xs is not None else x, packed, scales, eids if eids is not None else x, out,
            part if sk > 1 else out,
            R, N, K, packed.shape[0], x.stride(0), xs.stride(0) if xs is not None else 0,
            X_MODE=x_mode, ROWS_PER_X=rows_per_x, TILES_PER_SPLIT=triton.cdiv(triton.cdiv(K, p.block_k), sk),
            BLOCK_N=p.block_n, BLOCK_K=p.block_k, HAS_EIDS=eids is not None, WRITE_PARTIAL=sk > 1,
            DEFER_REDUCE=p.defer_reduce, NB_PAD=max(16, p.block_k // 32), num_warps=p.num_warps,
            num_stages=p.num_stages)
    if sk > 1:
        blk = _plan.row_block(dev)
        reduce_rows_kernel[(R // A, triton.cdiv(N, blk))](
            part, topk_w if topk_w is not None else part, out, R, N,
            SK=sk, TOPK=A, HAS_W=topk_w is not None, BLOCK=blk)
    return out


def gemv_int4_b32(xq, xs, packed, scales, eids, N, K, part=None, out=None, *, split_k=None, plan=None):
    """Routed W4A8 GEMV: row i of xq/xs times expert eids[i] -> bf16 [R, N].

    xq int8 [R, K], xs float32 [R, K/32] (from quant_x_rows; rows may be strided, e.g. a stride-0
    expand of one token); packed uint8 [E, N, K/2], scales float16 [E, N, K/32], contiguous; eids
    int32/int64 [R] with values in [0, E) (see _validate for what is checked under capture).
    Exact int32 dot per 32-block, float32 accumulation across blocks, one bf16 rounding at the end.
    Split-K (`split_k`, else part.shape[0], else the plan) writes float32 partials to `part`
    [split_k, R, N] and reduces them in a second launch; preallocate `part` and `out` for graph capture.
    """
    check_packed(packed, scales, N, K)
    if packed.dim() != 3:
        raise ValueError(f"packed must have rank 3 ([E, N, K/2]), got shape {tuple(packed.shape)}")
    _check_x_codes(xq, xs, K)
    check_tensor("eids", eids, (torch.int32, torch.int64), (1,))
    check_shape("eids", eids, (xq.shape[0],))
    check_contiguous(packed=packed, scales=scales, eids=eids)
    check_devices(xq=xq, xs=xs, packed=packed, scales=scales, eids=eids, part=part, out=out)
    check_ids("eids", eids, packed.shape[0])
    return _launch_gemv(xq, xs, packed, scales, eids, N, K, xq.shape[0], out=out, part=part, split_k=split_k,
                        plan=plan)


def reduce_partials(part, sk, R, N, out=None):
    """part float32 [sk, R, N] -> bf16 [R, N]: slots summed in the order 0..sk-1 in one launch, so the
    same partials always give the same bits."""
    check_tensor("part", part, (torch.float32,), (3,))
    for name, v in (("sk", sk), ("R", R), ("N", N)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name != "R" else 0):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    check_shape("part", part, (sk, R, N))
    check_contiguous(part=part)
    dev = check_devices(part=part, out=out)
    out = check_out("out", out, (R, N), torch.bfloat16, dev)
    if R:
        blk = _plan.row_block(dev)
        reduce_rows_kernel[(R, triton.cdiv(N, blk))](part, part, out, R, N,
                                                     SK=sk, TOPK=1, HAS_W=False, BLOCK=blk)
    return out


def int4_linear(x, packed, scales, act="int8", out=None, *, plan=None):
    """Dense int4-b32 linear layer (E = 1): x [..., K] bf16/fp16/fp32 -> bf16 [..., N].

    act="int8": W4A8 (gemv_int4_b32's numerics); x is quantised per 32-block to the codes of
    quant_x_rows, inside the GEMV's prologue when the plan says fuse_quant (one launch when unsplit).
    act="bf16": W4A16, weights decoded to float32 in registers, float32 accumulation, x unquantised.
    packed uint8 [N, K/2] or [1, N, K/2], scales float16 [N, K/32] or [1, N, K/32]. `plan` (a GemvPlan)
    overrides the launch plan of the W4A8 path.
    """
    if act not in ("int8", "bf16"):
        raise ValueError(f"act must be 'int8' or 'bf16', got {act!r}")
    check_tensor("x", x, FLOAT_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"x must have rank >= 1, got shape {tuple(x.shape)}")
    check_tensor("packed", packed, (torch.uint8,), (2, 3))
    if packed.dim() == 3 and packed.shape[0] != 1:
        raise ValueError(f"packed must be [N, K/2] or [1, N, K/2] for a dense layer, got {tuple(packed.shape)}")
    K = x.shape[-1]
    check_k("x.shape[-1] (K)", K)
    N = packed.shape[-2]
    check_packed(packed, scales, N, K)
    packed = packed.reshape(1, N, K // 2)
    scales = scales.reshape(1, N, K // 32)
    check_contiguous(packed=packed, scales=scales)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    check_rows_contiguous("x", x2)
    dev = check_devices(x=x, packed=packed, scales=scales, out=out)
    R = x2.shape[0]
    out2 = check_out("out", out, (*lead, N), torch.bfloat16, dev).reshape(R, N)
    fuse = (plan or _plan.table_plan(dev)).fuse_quant
    # Rows ride on a grid axis limited to 65535 programs: long prefill-style inputs go in chunks.
    for r0 in range(0, R, MAX_GRID_ROWS):
        xc, oc = x2[r0:r0 + MAX_GRID_ROWS], out2[r0:r0 + MAX_GRID_ROWS]
        rc = xc.shape[0]
        if act == "int8" and fuse:                   # quantised in the GEMV's prologue
            _launch_gemv(xc, None, packed, scales, None, N, K, rc, out=oc, x_mode=X_FLOAT, plan=plan)
        elif act == "int8":
            from .quant import quant_x_rows
            xq, xs = quant_x_rows(xc)
            _launch_gemv(xq, xs, packed, scales, None, N, K, rc, out=oc, plan=plan)
        else:
            gemv_w4a16_kernel[(triton.cdiv(N, W4A16_BLOCK_N), rc)](
                xc, packed, scales, oc, N, K, xc.stride(0),
                K_TILES=triton.cdiv(K, W4A16_BLOCK_K), BLOCK_N=W4A16_BLOCK_N, BLOCK_K=W4A16_BLOCK_K)
    return out2.reshape(*lead, N)


# W4A16 is the numerics path for quantised modules, not a speed target: one modest tile everywhere.
W4A16_BLOCK_N, W4A16_BLOCK_K = 32, 128
MAX_GRID_ROWS = 65535           # CUDA's limit on the grid's y and z dimensions, where rows go


def gemv_ref(xq, xs, packed, scales, eids, N, K) -> torch.Tensor:
    """float32 [R, N] reference of gemv_int4_b32 (CPU, float64 accumulation of the same values)."""
    from ..format import dequant_int4_ref
    w = dequant_int4_ref(packed.cpu(), scales.cpu(), N, K).double()           # [E, N, K]
    x = (xq.cpu().double().reshape(-1, K // 32, 32) * xs.cpu().double()[..., None]).reshape(-1, K)
    e = eids.cpu().long()
    return torch.einsum("rk,rnk->rn", x, w[e]).float()
