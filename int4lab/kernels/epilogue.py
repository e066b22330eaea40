"""Epilogue pieces every GEMV variant shares: expert guard, bf16 rounding, and the one-launch split-K finish.

Shape legend: R = routed rows (tokens x top-k), T = output rows (tokens), A = rows summed into one output
row (top-k for the MoE combine, else 1), N = out features, SK = K splits.

The split-K finish (why no second launch is needed). Every program of a [N tile, row] pair writes its
float32 partial to its own slot part[split, r, n-tile], then increments an arrival counter of its output
tile (t = r // A, n-tile). The program that arrives last (counter == SK * A - 1) sums the slots itself,
in the fixed order j = 0..A-1 (rows), s = 0..SK-1 (splits), applies the router weights when given, writes
bf16, and resets the counter to zero. Which program is last varies from run to run; the order of the sum
does not, so the bits are the same on every run, and the counters are zero again after each launch, so
the call stays legal under CUDA-graph capture and replay. The same order as `reduce_rows_kernel`, so the
one-launch path and the two-launch path give the same bits.
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
def finish_rows(y, valid, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, r, R, N, pid_n, n_tiles, offs_n, n_mask,
                SPLIT_K: tl.constexpr, TOPK: tl.constexpr, HAS_W: tl.constexpr):
    """Write one program's float32 result y [BLOCK_N] for row r, split `split` (module doc).

    SPLIT_K == 1 and TOPK == 1: bf16 straight to out [R, N]. Otherwise: the float32 partial goes to
    part [SPLIT_K, R, N]; the last of the SPLIT_K * TOPK programs of output tile (r // TOPK, pid_n) sums
    them in fixed order into bf16 out [R // TOPK, N]; with HAS_W each row's split sum is rounded to bf16
    and weighted by w [T, TOPK] (the MoE combine, rounding as moe_decode_ref). cnt int32 [T * n_tiles]
    must be zero before the launch and is zero after it.
    """
    y = tl.where(valid, y, float("nan"))
    if SPLIT_K * TOPK == 1:
        tl.store(out_ptr + r.to(tl.int64) * N + offs_n, to_bf16_rne(y), mask=n_mask)
    else:
        tl.store(part_ptr + (split * R + r).to(tl.int64) * N + offs_n, y, mask=n_mask)
        t = r // TOPK
        tile = t * n_tiles + pid_n
        tl.debug_barrier()                      # every thread's partial is stored before the release below
        seen = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if seen == SPLIT_K * TOPK - 1:          # last to arrive: every other slot of this tile is written
            acc = tl.zeros_like(y)
            for j in tl.static_range(TOPK):
                row = t * TOPK + j
                yj = tl.zeros_like(y)
                for s in tl.static_range(SPLIT_K):
                    # .cg: read from L2, where the other programs' stores are, never a stale L1 line
                    yj += tl.load(part_ptr + (s * R + row).to(tl.int64) * N + offs_n, mask=n_mask, other=0.0,
                                  cache_modifier=".cg")
                if HAS_W:     # the MoE combine: each expert's row rounded to bf16 first, as moe_decode_ref does
                    acc += tl.load(tw_ptr + row).to(tl.float32) * to_bf16_rne(yj).to(tl.float32)
                else:
                    acc += yj
            tl.store(out_ptr + t.to(tl.int64) * N + offs_n, to_bf16_rne(acc), mask=n_mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)   # ready for the next launch (graph replay)
