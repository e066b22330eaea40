"""Grouped W4A8 kernel with dp4a: a tile of BM rows routed to one expert shares one read of its weights.

Shape legend: E = experts, N = out features, K = in features, L = routed rows (tokens x top-k),
BM = rows per tile (BLOCK_M), A = rows combined into one output row (the MoE top-k, else 1).

    out[r, n] = sum_b xs[r, b] * ws[e, n, b] * sum_{k in block b} xq[r, k] * (nib[e, n, k] - 8)

for every row r of a tile (grouped.build_group_tiles: rows sorted by expert, cut into tiles of <= BM rows
of one expert e). The routed GEMV (gemv_dp4a.py) reads an expert's bytes once per routed row; here a
program loads a [BLOCK_N, BLOCK_K] slice of the expert once and multiplies it into all BM rows, so a decode
step of T tokens reads each routed expert about once (once per tile: an expert with more than BM rows
has several tiles).

Why dp4a and not the tensor cores at decode sizes (notes/perf.md has the measurements): a tile holds 1-16
rows, and the W4A8 format's per-32 scales on both sides make every 32-block's exact int32 dot a separate
partial that must be scaled in float32 per (row, column, block). On the integer pipe that is 2 dp4a per 8
weights per row plus one float multiply-add per 32; an MMA does the dots for free but pays the same per-block
scaling on a 16-row tile whatever the live rows, plus the nibble-to-operand shuffles (grouped_mma.py keeps
that variant for comparison).

Numerics: the same integers, the same float32 products (xs * ws) * bsum, the same fold over the blocks of a
tile (epilogue.fold_blocks) and the same split-K / combine order as the routed GEMV, so with the same
block_k and split_k the two give the same bits (tests/test_kernels.py checks it).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import finish_rows, fold_blocks
from .gemv_dp4a import _dp4a, x_words_from_codes


@triton.jit
def grouped_dp4a_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, row0_ptr, rows_ptr, group_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
    # Dimensions
    L, N, E, stride_x, stride_xs, stride_we, KW, stride_se, KB,
    # Meta-parameters
    ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_W: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """One program owns out[rows of tile, n0 : n0 + BLOCK_N] for K-split `split` (grid: N tiles, SPLIT_K, T).

    x int8 codes [*, K] read as int32 words, xs float32 [*, K/32]; row r reads x row r // ROWS_PER_X.
    w int32 words [E, N, K/8], ws float16 [E, N, K/32]. order int32 [L] (sorted position -> row), row0 /
    rows / group int32 [T] (grouped.GroupTiles). KW = K / 8, KB = K / 32 and the expert strides arrive as
    arguments so Triton proves 16-byte alignment (gemv_dp4a.py says why). Output, partials and counters as
    epilogue.finish_rows says, indexed by the original row r.
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    tile = tl.program_id(2)
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    NB: tl.constexpr = BLOCK_K // 32
    n_rows = tl.load(rows_ptr + tile)
    if n_rows > 0:                                   # dead tiles (the static budget's spare) read nothing
        g = tl.load(group_ptr + tile).to(tl.int64)
        valid = g < E                                # group E: the invalid-id bucket -> NaN rows
        e = tl.where(valid, g, 0)
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < n_rows
        r = tl.load(order_ptr + tl.load(row0_ptr + tile) + offs_m, mask=m_mask, other=0)
        xr = (r // ROWS_PER_X).to(tl.int64)
        x_rows = x_ptr + xr * stride_x
        xs_rows = xs_ptr + xr * stride_xs

        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        offs_w = tl.arange(0, BLOCK_W)
        offs_b = tl.arange(0, NB)
        w_rows = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * KW
        s_rows = ws_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * KB
        acc = tl.zeros([BLOCK_M, BLOCK_N, NB], dtype=tl.float32)
        shape: tl.constexpr = [BLOCK_M, BLOCK_N, BLOCK_W]
        for i in range(0, TILES_PER_SPLIT):
            t = split * TILES_PER_SPLIT + i
            w_idx = t * BLOCK_W + offs_w
            wd = tl.load(w_rows + w_idx[None, :], mask=n_mask[:, None] & (w_idx < KW)[None, :], other=0)
            kb = t * NB + offs_b
            ws = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & (kb < KB)[None, :], other=0.0)
            xe, xo, negc, xs = x_words_from_codes(x_rows, xs_rows, t, KW, KB, BLOCK_K, USE_ASM)
            lo = tl.broadcast_to((wd & 0x0F0F0F0F)[None, :, :], shape)
            hi = tl.broadcast_to(((wd >> 4) & 0x0F0F0F0F)[None, :, :], shape)
            d = _dp4a(lo, tl.broadcast_to(xe[:, None, :], shape), tl.broadcast_to(negc[:, None, :], shape), USE_ASM)
            d = _dp4a(hi, tl.broadcast_to(xo[:, None, :], shape), d, USE_ASM)      # [BM, BLOCK_N, BLOCK_W]
            bsum = tl.sum(tl.reshape(d, [BLOCK_M, BLOCK_N, NB, 4]), axis=3)           # exact block sums
            acc += bsum.to(tl.float32) * (ws.to(tl.float32)[None, :, :] * xs[:, None, :])
        y = tl.reshape(fold_blocks(tl.reshape(acc, [BLOCK_M * BLOCK_N, NB]), BLOCK_M * BLOCK_N, NB),
                       [BLOCK_M, BLOCK_N])
        finish_rows(y, valid, r, m_mask, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N, pid_n,
                    tl.num_programs(0), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)
