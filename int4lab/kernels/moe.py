"""One MoE decode step on int4-b32 experts, built only from this package's kernels.

Shape legend: T = tokens, A = experts per token (top-k), L = T * A routed rows, E = experts,
H = hidden size, I = expert intermediate size.

Two paths, one contract (moe_decode_ref), chosen by moe_decode_step from (tokens, top-k, E, generation)
through plan.moe_grouped, so the choice never depends on the routing and the call stays capture-legal:

  routed (moe_decode_routed, 2 launches, the second a programmatic dependent of the first on sm_90 for
  experts of under 32 M weights per projection; up to a few rows per routed expert):
    x [T, H] --gate_up GEMV, x quantised in its prologue (all L rows)--> h [L, 2I] bf16
      --down GEMV, SwiGLU + quantisation of h in its prologue, rows rounded to bf16 and combined with the
        router weights (float32, fixed order) by the last-arriving program--> out [T, H] bf16
    Every routed row reads its expert's bytes; with several tokens the grid runs every row of one N range at
    once (row-major), so rows of one expert share its bytes through L2.

  grouped (moe_decode_grouped, 5 launches; many rows per routed expert):
    build_group_tiles (rows sorted by expert, tiles of block_m rows) ; quant_x_rows(x) ;
    gate_up over the tiles (each tile reads its expert once for all its rows) -> h [L, 2I] ;
    swiglu_quant_rows(h) ; down over the tiles + the same combine in its epilogue -> out [T, H]
    Quantisation of x and of SwiGLU(h) is a launch of its own here: a tile of several rows would
    otherwise quantise each row once per N tile, more work than the dot itself.

gate_up is the fused [E, 2I, H] projection with the I gate rows first, then the I up rows. Both paths use
the codes of quant_x_rows / swiglu_quant_rows and round each row to bf16 before the combine, and with
the same block_k and split-K they give the same bits (the fold of epilogue.fold_blocks).
Bytes: the routed experts' gate_up and down weights at 0.5625 bytes per weight dominate; e.g. OLMoE
(H 2048, I 1024, A 8): 8 * 3 * 2048 * 1024 * 0.5625 = 28.3 MB for one token.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import (FLOAT_DTYPES, check_contiguous, check_devices, check_ids, check_out, check_packed,
                       check_shape, check_tensor)
from . import plan as _plan
from .epilogue import to_bf16_rne
from .gemv import X_FLOAT, X_SWIGLU
from .grouped import build_group_tiles, gemm_int4_b32_grouped
from .launch import launch_gemv
from .quant import quant_x_rows, swiglu_quant_rows


@triton.jit
def combine_rows_kernel(
    # Pointers
    y_ptr, w_ptr, map_ptr, out_ptr,
    # Dimensions
    H,
    # Meta-parameters
    TOPK: tl.constexpr, HAS_MAP: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[t, :] = sum_{j < TOPK} w[t, j] * y[map[t*TOPK + j], :] in float32, j in order; one program
    owns BLOCK columns of one token. y [L, H] bf16, w [T, TOPK] float, map int32 [L] (or identity)."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, TOPK):
        i = t * TOPK + j
        if HAS_MAP:
            i = tl.load(map_ptr + i)
        wt = tl.load(w_ptr + t * TOPK + j).to(tl.float32)
        acc += wt * tl.load(y_ptr + i.to(tl.int64) * H + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + offs, to_bf16_rne(acc), mask=mask)


def combine_rows(y, topk_w, row_map=None, out=None):
    """y bf16 [T*A, H], topk_w float [T, A] -> bf16 [T, H], float32 weighted sum over the A rows of each
    token (row t*A + j, or row_map[t*A + j] when given), always in the order j = 0..A-1."""
    check_tensor("y", y, FLOAT_DTYPES, (2,))
    check_tensor("topk_w", topk_w, FLOAT_DTYPES, (2,))
    T, A = topk_w.shape
    H = y.shape[1]
    check_shape("y", y, (T * A, H))
    if row_map is not None:
        check_tensor("row_map", row_map, (torch.int32, torch.int64), (1,))
        check_shape("row_map", row_map, (T * A,))
    check_contiguous(y=y, topk_w=topk_w, row_map=row_map)
    dev = check_devices(y=y, topk_w=topk_w, row_map=row_map, out=out)
    out = check_out("out", out, (T, H), torch.bfloat16, dev)
    blk = _plan.row_block(dev)
    if T:
        combine_rows_kernel[(T, triton.cdiv(H, blk))](
            y, topk_w, row_map if row_map is not None else y, out, H,
            TOPK=A, HAS_MAP=row_map is not None, BLOCK=blk)
    return out


def _check_moe(x, topk_ids, topk_w, gu_p, gu_s, dn_p, dn_s):
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    check_tensor("topk_ids", topk_ids, (torch.int32, torch.int64), (2,))
    check_tensor("topk_w", topk_w, FLOAT_DTYPES, (2,))
    check_tensor("gate_up_packed", gu_p, (torch.uint8,), (3,))
    check_tensor("down_packed", dn_p, (torch.uint8,), (3,))
    T, H = x.shape
    if T < 1:
        raise ValueError(f"x must hold at least one token (T >= 1), got shape {tuple(x.shape)}")
    if topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must route each token to at least one expert (A >= 1), got shape "
                         f"{tuple(topk_ids.shape)}")
    E, two_i = gu_p.shape[0], gu_p.shape[1]
    if two_i % 2:
        raise ValueError(f"gate_up_packed must have an even row count 2I (gate rows, then up rows), got {two_i}")
    I = two_i // 2
    check_packed(gu_p, gu_s, 2 * I, H, names=("gate_up_packed", "gate_up_scales"))
    check_packed(dn_p, dn_s, H, I, names=("down_packed", "down_scales"))
    if dn_p.shape[0] != E:
        raise ValueError(f"down_packed must have E = {E} experts like gate_up_packed, got {dn_p.shape[0]}")
    if topk_ids.shape[0] != T:
        raise ValueError(f"topk_ids must have shape (T, A) with T = {T}, got {tuple(topk_ids.shape)}")
    check_shape("topk_w", topk_w, topk_ids.shape)
    check_contiguous(x=x, topk_ids=topk_ids, topk_w=topk_w, gate_up_packed=gu_p, gate_up_scales=gu_s,
                     down_packed=dn_p, down_scales=dn_s)
    check_devices(x=x, topk_ids=topk_ids, topk_w=topk_w, gate_up_packed=gu_p, gate_up_scales=gu_s,
                  down_packed=dn_p, down_scales=dn_s)
    check_ids("topk_ids", topk_ids, E)
    return T, H, I, E


def moe_decode_step(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales):
    """MoE FFN for T tokens: x [T, H] float -> bf16 [T, H], through the routed or the grouped path (module
    doc; plan.moe_grouped decides from the mean rows per routed expert, the experts' size and the GPU
    generation).

    topk_ids int [T, A] in [0, E) with T, A >= 1, topk_w float [T, A] (router weights, applied in float32;
    any real weight, 0, negative or above 1, is applied as given; NaN or inf make the row NaN or inf);
    gate_up_packed uint8 [E, 2I, H/2] + float16 scales [E, 2I, H/32] (gate rows first);
    down_packed uint8 [E, H, I/2] + float16 scales [E, H, I/32].
    """
    T, H, I, E = _check_moe(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales)
    grouped = _plan.moe_grouped(T, topk_ids.shape[1], E, x.device, H * I)
    path = moe_decode_grouped if grouped else moe_decode_routed
    return path(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales)


def moe_decode_routed(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales,
                      *, split_k=None, plan=None, pdl=None):
    """moe_decode_step's contract through two routed GEMVs (module doc). `split_k` applies to both GEMVs
    (None: the launch plan's choice per shape); `plan` (a GemvPlan) overrides the table row; `pdl` (None:
    plan.moe_pdl: experts below a size) launches down as a programmatic dependent of gate_up (same bits)."""
    T, H, I, E = _check_moe(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales)
    A = topk_ids.shape[1]
    L = T * A
    eids = topk_ids.reshape(-1)
    dev = x.device
    # Several tokens: their rows share experts, so every row of one N range runs at once (row-major grid) and
    # an expert's bytes come from DRAM about once. One token: each row has its own expert; N tiles first.
    rm = T > 1
    pdl = _plan.moe_pdl(dev, H * I) if pdl is None else bool(pdl)
    # gate_up: row r = t*A + j reads token t (r // A), quantised in the GEMV's prologue.
    h = launch_gemv(x, None, gate_up_packed, gate_up_scales, eids, 2 * I, H, L, x_mode=X_FLOAT, rows_per_x=A,
                    split_k=split_k, plan=plan, pdl=1 if pdl else 0, row_major=rm)
    # down: SwiGLU + quantisation of h in the prologue; the combine in the last-arriving program's epilogue.
    return launch_gemv(h, None, down_packed, down_scales, eids, H, I, L, x_mode=X_SWIGLU, topk_w=topk_w,
                       split_k=split_k, plan=plan, pdl=2 if pdl else 0, row_major=rm)


def moe_decode_grouped(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales,
                       *, plan=None, split_k=None):
    """moe_decode_step's contract through the grouped kernels (module doc). `plan` (a GroupedPlan, or a
    (gate_up, down) pair of them; the two must share block_m, the tiles' height) and `split_k` apply to both
    projections (None: the table's choice per shape)."""
    T, H, I, E = _check_moe(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales)
    A = topk_ids.shape[1]
    L = T * A
    dev = x.device
    plan_gu, plan_dn = plan if isinstance(plan, tuple) and len(plan) == 2 else (plan, plan)
    p_gu = _plan.resolve_grouped(plan_gu, 2 * I, H, L, E, dev, split_k)
    p_dn = _plan.resolve_grouped(plan_dn, H, I, L, E, dev, split_k)
    tiles = build_group_tiles(topk_ids, E, p_gu.block_m)
    xq, xs = quant_x_rows(x)
    h = gemm_int4_b32_grouped(xq, xs, gate_up_packed, gate_up_scales, tiles, rows_per_x=A, plan=p_gu)
    aq, as_ = swiglu_quant_rows(h)
    return gemm_int4_b32_grouped(aq, as_, down_packed, down_scales, tiles, topk_w=topk_w, plan=p_dn)


def moe_decode_ref(x, topk_ids, topk_w, gate_up_packed, gate_up_scales, down_packed, down_scales):
    """CPU reference with the kernels' quantisation points and bf16 roundings, float64 sums: [T, H] float32."""
    from ..format import dequant_int4_ref, quant_x_rows_ref
    from .quant import swiglu_quant_rows_ref
    x, ids, tw = x.cpu(), topk_ids.cpu().long(), topk_w.cpu().double()
    H, I = x.shape[1], gate_up_packed.shape[1] // 2
    gu = dequant_int4_ref(gate_up_packed.cpu(), gate_up_scales.cpu(), 2 * I, H).double()
    dn = dequant_int4_ref(down_packed.cpu(), down_scales.cpu(), H, I).double()

    def deq_rows(q, s):
        return (q.double().reshape(q.shape[0], -1, 32) * s.double()[..., None]).reshape(q.shape[0], -1)

    xq, xs = quant_x_rows_ref(x)
    xd = deq_rows(xq, xs)
    out = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = (gu[e] @ xd[t]).float().bfloat16()[None]                      # [1, 2I] as the kernel rounds
            aq, as_ = swiglu_quant_rows_ref(h)
            y = (dn[e] @ deq_rows(aq, as_)[0]).float().bfloat16().double()
            out[t] += tw[t, j] * y
    return out.float()
