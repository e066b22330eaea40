"""Epilogue pieces every GEMV variant shares: expert guard, bf16 rounding, and the one-launch split-K finish.

Shape legend: R = routed rows (tokens x top-k), T = output rows (tokens), A = rows summed into one output
row (top-k for the MoE combine, else 1), N = out features, SK = K splits.

The split-K finish (why no second launch is needed). Every program of a [N tile, row] pair writes its
float32 partial to its own slot part[split, r, n-tile], then increments an arrival counter of its output
tile (t = r // A, n-tile). The program that arrives last (counter == SK * A - 1) sums the slots itself,
in the fixed order j = 0..A-1 (rows), s = 0..SK-1 (splits), applies the router weights when given, writes
bf16, and resets the counter to zero. Which program is last varies from run to run; the order of the sum
does not, so the bits are the same on every run, and the counters are zero again after each launch, so
the call stays legal under CUDA-graph capture and replay. The splits are summed in the order of
`reduce.reduce_partials_kernel` (s = 0..SK-1 from zero) and, for the MoE combine, each row rounded to bf16 and
the rows combined in the order of `moe.combine_rows_kernel` (j = 0..A-1), so that the one-launch finish gives
the two-launch path's bits: tests/lib/test_kernels.py checks the split finish against reduce_partials bit for
bit, and the fused combine against combine_rows bit for bit unsplit (within a bf16 ulp when split).
"""
import triton
import triton.language as tl


@triton.jit
def to_bf16_rne(x):
    """float32 tensor -> bfloat16 tensor, round-to-nearest-even; NaN stays NaN, inf stays inf.

    Why not `x.to(tl.bfloat16)`: Triton 3.6's CPU interpreter truncates that cast (and its "rtne" mode
    drops the carry into the exponent), so interpreter results would differ from torch's by an ulp in
    about half the elements. The textbook RNE bit trick costs a few integer ops per output element.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)               # carries into the exponent on purpose
    hi = tl.where(x != x, 0x7FC0, rounded >> 16)               # keep NaN a (quiet) NaN
    return hi.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def grid_ids(ROWS_FIRST: tl.constexpr):
    """(pid_n, row or tile, split) of a (N tiles, SPLIT_K, rows) grid, or of a (rows, SPLIT_K, N tiles) grid
    when ROWS_FIRST (every row's program for one N range then runs at once: rows of one expert share its
    bytes through L2)."""
    if ROWS_FIRST:
        return tl.program_id(2), tl.program_id(0), tl.program_id(1)
    else:
        return tl.program_id(0), tl.program_id(2), tl.program_id(1)


@triton.jit
def routed_expert(eid_ptr, r, E, HAS_EIDS: tl.constexpr):
    """(expert index as int64, valid) for row r. An id outside [0, E) cannot be refused under graph capture:
    it reads expert 0 and the row's output is NaN."""
    if HAS_EIDS:
        e = tl.load(eid_ptr + r).to(tl.int64)
    else:
        e = tl.zeros((), tl.int64)
    valid = (e >= 0) & (e < E)
    return tl.where(valid, e, 0), valid


@triton.jit
def fold_blocks(acc, ROWS: tl.constexpr, NB: tl.constexpr):
    """float32 [ROWS, NB] -> [ROWS]: the NB columns (a power of two <= 256) summed as a fixed pairwise tree,
    ((c0 + c1) + (c2 + c3)) + ..., so the bits do not depend on the tensor's layout, its rank before the
    caller's reshape, or the number of warps (tl.sum's order does). The routed GEMV and the grouped kernel
    both fold their per-block columns this way, which is what makes their outputs bit-identical."""
    for i in tl.static_range(8):
        if (NB >> i) > 1:
            lo, hi = tl.split(tl.reshape(acc, [ROWS, NB >> (i + 1), 2]))
            acc = lo + hi
    return tl.reshape(acc, [ROWS])


@triton.jit
def finish_rows(y, valid, r, m_mask, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, R, N, pid_n, n_tiles, offs_n,
                n_mask, SPLIT_K: tl.constexpr, TOPK: tl.constexpr, HAS_W: tl.constexpr):
    """Write one program's float32 results y [BM, BLOCK_N] for rows r [BM] (m_mask: live rows), split `split`.

    SPLIT_K == 1 and TOPK == 1: bf16 straight to out [R, N] (with HAS_W, weighted first: w[r] * bf16(y), the
    combine of one routed row, rounding as moe_decode_ref). Otherwise: the float32 partials go to
    part [SPLIT_K, R, N]; for each row, the last of the SPLIT_K * TOPK programs of output tile
    (r // TOPK, pid_n) sums them in fixed order into bf16 out [R // TOPK, N]; with HAS_W each row's split
    sum is rounded to bf16 and weighted by w [T, TOPK] (the MoE combine, rounding as moe_decode_ref). cnt
    int32 [T * n_tiles] must be zero before the launch and is zero after it. A program may hold several
    rows (the grouped kernel's tile of one expert): each row counts its own arrival.
    """
    y = tl.where(valid, y, float("nan"))
    rr = r.to(tl.int64)
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K * TOPK == 1:
        if HAS_W:     # one expert per token: the combine is its router weight alone (a weight of 1 is not implied)
            w1 = tl.load(tw_ptr + rr, mask=m_mask, other=0.0).to(tl.float32)
            y = w1[:, None] * to_bf16_rne(y).to(tl.float32)
        tl.store(out_ptr + rr[:, None] * N + offs_n[None, :], to_bf16_rne(y), mask=mask)
    else:
        tl.store(part_ptr + (split * R + rr)[:, None] * N + offs_n[None, :], y, mask=mask)
        t = rr // TOPK
        tile = t * n_tiles + pid_n
        tl.debug_barrier()                      # every thread's partial is stored before the release below
        seen = tl.atomic_add(cnt_ptr + tile, 1, mask=m_mask, sem="acq_rel", scope="gpu")
        last = m_mask & (seen == SPLIT_K * TOPK - 1)   # last to arrive: every other slot of its tile is written
        if tl.max(last.to(tl.int32), axis=0) > 0:
            lmask = last[:, None] & n_mask[None, :]
            acc = tl.zeros_like(y)
            for j in tl.static_range(TOPK):
                row = t * TOPK + j
                yj = tl.zeros_like(y)
                for s in tl.static_range(SPLIT_K):
                    # .cg: read from L2, where the other programs' stores are, never an out-of-date L1 line
                    yj += tl.load(part_ptr + (s * R + row)[:, None] * N + offs_n[None, :], mask=lmask, other=0.0,
                                  cache_modifier=".cg")
                if HAS_W:     # the MoE combine: each expert's row rounded to bf16 first, as moe_decode_ref does
                    wj = tl.load(tw_ptr + row, mask=last, other=0.0).to(tl.float32)
                    acc += wj[:, None] * to_bf16_rne(yj).to(tl.float32)
                else:
                    acc += yj
            tl.store(out_ptr + t[:, None] * N + offs_n[None, :], to_bf16_rne(acc), mask=lmask)
            # the counter back to zero, ready for the next launch (a captured graph replays without a memset).
            # Relaxed: nothing in this launch reads it again, and the kernel boundary orders it before the next
            # launch's arrivals
            tl.atomic_xchg(cnt_ptr + tile, 0, mask=last, sem="relaxed")
