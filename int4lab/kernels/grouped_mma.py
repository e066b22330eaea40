"""Grouped W4A8 kernel on the tensor cores: per 32-block an int8 x int8 -> int32 `tl.dot` of a tile.

Shape legend: E = experts, N = out features, K = in features, L = routed rows, BM = rows per tile,
NB = 32-blocks per loop step (BLOCK_K / 32).

Same contract as grouped_dp4a.py (tiles from grouped.build_group_tiles, rows gathered through `order`,
epilogue.finish_rows for split-K and the MoE combine); only the block dot differs. Each loop step loads
NB blocks of the tile's BM rows (BM >= 4) and of the expert's [BLOCK_N, 32 * NB] codes and multiplies
them as one batched dot with the weights on the MMA's M side, [NB, BLOCK_N, 32] x [NB, 32, BM] ->
[NB, BLOCK_N, BM], exact in int32 per block. Why batched: the W4A8 format scales every 32-block on both
sides, so the block sums cannot share one int32 accumulator; a batch of NB blocks per step puts NB times
more bytes in flight than one block per step (the first version, latency-bound: notes/perf.md). Why the
weights on the M side (mma.sync m16n8k32): the tile's few rows then fill the N side (8 wide) instead of
a padded M of 16, and the compiler stops copying the activation fragment before every MMA (the MMA's
output took its registers). Two cuts to the weights' decode (v24): each code sits in its byte's high nibble,
16 * (n - 8), one LOP3 per 4 codes (the 16 comes off after the loop, exactly); and both operands take the
weights' own k order in each 32-bit word (low nibbles, then high), so no byte interleave, while x, the
smaller operand, is permuted instead. Where every split is a whole number of steps (EVEN_K, every table
shape) the loop's loads carry no masks: dead rows read x row 0 and columns past N read column N - 1, neither
stored. Compiler report per loop step (sm_90): bm16 bn64 bk128 271 -> 216 SASS instructions, bm8 204 -> 146,
bm32 368 -> 319 (notes/perf.md v18, v24).

Numerics: each block sum is scaled as d * (ws * xs) and accumulated per block column across the K steps,
and the NB columns are folded once at the end by epilogue.fold_blocks: the grouped dp4a kernel's order,
so with the same block_k and split_k the two kernels (and the routed GEMV) give the same bits (for every
x the quantisers write; hand-made scales whose products ws * xs fall under about 1e-37, or outputs over
about 1e37, could differ, where 16 x a value leaves float32's normal range).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import finish_rows, fold_blocks, grid_ids


@triton.jit
def _codes16(wb, SHIFT: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 packed bytes -> int8 16 * (nibble - 8) of the low (SHIFT 0) or high (SHIFT 4) nibbles: the code in
    a byte's high nibble, (n ^ 8) << 4, which as a signed byte is 16 * (n - 8). On the GPU one 32-bit
    and-xor (a single LOP3) per four high codes and a shift more for the low ones; no add, no carry."""
    if USE_ASM:     # lop3 0x6a: (a & b) ^ c
        if SHIFT == 4:
            return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0xF0F0F0F0, 0x80808080, 0x6a;", "=r,r", [wb],
                                             dtype=tl.int8, is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t; shl.b32 t, $1, 4; lop3.b32 $0, t, 0xF0F0F0F0, 0x80808080, 0x6a; }", "=r,r", [wb],
                dtype=tl.int8, is_pure=True, pack=4)
    else:
        return ((((wb >> SHIFT) & 15) ^ 8) << 4).to(tl.int8, bitcast=True)


@triton.jit
def _word_order(lo, hi, NB: tl.constexpr, ROWS: tl.constexpr):
    """[NB, ROWS, 16] low- and high-nibble codes -> [NB, ROWS, 32], each packed 32-bit word's four low codes then
    its four high codes: k order 0, 2, 4, 6, 1, 3, 5, 7 in every group of 8 (no byte interleave)."""
    return tl.reshape(tl.permute(tl.join(tl.reshape(lo, [NB, ROWS, 4, 4]), tl.reshape(hi, [NB, ROWS, 4, 4])),
                                 (0, 1, 2, 4, 3)), [NB, ROWS, 32])


@triton.jit
def _x_word_order(a, NB: tl.constexpr, ROWS: tl.constexpr):
    """[NB, ROWS, 32] codes in k order -> the same codes in _word_order's k order."""
    return tl.reshape(tl.permute(tl.reshape(a, [NB, ROWS, 4, 4, 2]), (0, 1, 2, 4, 3)), [NB, ROWS, 32])


@triton.jit
def _tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split, row0, n_rows,
          e, valid, L, N, stride_x, stride_xs, stride_we, KH, stride_se, KB,
          ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_W: tl.constexpr,
          USE_ASM: tl.constexpr, EVEN_K: tl.constexpr):
    """The tile's rows row0 .. row0 + n_rows - 1 of `order` (n_rows <= BLOCK_M) against expert e's BLOCK_N
    columns at pid_n, K split `split`: the loop, the fold and epilogue.finish_rows."""
    NB: tl.constexpr = BLOCK_K // 32
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < n_rows
    r = tl.load(order_ptr + row0 + offs_m, mask=m_mask, other=0)
    xr = (r // ROWS_PER_X).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_b = tl.arange(0, NB)
    offs_c = tl.arange(0, 32)
    offs_h = tl.arange(0, 16)
    a_rows = x_ptr + xr[None, :, None] * stride_x + offs_c[None, None, :]                    # [1, BM, 32]
    as_rows = xs_ptr + xr[None, :] * stride_xs                                                # [1, BM]
    n_ld = tl.minimum(offs_n, N - 1).to(tl.int64)      # columns past N read column N - 1 (never stored)
    w_rows = w_ptr + e * stride_we + n_ld[None, :, None] * KH + offs_h[None, None, :]
    s_rows = ws_ptr + e * stride_se + n_ld[None, :] * KB                                      # [1, BN]
    acc = tl.zeros([NB, BLOCK_N, BLOCK_M], dtype=tl.float32)   # per block column, folded after the loop
    for i in range(0, TILES_PER_SPLIT):
        kb = (split * TILES_PER_SPLIT + i) * NB + offs_b                                      # [NB]
        if EVEN_K:      # every block of every step exists; dead rows read x row 0 (r = 0), never stored
            a = tl.load(a_rows + kb[:, None, None] * 32)
            asc = tl.load(as_rows + kb[:, None])
            wb = tl.load(w_rows + kb[:, None, None] * 16)
            wsc = tl.load(s_rows + kb[:, None]).to(tl.float32)
        else:
            live = kb < KB
            a = tl.load(a_rows + kb[:, None, None] * 32, mask=live[:, None, None], other=0)
            asc = tl.load(as_rows + kb[:, None], mask=live[:, None], other=0.0)
            wb = tl.load(w_rows + kb[:, None, None] * 16, mask=live[:, None, None], other=0)
            wsc = tl.load(s_rows + kb[:, None], mask=live[:, None], other=0.0).to(tl.float32)
        lo = _codes16(wb, 0, USE_ASM)                                   # [NB, BN, 16] 16 x codes of even k
        hi = _codes16(wb, 4, USE_ASM)                                   # [NB, BN, 16] 16 x codes of odd k
        # Both operands in one k order per 8 codes, the weights' own (a dot product does not care which):
        # the weights' bytes need no interleave, and x, BLOCK_N / BLOCK_M times fewer bytes, is permuted.
        w = _word_order(lo, hi, NB, BLOCK_N)                            # [NB, BN, 32]
        a = _x_word_order(a, NB, BLOCK_M)                               # [NB, BM, 32]
        d = tl.dot(w, tl.permute(a, (0, 2, 1)), out_dtype=tl.int32)     # 16 x the block sums, exact [NB, BN, BM]
        acc += d.to(tl.float32) * (wsc[:, :, None] * asc[:, None, :])
    # acc holds exactly 16 x the sums (a power of two commutes with every rounding; no value nears the
    # subnormal range: each term is an integer times ws * xs > 1e-20), so one multiply restores them.
    y = 0.0625 * fold_blocks(tl.reshape(tl.permute(acc, (2, 1, 0)), [BLOCK_M * BLOCK_N, NB]), BLOCK_M * BLOCK_N, NB)
    finish_rows(tl.reshape(y, [BLOCK_M, BLOCK_N]), valid, r, m_mask, out_ptr, part_ptr, cnt_ptr, tw_ptr,
                split, L, N, pid_n, tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)


@triton.jit
def grouped_mma_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, row0_ptr, rows_ptr, group_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
    # Dimensions
    L, N, E, stride_x, stride_xs, stride_we, KH, stride_se, KB,
    # Meta-parameters
    ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_W: tl.constexpr,
    TILE_MAJOR: tl.constexpr, USE_ASM: tl.constexpr, EVEN_K: tl.constexpr = False, HALF_TILES: tl.constexpr = False,
):
    """One program owns out[rows of tile, n0 : n0 + BLOCK_N] for K-split `split` (grid: (N tiles, SPLIT_K,
    T), or (T, SPLIT_K, N tiles) when TILE_MAJOR).

    x int8 [*, K], xs float32 [*, K/32]; w uint8 [E, N, K/2] (even k low nibble), ws float16 [E, N, K/32];
    KH = K / 2 bytes per weight row, KB = K / 32; BLOCK_K a power of two >= 32.
    """
    pid_n, tile, split = grid_ids(TILE_MAJOR)
    n_rows = tl.load(rows_ptr + tile)
    if n_rows > 0:
        g = tl.load(group_ptr + tile).to(tl.int64)
        valid = g < E
        e = tl.where(valid, g, 0)
        row0 = tl.load(row0_ptr + tile)
        # HALF_TILES: a tile with at most half its rows live runs the loop of half the height (the scaling per
        # row, column and block is most of the loop; an expert's rows still share one tile and its bytes)
        if HALF_TILES:
            if n_rows <= BLOCK_M // 2:
                _tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split, row0,
                      n_rows, e, valid, L, N, stride_x, stride_xs, stride_we, KH, stride_se, KB, ROWS_PER_X,
                      TILES_PER_SPLIT, SPLIT_K, TOPK, BLOCK_M // 2, BLOCK_N, BLOCK_K, HAS_W, USE_ASM, EVEN_K)
            else:
                _tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split, row0,
                      n_rows, e, valid, L, N, stride_x, stride_xs, stride_we, KH, stride_se, KB, ROWS_PER_X,
                      TILES_PER_SPLIT, SPLIT_K, TOPK, BLOCK_M, BLOCK_N, BLOCK_K, HAS_W, USE_ASM, EVEN_K)
        else:
            _tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split, row0,
                  n_rows, e, valid, L, N, stride_x, stride_xs, stride_we, KH, stride_se, KB, ROWS_PER_X,
                  TILES_PER_SPLIT, SPLIT_K, TOPK, BLOCK_M, BLOCK_N, BLOCK_K, HAS_W, USE_ASM, EVEN_K)
