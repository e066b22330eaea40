"""The MoE router of a decode step in one launch: router GEMV, softmax, top-k, renormalisation.

Shape legend: T = tokens, H = hidden size, E = experts, A = experts per token (top-k).

Why: transformers' routers (Mixtral, OLMoE, Qwen3-MoE) are a GEMV then five to eight small kernels (cast,
softmax, top-k, sum, divide, cast); at batch 1 their launches cost several times the router's bytes.

Contract (x [T, H] and the router weight [E, H] of one float dtype):
    logits  = round_dtype(sum_h x[t, h] * W[e, h])      float32 products and sum (not cuBLAS's order), rounded
                                                        to the dtype as F.linear returns them -> [T, E]
    p       = softmax(logits) in float32                 exp is the GPU's libdevice expf (torch's), IEEE division
    ids     = the A largest p, largest first; equal p: the lower expert first -> int64 [T, A]
    weights = p[ids], divided by their float32 sum when `renorm` -> [T, A] in `weights_dtype`
So it is the router's math up to the order of the float32 sums; tests/lib/test_fused.py checks each rounding
against a float64 reference computed from the kernel's own logits.

Grid (T, E tiles): each program computes BLOCK_E logits of one token, then counts its arrival; the last of a
token's programs reads the E logits back (from L2) and does the softmax and top-k, then resets the counter
(zero before and after every launch, as the GEMVs' split-K finish: a captured graph replays with no memset).
Bytes per call: E*H weights in the dtype + T*H activations; at batch 1 about one weight read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .._checks import FLOAT_DTYPES, check_rows_and_weight, check_tensor, interpreting
from .norm import OUT_BF16, _OUT, round_to
from .epilogue import to_bf16_rne


@triton.jit
def router_topk_kernel(
    # Pointers
    x_ptr, w_ptr, logits_ptr, wts_ptr, ids_ptr, cnt_ptr,
    # Dimensions (H and E are a model's constants: compiled in)
    stride_x, H: tl.constexpr, E: tl.constexpr,
    # Meta-parameters
    TOPK: tl.constexpr, KP: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    EP: tl.constexpr, E_TILES: tl.constexpr, LOGITS: tl.constexpr, WTS: tl.constexpr, USE_LIBDEVICE: tl.constexpr,
):
    """Program (t, j): logits[t, j*BLOCK_E : (j+1)*BLOCK_E]; the last program of token t to arrive also writes
    ids[t, :] and wts[t, :] (module doc). EP >= E and KP >= TOPK are powers of two; cnt int32 [T], zero."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    offs_e = j * BLOCK_E + tl.arange(0, BLOCK_E)
    e_mask = offs_e < E
    acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        h_mask = offs_h < H
        xv = tl.load(x_ptr + t * stride_x + offs_h, mask=h_mask, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + offs_e[:, None].to(tl.int64) * H + offs_h[None, :],
                     mask=e_mask[:, None] & h_mask[None, :], other=0.0).to(tl.float32)
        acc += wv * xv[None, :]
    logit = round_to(tl.sum(acc, axis=1), LOGITS)
    if LOGITS == OUT_BF16:
        tl.store(logits_ptr + t * E + offs_e, to_bf16_rne(logit), mask=e_mask)
    else:
        tl.store(logits_ptr + t * E + offs_e, logit.to(logits_ptr.dtype.element_ty), mask=e_mask)
    last = True
    if E_TILES > 1:
        tl.debug_barrier()                      # every thread's logits are stored before the release below
        seen = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
        last = seen == E_TILES - 1
    if last:
        offs = tl.arange(0, EP)
        m = offs < E
        # .cg: the other programs' logits, from L2 (never an out-of-date L1 line)
        lg = tl.load(logits_ptr + t * E + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
        lg = tl.where(m, lg, -float("inf"))
        z = lg - tl.max(lg, axis=0)
        if USE_LIBDEVICE:
            ez = libdevice.exp(z)
        else:
            ez = tl.exp(z)
        ez = tl.where(m, ez, 0.0)
        p = tl.math.div_rn(ez, tl.full(ez.shape, 1.0, tl.float32) * tl.sum(ez, axis=0))
        p = tl.where(m, p, -1.0)                # padding never wins
        slot = tl.arange(0, KP)
        vals = tl.zeros([KP], dtype=tl.float32)
        idxs = tl.zeros([KP], dtype=tl.int64)
        for k in tl.static_range(TOPK):
            i = tl.argmax(p, axis=0, tie_break_left=True)    # the largest; equal values: the lower expert
            v = tl.max(p, axis=0)
            vals = tl.where(slot == k, v, vals)
            idxs = tl.where(slot == k, i.to(tl.int64), idxs)
            p = tl.where(offs == i, -1.0, p)
        if RENORM:
            vals = tl.math.div_rn(vals, tl.full(vals.shape, 1.0, tl.float32) * tl.sum(vals, axis=0))
        kmask = slot < TOPK
        tl.store(ids_ptr + t * TOPK + slot, idxs, mask=kmask)
        if WTS == OUT_BF16:
            tl.store(wts_ptr + t * TOPK + slot, to_bf16_rne(vals), mask=kmask)
        else:
            tl.store(wts_ptr + t * TOPK + slot, round_to(vals, WTS).to(wts_ptr.dtype.element_ty), mask=kmask)
        if E_TILES > 1:
            tl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed")   # ready for the next launch (graph replay)


def check_router(x, weight, top_k, renorm, weights_dtype):
    check_tensor("weight", weight, FLOAT_DTYPES, (2,))
    check_rows_and_weight(x, weight, "(E, H)")
    E = weight.shape[0]
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= E:
        raise ValueError(f"top_k must be an int in [1, E = {E}], got {top_k!r}")
    if not isinstance(renorm, bool):
        raise TypeError(f"renorm must be a bool, got {type(renorm).__name__}")
    if weights_dtype not in FLOAT_DTYPES:
        raise TypeError(f"weights_dtype must be one of {FLOAT_DTYPES}, got {weights_dtype!r}")


def router_blocks(E: int, H: int) -> tuple[int, int]:
    """(BLOCK_E, BLOCK_H): 4 experts per program (OLMoE 16 programs a token, Qwen3 32, Mixtral 2), a 4096-element
    tile of the weight per loop step."""
    be = min(4, triton.next_power_of_2(E))
    return be, min(triton.next_power_of_2(H), 4096 // be)


def run_router(x, weight, top_k, renorm, logits, wts, ids):
    """The launch alone (arguments checked by the caller); logits [T, E] in x's dtype, wts [T, A], ids int64 [T, A]."""
    from .launch import workspace
    T, H = x.shape
    E = weight.shape[0]
    if T == 0:
        return logits, wts, ids
    be, bh = router_blocks(E, H)
    e_tiles = triton.cdiv(E, be)
    _, cnt = workspace(x.device, 0, T)
    router_topk_kernel[(T, e_tiles)](
        x, weight, logits, wts, ids, cnt, x.stride(0), H=H, E=E, TOPK=top_k, KP=triton.next_power_of_2(top_k),
        RENORM=renorm, BLOCK_E=be, BLOCK_H=bh, EP=triton.next_power_of_2(E), E_TILES=e_tiles, LOGITS=_OUT[x.dtype],
        WTS=_OUT[wts.dtype], USE_LIBDEVICE=not interpreting(), num_warps=4)
    return logits, wts, ids


def router_topk(x: torch.Tensor, weight: torch.Tensor, top_k: int, renorm: bool,
                weights_dtype: torch.dtype | None = None):
    """(logits [T, E] in x's dtype, weights [T, top_k] in weights_dtype (default x's), ids int64 [T, top_k]) of
    the router weight [E, H] for x [T, H], one launch (module doc)."""
    weights_dtype = weights_dtype or x.dtype
    check_router(x, weight, top_k, renorm, weights_dtype)
    T, E = x.shape[0], weight.shape[0]
    dev = x.device
    return run_router(x, weight, top_k, renorm, torch.empty(T, E, dtype=x.dtype, device=dev),
                      torch.empty(T, top_k, dtype=weights_dtype, device=dev),
                      torch.empty(T, top_k, dtype=torch.int64, device=dev))


def router_topk_ref(logits: torch.Tensor, top_k: int, renorm: bool, weights_dtype: torch.dtype):
    """From given logits [T, E]: float64 softmax, top-k (equal values: the lower expert), renormalised in float64
    when renorm, rounded to weights_dtype -> (weights [T, top_k], ids int64 [T, top_k]) (CPU)."""
    p = torch.softmax(logits.cpu().double(), -1)
    ids = torch.sort(-p, dim=-1, stable=True).indices[..., :top_k]    # a tie goes to the lower index
    v = p.gather(-1, ids)
    if renorm:
        v = v / v.sum(-1, keepdim=True)
    return v.to(weights_dtype), ids
