"""Grouped W4A8 kernel with dp4a: a tile of BM rows routed to one expert shares one read of its weights.

Shape legend: E = experts, N = out features, K = in features, L = routed rows (tokens x top-k),
BM = rows per tile (BLOCK_M, at most 8), A = rows combined into one output row (the MoE top-k, else 1).

    out[r, n] = sum_b xs[r, b] * ws[e, n, b] * sum_{k in block b} xq[r, k] * (nib[e, n, k] - 8)

for every row r of a tile (grouped.build_group_tiles: rows sorted by expert, cut into tiles of <= BM rows
of one expert e). The routed GEMV (gemv_dp4a.py) reads an expert's bytes once per routed row; here a
program loads a [BLOCK_N, BLOCK_K] slice of the expert once, splits it into nibble words once, and runs the
GEMV's per-row arithmetic for each of its BM rows on those registers. A decode step of T tokens reads each
routed expert about once (once per tile: an expert with more than BM rows has several tiles).

Why the rows are unrolled (one 2-D accumulator per row) rather than a [BM, BLOCK_N, ...] tensor: the first
version broadcast weights and x into 3-D tiles, and the compiler paid for it in layout conversions (its
report: 30-38 barriers and 64-131 shuffles per loop against the GEMV's 14 and 3) and ran slower than the
routed GEMV at every batch (measured at commit efa5286). Unrolled, each row's loop body is the GEMV's, instruction
for instruction, in the GEMV's layouts; only the weight load and nibble split are shared.

Why dp4a and not the tensor cores at few rows per expert (the plan table keeps this kernel below 2 mean rows
per routed expert, and below 4 on sm80 and on sm90 for experts of 32 Mi weights or more per GEMM): the W4A8
format's per-32 scales on both sides make every 32-block's exact int32 dot a separate partial that must be
scaled in float32 per (row, column, block). On the integer pipe that is 2 dp4a per 8 weights per live row plus
one float multiply-add per 32; an MMA is padded to 16 rows and its tile scales at least 4 (grouped_mma.py, the
table's choice from 4 mean rows, and on sm90 from 2 for experts of under 32 Mi weights, where its TMA loads
won: plan.GROUPED_TABLE; notes/kernels.md, "Launch-plan rows").

Numerics: the same integers, the same float32 products (ws * xs) * bsum in the same order, the same fold
over the blocks (epilogue.fold_blocks) and the same split-K / combine finish as the routed GEMV, so with the
same block_k and split_k the two give the same bits (tests/lib/test_kernels.py checks it).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import finish_rows, fold_blocks
from .gemv_dp4a import _dp4a, expert_tile, x_words_from_codes

MAX_BLOCK_M = 8          # rows unrolled per program (one accumulator each)


@triton.jit
def _row_step(acc, lo, hi, wsf, x_row, xs_row, t, KW, KB, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              USE_ASM: tl.constexpr):
    """acc [BLOCK_N, NB] += one row's block dots of tile t, scaled: the routed GEMV's loop body."""
    NB: tl.constexpr = BLOCK_K // 32
    one = tl.zeros([1], tl.int64)
    xe, xo, negc, xs = x_words_from_codes(x_row + one, xs_row + one, t, KW, KB, BLOCK_K, USE_ASM)
    d = _dp4a(lo, xe, tl.broadcast_to(negc, lo.shape), USE_ASM)
    d = _dp4a(hi, xo, d, USE_ASM)                                           # [BLOCK_N, BLOCK_W]
    bsum = tl.sum(tl.reshape(d, [BLOCK_N, NB, 4]), axis=2)                  # exact block sums
    return acc + bsum.to(tl.float32) * (wsf * xs)


@triton.jit
def _row_ptrs(order_ptr, row0, m: tl.constexpr, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs,
              ROWS_PER_X: tl.constexpr):
    """(x codes row, x scales row) pointers of the tile's row m; a row past n_rows repeats the first."""
    r = tl.load(order_ptr + row0 + m, mask=m < n_rows, other=r_first)
    xr = (r // ROWS_PER_X).to(tl.int64)
    return x_ptr + xr * stride_x, xs_ptr + xr * stride_xs


@triton.jit
def _row_finish(acc, m: tl.constexpr, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr,
                split, L, N, pid_n, offs_n, n_mask, BLOCK_N: tl.constexpr, NB: tl.constexpr,
                SPLIT_K: tl.constexpr, TOPK: tl.constexpr, HAS_W: tl.constexpr):
    """Fold row m's accumulator and hand it to finish_rows as a one-row tile (a dead row stores nothing)."""
    live = tl.full([1], m, tl.int32) < n_rows
    r = tl.load(order_ptr + row0 + m + tl.zeros([1], tl.int32), mask=live, other=r_first)
    finish_rows(fold_blocks(acc, BLOCK_N, NB)[None, :], valid, r, live, out_ptr, part_ptr, cnt_ptr, tw_ptr,
                split, L, N, pid_n, tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)


@triton.jit
def dp4a_tile(pid_n, split, row0, n_rows, e, valid,
              x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
              L, N, stride_x, stride_xs, stride_we, KW, stride_se, KB, ROWS_PER_X: tl.constexpr,
              TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_W: tl.constexpr, USE_ASM: tl.constexpr):
    """The tile body of grouped_kernel.grouped_kernel on the integer pipe: rows row0 .. row0 + n_rows - 1 of
    `order` (n_rows <= BLOCK_M <= MAX_BLOCK_M) against expert e's BLOCK_N columns at pid_n, K split `split`.

    x int8 codes [*, K] read as int32 words, xs float32 [*, K/32]; row r reads x row r // ROWS_PER_X.
    w int32 words [E, N, K/8], ws float16 [E, N, K/32]; KW = K / 8, KB = K / 32 and the expert strides arrive
    as arguments so Triton proves 16-byte alignment (gemv_dp4a.py says why). Output, partials and counters as
    epilogue.finish_rows says, indexed by the original row r.
    """
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    NB: tl.constexpr = BLOCK_K // 32
    r_first = tl.load(order_ptr + row0)
    offs_n, n_mask, w_rows, s_rows = expert_tile(w_ptr, ws_ptr, e, stride_we, stride_se, pid_n, N, KW, KB,
                                                 BLOCK_N)
    offs_w = tl.arange(0, BLOCK_W)
    offs_b = tl.arange(0, NB)
    # Row m's x and scale pointers (a row past n_rows repeats the first: in bounds, never accumulated).
    x0, s0 = _row_ptrs(order_ptr, row0, 0, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x1, s1 = _row_ptrs(order_ptr, row0, 1, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x2, s2 = _row_ptrs(order_ptr, row0, 2, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x3, s3 = _row_ptrs(order_ptr, row0, 3, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x4, s4 = _row_ptrs(order_ptr, row0, 4, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x5, s5 = _row_ptrs(order_ptr, row0, 5, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x6, s6 = _row_ptrs(order_ptr, row0, 6, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    x7, s7 = _row_ptrs(order_ptr, row0, 7, n_rows, r_first, x_ptr, xs_ptr, stride_x, stride_xs, ROWS_PER_X)
    a0 = tl.zeros([BLOCK_N, NB], dtype=tl.float32)      # one accumulator per row, folded after the loop
    a1 = tl.zeros_like(a0)
    a2 = tl.zeros_like(a0)
    a3 = tl.zeros_like(a0)
    a4 = tl.zeros_like(a0)
    a5 = tl.zeros_like(a0)
    a6 = tl.zeros_like(a0)
    a7 = tl.zeros_like(a0)
    for i in range(0, TILES_PER_SPLIT):
        t = split * TILES_PER_SPLIT + i
        w_idx = t * BLOCK_W + offs_w
        wd = tl.load(w_rows + w_idx[None, :], mask=n_mask[:, None] & (w_idx < KW)[None, :], other=0)
        kb = t * NB + offs_b
        wsf = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & (kb < KB)[None, :], other=0.0)
        wsf = wsf.to(tl.float32)
        lo = wd & 0x0F0F0F0F                     # split once, multiplied into every row of the tile
        hi = (wd >> 4) & 0x0F0F0F0F
        a0 = _row_step(a0, lo, hi, wsf, x0, s0, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
        if BLOCK_M > 1:
            if n_rows > 1:
                a1 = _row_step(a1, lo, hi, wsf, x1, s1, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
        if BLOCK_M > 2:
            if n_rows > 2:
                a2 = _row_step(a2, lo, hi, wsf, x2, s2, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
            if n_rows > 3:
                a3 = _row_step(a3, lo, hi, wsf, x3, s3, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
        if BLOCK_M > 4:
            if n_rows > 4:
                a4 = _row_step(a4, lo, hi, wsf, x4, s4, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
            if n_rows > 5:
                a5 = _row_step(a5, lo, hi, wsf, x5, s5, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
            if n_rows > 6:
                a6 = _row_step(a6, lo, hi, wsf, x6, s6, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
            if n_rows > 7:
                a7 = _row_step(a7, lo, hi, wsf, x7, s7, t, KW, KB, BLOCK_N, BLOCK_K, USE_ASM)
    _row_finish(a0, 0, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
    if BLOCK_M > 1:
        _row_finish(a1, 1, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
    if BLOCK_M > 2:
        _row_finish(a2, 2, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
        _row_finish(a3, 3, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
    if BLOCK_M > 4:
        _row_finish(a4, 4, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
        _row_finish(a5, 5, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
        _row_finish(a6, 6, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
        _row_finish(a7, 7, order_ptr, row0, n_rows, r_first, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N,
                    pid_n, offs_n, n_mask, BLOCK_N, NB, SPLIT_K, TOPK, HAS_W)
