"""Launch plans: block sizes, warps, pipeline depth and split-K, chosen per GPU generation from a table.

Shape legend: E = experts, N = out features, K = in features, R = activation rows.

Nothing is autotuned at import or at call time: a GEMV plan is a pure function of (generation, the device's SM
count, N, K, R) and of the plan a caller passes; a grouped plan also of the mean rows per routed expert L / min(E, L)
(so of the expert count E), and the MoE step's path of that mean from (tokens, top-k, E) and of the weights per expert
projection. So a call is reproducible and legal under CUDA-graph capture. The
SM count enters only through the split-K waves rule below, so two parts of one generation with different SM counts
can get different splits. The table rows
are the configurations H200 sweeps picked (notes/kernels.md, "Launch-plan rows"); the sweeps' receipts are not in
the tree. The decode receipt (H100) times only the plan the table picks for each shape it runs (from 2 tokens,
both MoE paths), no other plan for those shapes, so it shows what the chosen rows achieve, not that a row beats
its alternatives. sm_80 takes the H200's rows (adapted where it lacks TMA, as the comments
below say), none of them measured on such a GPU. A sweep tries other rows by passing a
GemvPlan to the launchers (`plan=`), never by changing this table at run time.

Split-K rule: a GEMV grid of cdiv(N, block_n) * R programs is too small to keep every SM streaming
weights when N is small and K large (4096x14336 at one row: 128 programs of block_n 32 for 132 SMs).
Splitting K into `split_k` slices multiplies the programs; the price is SK * R * N float32 partials written
and read once by the last-arriving program of each tile (epilogue.finish_rows), in the same launch.
We split until the grid holds about `waves` programs per SM, never more than 16 slices and never
more slices than K tiles.
"""
from __future__ import annotations

import dataclasses

import torch

MAX_SPLIT_K = 16


@dataclasses.dataclass(frozen=True)
class GemvPlan:
    """Meta-parameters of one `gemv_int4_b32` launch."""
    block_n: int        # output features per program
    block_k: int        # K per loop step, a power of two >= 128
    num_warps: int
    num_stages: int     # software pipelining depth of the weight loads
    waves: float        # target programs per SM when choosing split-K
    split_k: int | None = None   # None: chosen by gemv_plan from `waves`
    prefetch: bool = False       # load tile i + 1's weights before tile i's arithmetic


@dataclasses.dataclass(frozen=True)
class GroupedPlan:
    """Meta-parameters of one `gemm_int4_b32_grouped` launch (and of the tiles built for it)."""
    block_m: int        # rows per tile (build_group_tiles' block_m); mma >= 4, dp4a <= 8
    block_n: int
    block_k: int        # K per loop step, a power of two: dp4a >= 128, mma >= 32 (block_k / 32 blocks batched)
    num_warps: int
    num_stages: int
    waves: float = 0.25          # target programs per SM when choosing split-K
    split_k: int | None = None   # None: chosen from `waves` by resolve_grouped
    kind: str = "dp4a"           # "dp4a": grouped_dp4a.py; "mma": grouped_mma.py (tensor cores)
    tile_major: bool = False     # grid (tiles, splits, N tiles): an expert's tiles for one N range run together
    half_tiles: bool = False     # mma, block_m >= 16: a tile of at most block_m / 2 rows runs a loop half as tall
    tma: bool = False            # mma: the weights through a TensorDescriptor (Hopper's TMA; same bits)


# Per generation: rows (smallest N * K per expert, smallest R rows, smallest K / N, plan); the first row
# that applies wins; block_k is capped at the next power of two >= K. "interp" is the CPU interpreter, whose
# cost is per program and per op, not per element: wide tiles, few programs.
GEMV_TABLE = {
    # Chosen by H200 sweeps, whose receipts are not in the tree:
    # `git show 98c1d49:data/receipts/kernel_sweep_v7_h200.json` and
    # `git show fbd3c59:data/receipts/probe_gemv_v5_h200.json`. Split-K's last-arriving finish costs tail latency,
    # so most rows split only when the grid would otherwise be tiny (waves 0.25); long-K, short-N
    # weights (4096x14336) gain from a split all the same. Routed rows (R >= 2: MoE gate_up / down over top-k
    # experts) multiply the programs, so taller tiles of 1024 win there; one small dense row wants short programs of
    # the widest tiles and 8 warps. Routed rows with K < N (the small models' down GEMV: 2048 outputs of 1024 or 768
    # inputs) run 64-wide tiles.
    "sm90": ((32 * 2**20, 1, 2.0, GemvPlan(block_n=32, block_k=1024, num_warps=4, num_stages=2, waves=2.0)),
             (32 * 2**20, 1, 0.0, GemvPlan(block_n=16, block_k=2048, num_warps=4, num_stages=2, waves=0.25)),
             (0, 2, 1.0, GemvPlan(block_n=32, block_k=1024, num_warps=4, num_stages=2, waves=0.25)),
             (0, 2, 0.0, GemvPlan(block_n=64, block_k=1024, num_warps=4, num_stages=2, waves=0.25)),
             (0, 1, 0.0, GemvPlan(block_n=8, block_k=4096, num_warps=8, num_stages=2, waves=0.25))),
    "interp": ((0, 1, 0.0, GemvPlan(block_n=64, block_k=512, num_warps=1, num_stages=1, waves=1.0)),),
}
# Ampere/Ada have the same dp4a instruction; these rows are the H200's, not measured on those chips.
GEMV_TABLE["sm80"] = GEMV_TABLE["sm90"]
# Grouped GEMV: rows (smallest mean rows per routed expert, smallest N * K per expert, plan), the last row that
# applies wins. The mean L / min(E, L) is known before the routing (tokens, top-k, E), so the choice is
# capture-legal.
GROUPED_TABLE = {
    # Chosen by H200 probes (the commits of these rows hold their receipts), keyed by mean rows per routed expert.
    # Below 4 rows, one row per tile on a tile-major grid won on all three models (every tile of one N range runs
    # at once, so an expert's bytes come from DRAM once and its other rows hit L2); from 4 the batched tensor-core
    # tile (4 blocks per dot) at 8 rows, but at 16 rows for experts of 32 M weights and more (7 experts share 32
    # rows, so 8-row tiles of the busiest ones split in two); from 8 at 16 rows, from 16 at 32 (an expert of 17-32
    # rows read by one tile, not two). Waves 2 on the Mixtral-16-token row and the 32-row row split a down GEMM of
    # few N tiles and leave gate_up unsplit; a split lost on the 16-row row, which keeps waves 0.25. The 16- and
    # 32-row tiles run half-height loops for tiles of at most half their rows (at 8 rows a 16-row tile with half
    # loops lost, so the 8-row tile stays). Every tensor-core row loads its weights through TMA (measured on an
    # H100: faster on every row, the same bits). With TMA the 8-row tensor-core tile also wins at 2 mean rows on
    # the small experts, not on Mixtral's nor at 1 mean row.
    "sm90": ((0.0, 0, GroupedPlan(block_m=1, block_n=32, block_k=512, num_warps=4, num_stages=2, tile_major=True)),
             (2.0, 0, GroupedPlan(block_m=8, block_n=64, block_k=128, num_warps=4, num_stages=3, kind="mma", tma=True,
                                  tile_major=True)),
             (2.0, 32 * 2**20, GroupedPlan(block_m=1, block_n=32, block_k=512, num_warps=4, num_stages=2,
                                           tile_major=True)),
             (4.0, 0, GroupedPlan(block_m=8, block_n=64, block_k=128, num_warps=4, num_stages=3, kind="mma", tma=True,
                                  tile_major=True)),
             (4.0, 32 * 2**20, GroupedPlan(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3,
                                           kind="mma", tma=True, tile_major=True, waves=2.0, half_tiles=True)),
             (8.0, 0, GroupedPlan(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3, kind="mma", tma=True,
                                  tile_major=True, half_tiles=True)),
             (16.0, 0, GroupedPlan(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=3, kind="mma", tma=True,
                                   tile_major=True, waves=2.0, half_tiles=True))),
    "interp": ((0.0, 0, GroupedPlan(block_m=4, block_n=32, block_k=256, num_warps=1, num_stages=1, waves=1.0,
                                    tile_major=True)),),
}
# Ampere/Ada have no TMA: the H200 rows with the weights loaded by the threads (the same bits), less the 2-row
# tensor-core rows, which won only through TMA (on the threads' loads the one-row tile was faster there).
GROUPED_TABLE["sm80"] = tuple((r, w, dataclasses.replace(p, tma=False)) for r, w, p in GROUPED_TABLE["sm90"]
                              if r != 2.0)
# MoE step: from how many mean rows per routed expert (L / min(E, L)) moe_decode_step takes the grouped path
# instead of the routed GEMVs, per generation: rows (smallest weights per expert projection H * I, mean rows), the
# first row that applies wins. On the H200 at 1 mean row the routed path (2 launches against 5) is faster on OLMoE
# and Qwen3; from 2 the grouped path won on all three models until the 64-wide routed down tiles made the routed
# path faster at 2 mean rows on the small models, while Mixtral's grouped path stays ahead there. With TMA the
# grouped path's 8-row tensor-core tile takes the small models' 2-row rows back (measured on an H100), so sm_90
# switches at 2 mean rows for every model again. One token is always 1 mean row (routed). The interpreter row
# exercises both.
MOE_GROUPED_FROM_MEAN_ROWS = {"sm90": ((0, 2.0),), "sm80": ((32 * 2**20, 2.0), (0, 3.0)), "interp": ((0, 2.0),)}
# Routed MoE step: the down GEMV is a programmatic dependent launch of the gate_up GEMV (its programs start
# during gate_up's tail, ask L2 for their first weight tiles, then wait; gemv_dp4a_kernel's PDL) for experts
# of fewer than this many weights per projection (H * I); 0 = never. On the H200, PDL off / on alternately: the
# small models' one-token step is faster with it, Mixtral's (58.7 M weights) slower in every pair (its 512 down
# programs each ask L2 for 4 tiles, 32 MB, while gate_up still streams).
# griddepcontrol is sm_90 PTX; the interpreter has no launches to overlap.
MOE_PDL_BELOW_WEIGHTS = {"sm90": 32 * 2**20, "sm80": 0, "interp": 0}
# Elementwise kernels (activation quantisation, SwiGLU, combine, reduce): columns per program.
ROW_BLOCK = {"sm90": 1024, "sm80": 1024, "interp": 256}


def generation(device) -> str:
    """'sm90' for Hopper and newer, 'sm80' for Ampere/Ada, 'interp' for the CPU interpreter."""
    device = torch.device(device)
    if device.type != "cuda":
        return "interp"
    major, _ = torch.cuda.get_device_capability(device)
    return "sm90" if major >= 9 else "sm80"


def num_sms(device) -> int:
    device = torch.device(device)
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_split_k(n_programs: int, k_tiles: int, sms: int, waves: float) -> int:
    """Smallest power-of-two split (<= 16, <= k_tiles) that gives >= waves * sms programs."""
    split = 1
    while split < MAX_SPLIT_K and split * 2 <= k_tiles and n_programs * split < waves * sms:
        split *= 2
    return split


def table_row(N: int, K: int, R: int, device) -> GemvPlan:
    """GEMV_TABLE's row for R rows times an N x K weight on `device`, block_k capped at the next power of
    two >= K."""
    for min_weights, min_rows, min_k_per_n, row in GEMV_TABLE[generation(device)]:
        if N * K >= min_weights and R >= min_rows and K >= min_k_per_n * N:
            return dataclasses.replace(row, block_k=max(128, min(row.block_k, 1 << (K - 1).bit_length())))
    raise AssertionError("every GEMV_TABLE ends with a row for N * K >= 0")


def gemv_plan(N: int, K: int, R: int, device, split_k: int | None = None, **override) -> GemvPlan:
    """The plan for an [R, K] x [N, K]^T GEMV on `device`: the table row with `override` fields applied,
    split-K from `split_k` or else the waves rule."""
    return _finish(dataclasses.replace(table_row(N, K, R, device), **override), N, K, R, device, split_k)


def resolve(plan: GemvPlan | None, N: int, K: int, R: int, device, split_k: int | None = None) -> GemvPlan:
    """A caller's plan (or the table row when None) with its split-K fixed: `split_k`, else the plan's,
    else the waves rule."""
    if plan is None:
        return gemv_plan(N, K, R, device, split_k)
    if not isinstance(plan, GemvPlan):
        raise TypeError(f"plan must be a GemvPlan or None, got {type(plan).__name__}")
    return _finish(plan, N, K, R, device, split_k if split_k is not None else plan.split_k)


def _finish(base: GemvPlan, N: int, K: int, R: int, device, split_k: int | None) -> GemvPlan:
    if base.block_k < 128 or base.block_k & (base.block_k - 1) or base.block_n < 1:
        raise ValueError(f"a GEMV plan needs block_k a power of two >= 128 and block_n >= 1, got {base}")
    k_tiles = -(-K // base.block_k)
    if split_k is None:
        n_programs = -(-N // base.block_n) * R
        split_k = choose_split_k(n_programs, k_tiles, num_sms(device), base.waves)
    if not isinstance(split_k, int) or isinstance(split_k, bool) or not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"split_k must be an int in [1, {MAX_SPLIT_K}], got {split_k!r}")
    return dataclasses.replace(base, split_k=split_k)


def grouped_plan(N: int, K: int, L: int, E: int, device, split_k: int | None = None, **override) -> GroupedPlan:
    """The grouped plan for L routed rows over E experts of N x K weights: the table row for the mean rows
    per routed expert L / min(E, L) and the weights per expert N * K, `override` fields applied (a row's
    half_tiles dropped where the override leaves no mma tile of 16 rows or more to halve, its tma where it leaves
    no tile a TMA box can load), split-K from
    `split_k` or the waves rule."""
    mean = L / max(1, min(E, L))
    row = None
    for min_mean, min_weights, p in GROUPED_TABLE[generation(device)]:
        if mean >= min_mean and N * K >= min_weights:
            row = p
    plan = dataclasses.replace(row, **override)
    if plan.half_tiles and "half_tiles" not in override and (plan.kind != "mma" or plan.block_m < 16):
        plan = dataclasses.replace(plan, half_tiles=False)   # an overridden tile too short or not mma to halve
    if plan.tma and "tma" not in override and (plan.kind != "mma" or plan.block_n > 256 or plan.block_k > 512):
        plan = dataclasses.replace(plan, tma=False)          # an overridden tile TMA cannot serve: threads' loads
    return resolve_grouped(plan, N, K, L, E, device, split_k)


def resolve_grouped(plan: GroupedPlan | None, N: int, K: int, L: int, E: int, device,
                    split_k: int | None = None) -> GroupedPlan:
    """A caller's grouped plan (or the table's when None) with block_k capped at K's power of two and
    split-K fixed: `split_k`, else the plan's, else enough programs for `waves` per SM over the tiles that
    the rows need at least (ceil(L / block_m))."""
    if plan is None:
        return grouped_plan(N, K, L, E, device, split_k)
    if not isinstance(plan, GroupedPlan):
        raise TypeError(f"plan must be a GroupedPlan or None, got {type(plan).__name__}")
    if plan.kind not in ("dp4a", "mma"):
        raise ValueError(f"plan.kind must be 'dp4a' or 'mma', got {plan.kind!r}")
    bm, bk = plan.block_m, plan.block_k
    if (bm < 1 or bm & (bm - 1) or (plan.kind == "mma" and bm < 4) or (plan.kind == "dp4a" and bm > 8)
            or plan.block_n < 1):
        raise ValueError(f"a grouped plan needs block_m a power of two (>= 4 for mma, <= 8 for dp4a: rows "
                         f"unrolled per program) and block_n >= 1, got {plan}")
    if not isinstance(plan.half_tiles, bool) or (plan.half_tiles and (plan.kind != "mma" or bm < 16)):
        raise ValueError(f"plan.half_tiles is a bool, True only for an mma plan of block_m >= 16, got {plan}")
    if not isinstance(plan.tma, bool) or (plan.tma and (plan.kind != "mma" or plan.block_n > 256 or bk > 512)):
        raise ValueError(f"plan.tma is a bool, True only for an mma plan with block_n <= 256 and block_k <= 512 (a "
                         f"TMA box is at most 256 rows of 256 bytes), got {plan}")
    min_bk = 128 if plan.kind == "dp4a" else 32
    if bk < min_bk or bk & (bk - 1):
        raise ValueError(f"a {plan.kind} grouped plan needs block_k a power of two >= {min_bk}, got {plan}")
    plan = dataclasses.replace(plan, block_k=max(min_bk, min(bk, 1 << (K - 1).bit_length())))
    k_steps = -(-K // plan.block_k)
    split_k = split_k if split_k is not None else plan.split_k
    if split_k is None:
        n_programs = -(-N // plan.block_n) * max(1, -(-L // bm))
        split_k = choose_split_k(n_programs, k_steps, num_sms(device), plan.waves)
    if not isinstance(split_k, int) or isinstance(split_k, bool) or not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"split_k must be an int in [1, {MAX_SPLIT_K}], got {split_k!r}")
    return dataclasses.replace(plan, split_k=split_k)


def grouped_from_mean_rows(weights_per_expert: int, device) -> float:
    """The mean rows per routed expert from which moe_decode_step takes the grouped path, for experts of
    `weights_per_expert` (H * I) weights per projection: MOE_GROUPED_FROM_MEAN_ROWS' first row that applies."""
    return next(t for w, t in MOE_GROUPED_FROM_MEAN_ROWS[generation(device)] if weights_per_expert >= w)


def moe_grouped(tokens: int, top_k: int, experts: int, device, weights_per_expert: int = 0) -> bool:
    """Whether moe_decode_step takes the grouped path: mean rows per routed expert, tokens * top_k /
    min(experts, tokens * top_k), at least grouped_from_mean_rows(weights_per_expert) of the generation."""
    L = tokens * top_k
    return L > 0 and L / min(experts, L) >= grouped_from_mean_rows(weights_per_expert, device)


def moe_pdl(device, weights_per_expert: int) -> bool:
    """Whether moe_decode_routed launches its down GEMV as a programmatic dependent of gate_up, for experts of
    `weights_per_expert` (H * I) weights per projection: below MOE_PDL_BELOW_WEIGHTS of the generation."""
    return weights_per_expert < MOE_PDL_BELOW_WEIGHTS[generation(device)]


def row_block(device) -> int:
    return ROW_BLOCK[generation(device)]
