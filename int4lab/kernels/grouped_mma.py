"""Grouped W4A8 kernel on the tensor cores: per 32-block an int8 x int8 -> int32 `tl.dot` of a tile.

Shape legend: E = experts, N = out features, K = in features, L = routed rows, BM = rows per tile.

Same contract as grouped_dp4a.py (tiles from grouped.build_group_tiles, rows gathered through `order`,
epilogue.finish_rows for split-K and the MoE combine); only the block dot differs: the tile's BM rows
(an MMA needs BM >= 16) times the expert's [BLOCK_N, 32] codes, exact in int32, then scaled per block in
float32 as acc += d * (xs[m, b] * ws[n, b]). The per-block scaling is per (row, column, block) whatever the
number of live rows, which is why the dp4a kernel is the plan at decode sizes (notes/perf.md measures both).
Its float32 sum over blocks is sequential, not grouped_dp4a's fold: the two agree to float32 rounding,
not bit for bit.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import finish_rows


@triton.jit
def grouped_mma_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, row0_ptr, rows_ptr, group_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
    # Dimensions
    L, N, E, stride_x, stride_xs, stride_we, KH, stride_se, KB,
    # Meta-parameters
    ROWS_PER_X: tl.constexpr, BLOCKS_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_W: tl.constexpr,
):
    """One program owns out[rows of tile, n0 : n0 + BLOCK_N] for K-split `split` (grid: N tiles, SPLIT_K, T).

    x int8 [*, K], xs float32 [*, K/32]; w uint8 [E, N, K/2] (even k low nibble), ws float16 [E, N, K/32];
    KH = K / 2 bytes per weight row, KB = K / 32.
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    tile = tl.program_id(2)
    n_rows = tl.load(rows_ptr + tile)
    if n_rows > 0:
        g = tl.load(group_ptr + tile).to(tl.int64)
        valid = g < E
        e = tl.where(valid, g, 0)
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < n_rows
        r = tl.load(order_ptr + tl.load(row0_ptr + tile) + offs_m, mask=m_mask, other=0)
        xr = (r // ROWS_PER_X).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        offs_c = tl.arange(0, 32)
        offs_h = tl.arange(0, 16)
        a_rows = x_ptr + xr[:, None] * stride_x
        as_rows = xs_ptr + xr * stride_xs
        w_rows = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * KH
        s_rows = ws_ptr + e * stride_se + offs_n.to(tl.int64) * KB
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for i in range(0, BLOCKS_PER_SPLIT):
            kb = split * BLOCKS_PER_SPLIT + i
            live = kb < KB
            a = tl.load(a_rows + kb * 32 + offs_c[None, :], mask=m_mask[:, None] & live, other=0)
            asc = tl.load(as_rows + kb, mask=m_mask & live, other=0.0)
            wb = tl.load(w_rows + kb * 16 + offs_h[None, :], mask=n_mask[:, None] & live, other=0)
            lo = (wb & 15).to(tl.int8, bitcast=True)
            hi = (wb >> 4).to(tl.int8, bitcast=True)
            w = tl.interleave(lo, hi) - 8                        # [BLOCK_N, 32] codes in k order
            d = tl.dot(a, tl.trans(w), out_dtype=tl.int32)       # exact block sums [BLOCK_M, BLOCK_N]
            wsc = tl.load(s_rows + kb, mask=n_mask & live, other=0.0).to(tl.float32)
            acc += d.to(tl.float32) * (asc[:, None] * wsc[None, :])
        finish_rows(acc, valid, r, m_mask, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N, pid_n,
                    tl.num_programs(0), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)
