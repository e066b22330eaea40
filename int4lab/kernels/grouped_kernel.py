"""The grouped W4A8 kernel's entry: which tile of routed rows a program owns, then the tile's dot on the integer
pipe (grouped_dp4a.dp4a_tile) or on the tensor cores (grouped_mma.mma_tile).

Shape legend: E = experts, N = out features, K = in features, L = routed rows (tokens x top-k), T = tiles,
BM = rows per tile (BLOCK_M).

One program owns out[rows of one tile, n0 : n0 + BLOCK_N] for K-split `split`: grid (N tiles, SPLIT_K, T), or
(T, SPLIT_K, N tiles) when TILE_MAJOR (the tiles of one N range then run side by side, and an expert with several
tiles is read from DRAM about once, the others hitting L2). A tile (grouped.build_group_tiles) is rows
row0 .. row0 + n_rows - 1 of `order`, all routed to expert group[tile]; a dead tile (n_rows 0, the static
budget's spare) reads nothing, and group E is the invalid-id bucket, whose rows come out NaN. The two tile bodies
take the same rows and give the same bits (with the same block_k and split_k); MMA, HALF_TILES and W_TMA are
compile-time, so each launch compiles only its own body.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import grid_ids
from .grouped_dp4a import dp4a_tile
from .grouped_mma import mma_tile


@triton.jit
def grouped_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, row0_ptr, rows_ptr, group_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
    # Dimensions
    L, N, E, stride_x, stride_xs, stride_we, KW, stride_se, KB,
    # Meta-parameters
    ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_W: tl.constexpr,
    TILE_MAJOR: tl.constexpr, USE_ASM: tl.constexpr, MMA: tl.constexpr, HALF_TILES: tl.constexpr = False,
    W_TMA: tl.constexpr = False,
):
    """x: the int8 codes [*, K] (MMA) or the same codes read as int32 words (dp4a); xs float32 [*, K/32]; row r
    reads x row r // ROWS_PER_X. w: uint8 [E, N, K/2] with KW = K / 2 bytes a row (MMA; a TensorDescriptor
    when W_TMA), or int32 words [E, N, K/8] with KW = K / 8 (dp4a); ws float16 [E, N, K/32], KB = K / 32.
    order int32 [L] (sorted position -> row), row0 / rows / group int32 [T] (grouped.GroupTiles). HALF_TILES
    (MMA, BLOCK_M >= 16): a tile of at most BLOCK_M / 2 live rows runs the loop of half the height."""
    pid_n, tile, split = grid_ids(TILE_MAJOR)
    n_rows = tl.load(rows_ptr + tile)
    if n_rows > 0:
        g = tl.load(group_ptr + tile).to(tl.int64)
        valid = g < E                                # group E: the invalid-id bucket -> NaN rows
        e = tl.where(valid, g, 0)
        row0 = tl.load(row0_ptr + tile)
        if MMA:
            if HALF_TILES and n_rows <= BLOCK_M // 2:
                mma_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split,
                         row0, n_rows, e, valid, L, N, stride_x, stride_xs, stride_we, KW, stride_se, KB, ROWS_PER_X,
                         TILES_PER_SPLIT, SPLIT_K, TOPK, BLOCK_M // 2, BLOCK_N, BLOCK_K, HAS_W, USE_ASM, W_TMA)
            else:
                mma_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split,
                         row0, n_rows, e, valid, L, N, stride_x, stride_xs, stride_we, KW, stride_se, KB, ROWS_PER_X,
                         TILES_PER_SPLIT, SPLIT_K, TOPK, BLOCK_M, BLOCK_N, BLOCK_K, HAS_W, USE_ASM, W_TMA)
        else:
            dp4a_tile(pid_n, split, row0, n_rows, e, valid, x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr,
                      part_ptr, cnt_ptr, tw_ptr, L, N, stride_x, stride_xs, stride_we, KW, stride_se, KB, ROWS_PER_X,
                      TILES_PER_SPLIT, SPLIT_K, TOPK, BLOCK_M, BLOCK_N, BLOCK_K, HAS_W, USE_ASM)
