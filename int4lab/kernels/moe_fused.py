"""The routed MoE step in ONE launch: gate_up programs, then down programs that wait for their row of h.

Shape legend: L = routed rows (tokens x top-k), H = hidden, I = expert intermediate width, SK = K splits,
NT = N tiles; gu = the gate_up GEMV [E, 2I, H], dn = the down GEMV [E, H, I].

Why: two launches (moe.moe_decode_routed) leave a gap: the down GEMV starts only when the whole gate_up
grid has finished, so the SMs idle in gate_up's last, partial wave and in down's ramp (PDL hides part of it).
Here one grid holds both GEMVs' programs, and a down program waits only for ITS row of h.

Measured on the H200 (notes/perf.md v17, v17b): never faster than the two launches (Mixtral equal, OLMoE and
Qwen3 1.3-1.7x slower: a waiting down program holds its SM slot), so plan.MOE_FUSED is off everywhere; the
kernel stays, tested, as the measured answer to the one-launch question.

Tickets (why this cannot deadlock). Program p's role is not its program id but a ticket, taken with an
atomic add when it starts (`_role`: for one token row by row, a row's gate_up tickets then its down
tickets; for several tokens every gate_up ticket first, each GEMV in the routed grid's order). A down
program waits on ready[row] until all SK_gu * NT_gu gate_up programs of its row have written their part of
h; those programs hold lower tickets, so each has already started on some SM, and a started gate_up
program never waits: every wait ends, whatever order the hardware schedules the programs in or how many fit
at once.

Memory order: a gate_up program writes its h tile (or, split, its partial and maybe the finished tile),
then a CTA barrier and one release add on ready[row] (the same pattern as epilogue.finish_rows); the
down program's acquire read of ready[row], then a CTA barrier, makes those writes visible to all its
threads. Every counter is zero again when the launch ends (the last program to finish resets the tickets
and ready[]), so the call is legal under CUDA-graph capture and replay.

Same bits as the two-launch path: each program runs gemv_dp4a.gemv_tile with the same arguments.
In the CPU interpreter programs run one at a time in id order, so tickets equal ids and no wait spins.
"""
import triton
import triton.language as tl

from .gemv_dp4a import X_FLOAT, X_SWIGLU, gemv_tile

GU_X, DN_X = tl.constexpr(X_FLOAT), tl.constexpr(X_SWIGLU)     # how x and h reach the two GEMVs' tiles


@triton.jit
def _role(ticket, L, NT_GU, NT_DN, GU_SPLIT: tl.constexpr, DN_SPLIT: tl.constexpr, ROWS_FIRST: tl.constexpr):
    """(is gate_up, pid_n, row, split) of a ticket. Rows first (several tokens): every gate_up ticket, then
    every down ticket. One token: row by row, each row's gate_up tickets then its down tickets, so a row's
    down programs start while later rows' gate_up runs (a down program still waits only on lower tickets)."""
    if ROWS_FIRST:
        G = L * GU_SPLIT * NT_GU
        is_gu = ticket < G
        q = tl.where(is_gu, ticket, ticket - G)
        sk = tl.where(is_gu, GU_SPLIT, DN_SPLIT)        # the grid (R, SK, NT): row fastest, then split
        pid_n, r, split = q // (L * sk), q % L, (q // L) % sk
    else:
        per_row = GU_SPLIT * NT_GU + DN_SPLIT * NT_DN
        r = ticket // per_row
        q = ticket % per_row
        is_gu = q < GU_SPLIT * NT_GU
        q = tl.where(is_gu, q, q - GU_SPLIT * NT_GU)
        nt = tl.where(is_gu, NT_GU, NT_DN)
        pid_n, split = q % nt, q // nt
    return is_gu, pid_n, r, split


@triton.jit
def _wait_at_least(ptr, target, USE_ASM: tl.constexpr):
    """Spin until *ptr >= target, then acquire. Polls with plain volatile loads and a ~0.25 us sleep: a
    tight loop of atomic adds from hundreds of waiting programs on a few addresses queues at the L2 atomic
    unit in front of the very increments they wait for (v17 probe: the one launch 25-40 % slower)."""
    seen = tl.load(ptr, volatile=True)
    while seen < target:
        if USE_ASM:
            seen = tl.inline_asm_elementwise("nanosleep.u32 256; mov.b32 $0, $1;", "=r,r", [seen],
                                             dtype=tl.int32, is_pure=False, pack=1)
        seen = tl.load(ptr, volatile=True)
    tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")    # the producers' release -> our later loads


@triton.jit
def moe_fused_kernel(
    # Pointers
    x_ptr, gu_w, gu_s, dn_w, dn_s, eid_ptr, tw_ptr, h_ptr, out_ptr,
    gu_part, gu_cnt, dn_part, dn_cnt, sync_ptr,
    # Dimensions
    L, H, I, E, stride_x,
    gu_we, gu_kw, gu_se, gu_kb, dn_we, dn_kw, dn_se, dn_kb,
    # Meta-parameters
    TOPK: tl.constexpr, GU_TILES_PER_SPLIT: tl.constexpr, GU_SPLIT: tl.constexpr,
    DN_TILES_PER_SPLIT: tl.constexpr, DN_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr, USE_ASM: tl.constexpr, ROWS_FIRST: tl.constexpr, RESET_BLOCK: tl.constexpr,
):
    """One program: a gate_up tile or a down tile, by ticket (module doc). Grid: (G + D,) programs.

    x float [T, H] (row r reads x row r // TOPK); gu_w / dn_w the int32 word views of the packed experts,
    gu_s / dn_s their float16 scales; eids int [L]; tw float [T, TOPK]; h bf16 [L, 2I] (written here);
    out bf16 [T, H]. gu_* / dn_* part and cnt: each GEMV's split-K workspace (epilogue.finish_rows).
    sync int32 [2 + L]: ticket counter, finished-program counter, ready[L]; zero before and after.
    """
    NT_GU = tl.cdiv(2 * I, BLOCK_N)
    NT_DN = tl.cdiv(H, BLOCK_N)
    TOTAL = L * (GU_SPLIT * NT_GU + DN_SPLIT * NT_DN)
    ready = sync_ptr + 2
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    is_gu, pid_n, r, split = _role(ticket, L, NT_GU, NT_DN, GU_SPLIT, DN_SPLIT, ROWS_FIRST)
    if is_gu:
        gemv_tile(x_ptr, x_ptr, gu_w, gu_s, eid_ptr, h_ptr, gu_part, gu_cnt, tw_ptr, pid_n, r, split,
                  L, 2 * I, H, E, stride_x, 0, gu_we, gu_kw, gu_se, gu_kb, GU_X, TOPK, GU_TILES_PER_SPLIT,
                  GU_SPLIT, 1, BLOCK_N, BLOCK_K, True, False, PREFETCH, USE_ASM, False, 0)
        tl.debug_barrier()                    # every thread's h (or partial) store is done before the release
        tl.atomic_add(ready + r, 1, sem="release", scope="gpu")
    else:
        _wait_at_least(ready + r, GU_SPLIT * NT_GU, USE_ASM)
        tl.debug_barrier()                    # the acquire above is ordered before every thread's h loads
        gemv_tile(h_ptr, h_ptr, dn_w, dn_s, eid_ptr, out_ptr, dn_part, dn_cnt, tw_ptr, pid_n, r, split,
                  L, H, I, E, 2 * I, 0, dn_we, dn_kw, dn_se, dn_kb, DN_X, 1, DN_TILES_PER_SPLIT,
                  DN_SPLIT, TOPK, BLOCK_N, BLOCK_K, True, True, PREFETCH, USE_ASM, False, 0)
    tl.debug_barrier()
    done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == TOTAL - 1:                     # the last program: every other one has finished
        offs = tl.arange(0, RESET_BLOCK)                 # RESET_BLOCK: a power of two >= L
        tl.store(ready + offs, tl.zeros([RESET_BLOCK], tl.int32), mask=offs < L)
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)
