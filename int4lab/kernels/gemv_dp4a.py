"""Decode GEMV on int4-b32 with dp4a: four int8 multiply-adds per integer instruction, no tensor cores.

Shape legend: E = experts, N = out features, K = in features, R = activation rows (tokens x top-k).

Same contract and numerics as `gemv.gemv_int4_b32_kernel` (exact int32 block sums, float32 across
blocks, one bf16 rounding), chosen by `GemvPlan.kind == "dp4a"`. Why a second kernel: the MMA version
spends its registers and cross-thread shuffles on building block-diagonal operands (notes/perf.md);
llama.cpp's Q4_0 kernels, on the same 32-block grid, reach ~2.5 TB/s with dp4a on the integer pipe.

The arithmetic per 32-bit weight word (8 nibbles, k = 8w .. 8w+7, even k in the low nibbles):
    lo = word & 0x0F0F0F0F          nibbles of k = 8w, 8w+2, 8w+4, 8w+6   (unsigned bytes 0..15)
    hi = (word >> 4) & 0x0F0F0F0F   nibbles of k = 8w+1, 8w+3, 8w+5, 8w+7
    d  = dp4a(lo, x_even_word, dp4a(hi, x_odd_word, 0))       = sum_k nib_k * x_k over the 8 k
so 5 integer instructions per 8 weights. The "- 8" of each code is applied once per 32-block as
8 * sum(x_block), since sum_k (nib_k - 8) x_k = sum_k nib_k x_k - 8 sum_k x_k. x_even/x_odd words are
built per tile from the int8 codes with two byte permutes (`prmt`) per word pair: a dot product
only needs both operands permuted alike. The correction -8 * sum(x) of each word is itself a dp4a
(0x08080808 against the x words) and seeds the accumulator, so it costs nothing per weight row.

On the CPU interpreter (no PTX) `_dp4a` is emulated with shifts; the GPU runs the `dp4a.u32.s32`
instruction through `tl.inline_asm_elementwise`. Both compute the same exact integers.

Bytes per call: weights 0.5625 B/weight (as gemv.py), x codes R*K, scales R*K/32*4, out R*N*2.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._round import to_bf16_rne


@triton.jit
def _dp4a(a, b, c, USE_ASM: tl.constexpr):
    """c + sum_j ubyte_j(a) * sbyte_j(b), elementwise on int32 tensors (a's bytes are 0..15 here)."""
    if USE_ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        acc = c
        for j in tl.static_range(4):
            ua = (a >> (8 * j)) & 0xFF
            sb = (b << (24 - 8 * j)) >> 24                        # arithmetic shift: sign-extended byte j
            acc += ua * sb
        return acc


@triton.jit
def _prmt(a, b, SEL: tl.constexpr, USE_ASM: tl.constexpr):
    """Byte permute of the 8 bytes {b, a} (a = bytes 0-3): result byte j = source byte (SEL >> 4j) & 7."""
    if USE_ASM:
        return tl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [a, b],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        out = tl.zeros_like(a)
        for j in tl.static_range(4):
            src = (SEL >> (4 * j)) & 7
            byte = ((a >> (8 * src)) & 0xFF) if src < 4 else ((b >> (8 * (src - 4))) & 0xFF)
            out |= byte << (8 * j)
        return out


@triton.jit
def routed_expert(eid_ptr, r, E, HAS_EIDS: tl.constexpr):
    """(expert index as int64, valid) for row r. An id outside [0, E) cannot be refused under graph capture:
    it reads expert 0 and the caller writes NaN for the row."""
    if HAS_EIDS:
        e = tl.load(eid_ptr + r).to(tl.int64)
    else:
        e = tl.zeros((), tl.int64)
    valid = (e >= 0) & (e < E)
    return tl.where(valid, e, 0), valid


@triton.jit
def store_row(out_ptr, part_ptr, y, valid, split, r, R, N, offs_n, n_mask, WRITE_PARTIAL: tl.constexpr):
    """Write one program's float32 outputs: NaN for an invalid expert id; float32 partials [split_k, R, N]
    when split, else bf16 out [R, N] rounded to nearest even."""
    y = tl.where(valid, y, float("nan"))
    if WRITE_PARTIAL:
        tl.store(part_ptr + (split * R + r).to(tl.int64) * N + offs_n, y, mask=n_mask)
    else:
        tl.store(out_ptr + r.to(tl.int64) * N + offs_n, to_bf16_rne(y), mask=n_mask)


@triton.jit
def gemv_dp4a_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, eid_ptr, out_ptr, part_ptr,
    # Dimensions
    R, N, K, E, stride_x, stride_xs,
    # Meta-parameters
    ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_EIDS: tl.constexpr, WRITE_PARTIAL: tl.constexpr, USE_ASM: tl.constexpr,
):
    """One program owns out[r, n0 : n0 + BLOCK_N] for K-split `split` (grid: N tiles, split, R).

    x int8 [*, K] codes read as int32 words, float32 scales [*, K/32] (row r uses x row r // ROWS_PER_X); w int32 words
    [E, N, K/8] (the uint8 [E, N, K/2] pack viewed as little-endian words); ws float16 [E, N, K/32];
    eids int [R]. Writes bf16 out [R, N], or float32 partials [split_k, R, N] when WRITE_PARTIAL.
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    r = tl.program_id(2)
    BLOCK_W: tl.constexpr = BLOCK_K // 8          # weight words per row per tile
    NB: tl.constexpr = BLOCK_K // 32              # scale blocks per tile
    e, valid = routed_expert(eid_ptr, r, E, HAS_EIDS)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_w = tl.arange(0, BLOCK_W)
    offs_b = tl.arange(0, NB)
    w_rows = w_ptr + e * N * (K // 8) + offs_n[:, None].to(tl.int64) * (K // 8)
    s_rows = ws_ptr + e * N * (K // 32) + offs_n[:, None].to(tl.int64) * (K // 32)
    xr = (r // ROWS_PER_X).to(tl.int64)
    acc = tl.zeros([BLOCK_N, NB], dtype=tl.float32)   # reduced across blocks once, after the loop

    for i in range(0, TILES_PER_SPLIT):
        t = split * TILES_PER_SPLIT + i
        w_idx = t * BLOCK_W + offs_w
        w_mask = w_idx < K // 8
        kb = t * NB + offs_b
        kb_mask = kb < K // 32
        wd = tl.load(w_rows + w_idx[None, :], mask=n_mask[:, None] & w_mask[None, :], other=0)
        ws = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & kb_mask[None, :], other=0.0)
        # x codes of the tile as int32 words, pairs (x[8w..8w+3], x[8w+4..8w+7])
        xw = tl.load(x_ptr + xr * stride_x + 2 * w_idx[:, None] + tl.arange(0, 2)[None, :],
                     mask=w_mask[:, None], other=0)                    # [BLOCK_W, 2] int32 words
        x0, x1 = tl.split(xw)                                           # [BLOCK_W] each
        xe = _prmt(x0, x1, 0x6420, USE_ASM)[None, :]                    # x[8w + 0, 2, 4, 6]
        xo = _prmt(x0, x1, 0x7531, USE_ASM)[None, :]                    # x[8w + 1, 3, 5, 7]
        eights = tl.full(xe.shape, 0x08080808, tl.int32)
        negc = -_dp4a(eights, xe, _dp4a(eights, xo, tl.zeros_like(xe), USE_ASM), USE_ASM)   # -8 sum x
        xs = tl.load(xs_ptr + xr * stride_xs + kb[None, :], mask=kb_mask[None, :], other=0.0)
        lo = wd & 0x0F0F0F0F
        hi = (wd >> 4) & 0x0F0F0F0F
        d = _dp4a(lo, xe, tl.broadcast_to(negc, wd.shape), USE_ASM)
        d = _dp4a(hi, xo, d, USE_ASM)                                    # [BLOCK_N, BLOCK_W]
        bsum = tl.sum(tl.reshape(d, [BLOCK_N, NB, 4]), axis=2)                # exact block sums
        acc += bsum.to(tl.float32) * (ws.to(tl.float32) * xs)

    store_row(out_ptr, part_ptr, tl.sum(acc, axis=1), valid, split, r, R, N, offs_n, n_mask, WRITE_PARTIAL)
