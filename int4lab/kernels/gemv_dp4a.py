"""Decode GEMV on int4-b32 with dp4a: four int8 multiply-adds per integer instruction. The default plan.

Shape legend: E = experts, N = out features, K = in features, R = activation rows (tokens x top-k),
A = rows combined into one output row (top-k of the MoE down projection, else 1).

    out[r, n] = sum_b xs[r, b] * ws[e, n, b] * sum_{k in block b} xq[r, k] * (nib[e, n, k] - 8),  e = eids[r]

Exact int32 sum per 32-block (|sum| <= 32 * 127 * 8 < 2**15), float32 across blocks, one bf16 rounding.
Why dp4a and not the tensor cores: a batch-1 GEMV has one activation row, so an MMA would waste 15/16 of
its work and its operand shuffles cost registers (a tensor-core GEMV was measured slower and removed;
notes/kernels.md); llama.cpp's Q4_0 kernels, on the same 32-block grid, use dp4a on the integer pipe.

One launch per GEMV:
  * the activation arrives as int8 codes (X_MODE 0), as float rows quantised here (X_MODE 1), or as the
    [gate | up] rows of a gate_up output, SwiGLU'd then quantised here (X_MODE 2). Each program quantises
    the slice of x its K range needs (quant.quant_blocks: the codes of quant_x_rows, bit for bit); x is a
    few KB, read from L2 by every N tile;
  * split-K partials are summed by the last-arriving program (epilogue.finish_rows), which also applies
    the router weights of an MoE combine: no reduce launch.

The arithmetic per 32-bit weight word (8 nibbles, k = 8w .. 8w+7, even k in the low nibbles):
    lo = word & 0x0F0F0F0F          nibbles of k = 8w, 8w+2, 8w+4, 8w+6   (unsigned bytes 0..15)
    hi = (word >> 4) & 0x0F0F0F0F   nibbles of k = 8w+1, 8w+3, 8w+5, 8w+7
    d  = dp4a(lo, x_even_word, dp4a(hi, x_odd_word, -8 * sum(x of the word)))
so 5 integer instructions per 8 weights; the "- 8" of every code is folded into the accumulator's seed.
A dot product only needs both operands permuted alike, so x is packed into even/odd words to match.
On the CPU interpreter (no PTX) dp4a and prmt are emulated with shifts; both compute the same integers.

Bytes per call: weights 0.5625 B/weight (0.5 codes + 2/32 scales), x R*K (codes) or R*K*2 (bf16),
out R*N*2; when split, SK*R*N*4 float32 partials written and read once (L2-resident at decode sizes).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .epilogue import finish_rows, fold_blocks, grid_ids, routed_expert
from .quant import quant_blocks, silu_mul

X_CODES, X_FLOAT, X_SWIGLU = 0, 1, 2    # how the activation reaches the kernel (module doc)


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
def expert_tile(w_ptr, ws_ptr, e, stride_we, stride_se, pid_n, N, KW, KB, BLOCK_N: tl.constexpr):
    """Columns of N tile pid_n of expert e: (offs_n, n_mask, weight-word row pointers, scale row pointers)."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * KW
    s_rows = ws_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * KB
    return offs_n, offs_n < N, w_rows, s_rows


@triton.jit
def x_words_from_codes(x_rows, xs_rows, t, KW, KB, BLOCK_K: tl.constexpr, USE_ASM: tl.constexpr):
    """Tile t of BM rows of int8 codes -> (x_even, x_odd, -8 * word sums) int32 [BM, BLOCK_W], scales [BM, NB].

    x_rows [BM]: row pointers into the codes viewed as int32 words (4 codes each); xs_rows [BM]: pointers to
    the rows' float32 scales; KW = K / 8 (pairs of words), KB = K / 32. Shared by the routed GEMV (BM = 1)
    and the grouped kernel (a tile of rows of one expert).
    """
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    NB: tl.constexpr = BLOCK_K // 32
    w_idx = t * BLOCK_W + tl.arange(0, BLOCK_W)
    xw = tl.load(x_rows[:, None, None] + (2 * w_idx[:, None] + tl.arange(0, 2)[None, :])[None, :, :],
                 mask=(w_idx < KW)[None, :, None], other=0)
    x0, x1 = tl.split(xw)                                     # x[8w..8w+3], x[8w+4..8w+7]   [BM, BLOCK_W]
    xe = _prmt(x0, x1, 0x6420, USE_ASM)                       # x[8w + 0, 2, 4, 6]
    xo = _prmt(x0, x1, 0x7531, USE_ASM)                       # x[8w + 1, 3, 5, 7]
    eights = tl.full(xe.shape, 0x08080808, tl.int32)
    negc = -_dp4a(eights, xe, _dp4a(eights, xo, tl.zeros_like(xe), USE_ASM), USE_ASM)
    kb = t * NB + tl.arange(0, NB)
    xs = tl.load(xs_rows[:, None] + kb[None, :], mask=(kb < KB)[None, :], other=0.0)
    return xe, xo, negc, xs


@triton.jit
def _x_words_from_floats(x_row, t, K, X_MODE: tl.constexpr, BLOCK_K: tl.constexpr, USE_ASM: tl.constexpr):
    """Tile t of float x (X_FLOAT) or of silu(gate) * up (X_SWIGLU, up at column K + k), quantised here."""
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    NB: tl.constexpr = BLOCK_K // 32
    offs = t * BLOCK_K + tl.arange(0, NB)[:, None] * 32 + tl.arange(0, 32)[None, :]     # [NB, 32]
    mask = offs < K
    v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    if X_MODE == 2:
        v = silu_mul(v, tl.load(x_row + K + offs, mask=mask, other=0.0).to(tl.float32))
    q, xs = quant_blocks(v, USE_ASM)
    q = q.to(tl.int32)
    qe, qo = tl.split(tl.reshape(q, [BLOCK_W, 4, 2]))         # [BLOCK_W, 4]: k = 8w + 2i and 8w + 2i + 1
    shift = 8 * tl.arange(0, 4)[None, :]
    xe = tl.sum((qe & 0xFF) << shift, axis=1)                 # disjoint bytes: the sum is the packing
    xo = tl.sum((qo & 0xFF) << shift, axis=1)
    negc = -8 * (tl.sum(qe, axis=1) + tl.sum(qo, axis=1))
    return xe, xo, negc, xs


PDL_TILES = 4          # weight tiles a PDL-launched program asks L2 for before it waits (a few MB in all)


@triton.jit
def _prefetch_l2(w_rows, n_mask, t0, KW, safe_ptr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                 TILES: tl.constexpr):
    """prefetch.global.L2 of weight tiles t0 .. t0 + TILES - 1: one request per 128-byte line (32 words);
    an address past the row or past N becomes `safe_ptr` (prefetch is a hint, but never an invalid one)."""
    LINES: tl.constexpr = (BLOCK_W + 31) // 32
    for i in tl.static_range(TILES):
        w_idx = (t0 + i) * BLOCK_W + tl.arange(0, LINES) * 32
        ok = n_mask[:, None] & (w_idx < KW)[None, :]
        ptr = tl.where(ok, w_rows + w_idx[None, :], safe_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptr], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def gemv_tile(
    x_ptr, xs_ptr, w_ptr, ws_ptr, eid_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, r, split,
    R, N, K, E, stride_x, stride_xs, stride_we, KW, stride_se, KB,
    X_MODE: tl.constexpr, ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
    TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_EIDS: tl.constexpr,
    HAS_W: tl.constexpr, PREFETCH: tl.constexpr, USE_ASM: tl.constexpr, WAIT_PDL: tl.constexpr,
    PF_TILES: tl.constexpr,
):
    """The work of one program of gemv_dp4a_kernel: out[r, pid_n tile] for K-split `split` (arguments as
    there; WAIT_PDL: the PDL == 2 prologue)."""
    BLOCK_W: tl.constexpr = BLOCK_K // 8          # weight words per row per tile
    NB: tl.constexpr = BLOCK_K // 32              # scale blocks per tile
    e, valid = routed_expert(eid_ptr, r, E, HAS_EIDS)

    offs_n, n_mask, w_rows, s_rows = expert_tile(w_ptr, ws_ptr, e, stride_we, stride_se, pid_n, N, KW, KB, BLOCK_N)
    if WAIT_PDL:
        _prefetch_l2(w_rows, n_mask, split * TILES_PER_SPLIT, KW, w_ptr + e * stride_we, BLOCK_N, BLOCK_W,
                     PF_TILES)
        gdc_wait()
    offs_w = tl.arange(0, BLOCK_W)
    offs_b = tl.arange(0, NB)
    xr = (r // ROWS_PER_X).to(tl.int64)
    x_row = x_ptr + xr * stride_x
    one = tl.zeros([1], tl.int64)                       # a row pointer as a 1-row tensor
    acc = tl.zeros([BLOCK_N, NB], dtype=tl.float32)   # folded across blocks once, after the loop

    t0 = split * TILES_PER_SPLIT
    if PREFETCH:
        wd = tl.load(w_rows + (t0 * BLOCK_W + offs_w)[None, :],
                     mask=n_mask[:, None] & ((t0 * BLOCK_W + offs_w) < KW)[None, :], other=0)
    for i in range(0, TILES_PER_SPLIT):
        t = t0 + i
        if PREFETCH:                      # tile t + 1's words are in flight while tile t is multiplied
            w_next = (t + 1) * BLOCK_W + offs_w
            wd_next = tl.load(w_rows + w_next[None, :], other=0,
                              mask=n_mask[:, None] & ((w_next < KW) & (i + 1 < TILES_PER_SPLIT))[None, :])
        else:
            w_idx = t * BLOCK_W + offs_w
            wd = tl.load(w_rows + w_idx[None, :], mask=n_mask[:, None] & (w_idx < KW)[None, :], other=0)
        kb = t * NB + offs_b
        ws = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & (kb < KB)[None, :], other=0.0)
        if X_MODE == 0:                   # [1, BLOCK_W] words, [1, NB] scales: the grouped kernel's helper
            xe, xo, negc, xs = x_words_from_codes(x_row + one, xs_ptr + xr * stride_xs + one, t, KW, KB,
                                                  BLOCK_K, USE_ASM)
        else:
            xe, xo, negc, xs = _x_words_from_floats(x_row, t, K, X_MODE, BLOCK_K, USE_ASM)
            xe, xo, negc, xs = xe[None, :], xo[None, :], negc[None, :], xs[None, :]
        lo = wd & 0x0F0F0F0F
        hi = (wd >> 4) & 0x0F0F0F0F
        d = _dp4a(lo, xe, tl.broadcast_to(negc, wd.shape), USE_ASM)
        d = _dp4a(hi, xo, d, USE_ASM)                                           # [BLOCK_N, BLOCK_W]
        bsum = tl.sum(tl.reshape(d, [BLOCK_N, NB, 4]), axis=2)                  # exact block sums
        acc += bsum.to(tl.float32) * (ws.to(tl.float32) * xs)
        if PREFETCH:
            wd = wd_next

    rows = r + tl.zeros([1], tl.int32)
    # Routed rows fold in the grouped kernel's fixed order (the two paths give the same bits). A dense GEMV
    # has no twin and folds with tl.sum: fold_blocks' reshapes cost ~0.7 us per M weights on sm_90 at NB 64-128
    # (the single-row plans; measured at commit 554974e), tl.sum nothing measurable.
    if HAS_EIDS:
        y = fold_blocks(acc, BLOCK_N, NB)
    else:
        y = tl.sum(acc, axis=1)
    finish_rows(y[None, :], valid, rows, rows >= 0, out_ptr, part_ptr, cnt_ptr, tw_ptr,
                split, R, N, pid_n, tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)


@triton.jit
def gemv_dp4a_kernel(
    # Pointers
    x_ptr, xs_ptr, w_ptr, ws_ptr, eid_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr,
    # Dimensions
    R, N, K, E, stride_x, stride_xs, stride_we, KW, stride_se, KB,
    # Meta-parameters
    X_MODE: tl.constexpr, ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
    TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_EIDS: tl.constexpr,
    HAS_W: tl.constexpr, PREFETCH: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr = 0,
    PF_TILES: tl.constexpr = 0, ROW_MAJOR: tl.constexpr = False,
):
    """One program owns out[r, n0 : n0 + BLOCK_N] for K-split `split` (grid: (N tiles, SPLIT_K, R), or
    (R, SPLIT_K, N tiles) when ROW_MAJOR: every row's program for one N range then runs at once, so rows
    routed to the same expert read its bytes from DRAM about once and from L2 after that).

    x: int8 codes [*, K] read as int32 words with float32 scales xs [*, K/32] (X_CODES), float [*, K]
    (X_FLOAT) or float [*, 2K] gate | up (X_SWIGLU); row r reads x row r // ROWS_PER_X. w int32 words
    [E, N, K/8] (the uint8 [E, N, K/2] pack viewed as little-endian words); ws float16 [E, N, K/32];
    eids int [R]. Output and partials as epilogue.finish_rows says. KW = K / 8 (weight words per row), KB =
    K / 32 (scale blocks per row) and the expert strides arrive as arguments rather than being computed from
    K here: Triton specialises an integer argument that is a multiple of 16, so it can prove rows 16-byte
    aligned and masks constant over 4 words, and load the weights as 16-byte vectors (from K // 8 it proved
    2 and emitted one 4-byte load per word: tune/resources.py counts them). PREFETCH issues tile i + 1's weight
    loads before tile i's arithmetic (a hand-made double buffer: more bytes in flight per program).

    PDL (programmatic dependent launch, sm_90; 0 = off): 1 lets the next kernel's programs start once every
    program here has started; 2 is that next kernel, launched with launch_pdl: it asks L2 for its first
    PDL_TILES weight tiles (weights are never written by the kernel before it), then waits for that kernel
    to finish before it reads anything else (x, the split-K workspace) or writes. PF_TILES: the
    launcher's min(TILES_PER_SPLIT, PDL_TILES).
    """
    pid_n, r, split = grid_ids(ROW_MAJOR)
    if PDL == 1:
        gdc_launch_dependents()
    gemv_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, eid_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, r, split,
              R, N, K, E, stride_x, stride_xs, stride_we, KW, stride_se, KB, X_MODE, ROWS_PER_X, TILES_PER_SPLIT,
              SPLIT_K, TOPK, BLOCK_N, BLOCK_K, HAS_EIDS, HAS_W, PREFETCH, USE_ASM, PDL == 2, PF_TILES)
