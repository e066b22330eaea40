"""The quantised modules' entry to the kernels: checked once, plans cached, no device sync, one custom op each.

Shape legend: R = rows, N = out features, K = in features, T = tokens, A = experts per token (top-k),
L = T * A routed rows, E = experts, H = hidden size, I = expert intermediate size.

    linear(x, packed, scales, act)              x [R, K] -> bf16 [R, N]          op int4lab::linear
    moe(x, ids, w, gu_p, gu_s, dn_p, dn_s)       x [T, H] -> bf16 [T, H]          op int4lab::moe
    rms_norm(x, weight, eps)                     x [R, N] -> [R, N]               op int4lab::rms_norm
    add_rms_norm(x, res, weight, eps)            x, res [R, N] -> (res + x, norm) op int4lab::add_rms_norm
    router(x, weight, top_k, renorm, dtype)      x [T, H] -> logits, weights, ids op int4lab::router
    decode_attention(q, k, v, cos, sin, caches, length, ...) -> bf16 [B, HQ*D]   op int4lab::decode_attention
                                                 (mutates the caches and the length: attention.py)

Why a second entry beside the public launchers (gemv.int4_linear, moe.moe_decode_step): an eager decode step
is host-bound, and the public launchers check every tensor on every call, resolve their launch plan (twice
for an MoE step) and read the expert ids back to range-check them, a device sync that stalls the queue once
per MoE layer. Here:
  * checks: the public launchers' own checks run on the first call with a given argument signature
    (shapes, strides, dtypes, devices of every tensor) and never again for it; the ids' range is never read
    back (`_checks.ids_unread`): an id outside [0, E) gives a NaN row, the kernels' guard, as under capture;
  * plans: resolved once per (shape, device) and kept; plan.py's table is a pure function of them, so the
    bits are those of the public launchers (tests/lib/test_ops.py);
  * torch.compile: each entry is a `torch.library.custom_op` with a fake implementation (shapes and dtypes
    only), so dynamo sees one opaque op per call and inductor fuses the glue around it. Eager calls skip the
    dispatcher round trip and run the implementation directly (same function, same bits).
"""
from __future__ import annotations

import torch

from .._checks import ids_unread
from . import grouped as _grouped
from . import plan as _plan
from .gemv import MAX_GRID_ROWS, check_linear
from .gemv_dp4a import X_FLOAT, X_SWIGLU
from .launch import run_gemv, run_grouped, run_quant_rows, run_w4a16
from .attention import check_decode_attention, run_decode_attention
from .norm import check_rms_norm, run_add_rms_norm, run_rms_norm
from .router import check_router, run_router

__all__ = ["linear", "moe", "rms_norm", "add_rms_norm", "router", "decode_attention", "signature", "clear_caches"]

_PREPARED: dict = {}        # signature -> what the first call with it resolved (plans, flags)


def signature(name: str, *tensors, extra=()) -> tuple:
    """What a prepared call depends on: the entry, every tensor's shape, strides, dtype and device, extras."""
    return (name, extra) + tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)


def clear_caches() -> None:
    """Forget every prepared call (plans are re-resolved and arguments re-checked on the next call)."""
    _PREPARED.clear()


# ------------------------------------------------------------------------------------------ dense linear

def _prepare_linear(x, packed, scales, act):
    check_linear(x, packed, scales, act)                    # raises on a bad argument, like int4_linear
    if x.dim() != 2:
        raise ValueError(f"x must have shape (R, K), got {tuple(x.shape)}")
    R, K = x.shape
    N = packed.shape[-2]
    return [_plan.resolve(None, N, K, min(R - r0, MAX_GRID_ROWS), x.device) for r0 in range(0, R, MAX_GRID_ROWS)]


def _linear_impl(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, act: str) -> torch.Tensor:
    key = signature("linear", x, packed, scales, extra=act)
    plans = _PREPARED.get(key)
    if plans is None:
        plans = _PREPARED[key] = _prepare_linear(x, packed, scales, act)
    R, K = x.shape
    N = packed.shape[-2]
    out = torch.empty(R, N, dtype=torch.bfloat16, device=x.device)
    for i, p in enumerate(plans):                           # one chunk unless rows exceed the grid's limit
        r0 = i * MAX_GRID_ROWS
        xc, oc = (x, out) if len(plans) == 1 else (x[r0:r0 + MAX_GRID_ROWS], out[r0:r0 + MAX_GRID_ROWS])
        if act == "int8":
            run_gemv(p, xc, None, packed, scales, None, N, K, xc.shape[0], oc, x_mode=X_FLOAT)
        else:
            run_w4a16(xc, packed, scales, oc)
    return out


@torch.library.custom_op("int4lab::linear", mutates_args=())
def linear_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, act: str) -> torch.Tensor:
    """int4_linear as one opaque op: x [R, K] float, packed uint8 [N, K/2], scales float16 [N, K/32] -> bf16 [R, N]."""
    return _linear_impl(x, packed, scales, act)


@linear_op.register_fake
def _(x, packed, scales, act):
    return x.new_empty((x.shape[0], packed.shape[-2]), dtype=torch.bfloat16)


def linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, act: str = "int8") -> torch.Tensor:
    """bf16 [R, N] = x [R, K] @ W^T, W int4-b32 (packed [N, K/2] or [1, N, K/2]); int4_linear's numerics."""
    if torch.compiler.is_compiling():
        return linear_op(x, packed, scales, act)
    return _linear_impl(x, packed, scales, act)


# ------------------------------------------------------------------------------------------ MoE step

def _prepare_moe(x, ids, w, gu_p, gu_s, dn_p, dn_s):
    """moe.moe_decode_step's checks (less the ids' range) and its path and plans for these shapes."""
    from .moe import _check_moe
    with ids_unread():
        T, H, I, E = _check_moe(x, ids, w, gu_p, gu_s, dn_p, dn_s)
    A = ids.shape[1]
    L, dev = T * A, x.device
    if _plan.moe_grouped(T, A, E, dev, H * I):
        p_gu = _plan.grouped_plan(2 * I, H, L, E, dev)
        p_dn = _plan.resolve_grouped(None, H, I, L, E, dev)
        if p_dn.block_m != p_gu.block_m:         # moe_decode_grouped raises the same
            raise ValueError(f"the grouped plans of gate_up and down must share block_m, got {p_gu} and {p_dn}")
        return ("grouped", p_gu, p_dn)
    pdl = _plan.moe_pdl(dev, H * I)
    return ("routed", _plan.resolve(None, 2 * I, H, L, dev), _plan.resolve(None, H, I, L, dev), pdl)


def _moe_rows(x, ids, w, gu_p, gu_s, dn_p, dn_s):
    """One call's worth of tokens (at most MAX_ROUTED_ROWS routed rows): moe_decode_step's bits."""
    key = signature("moe", x, ids, w, gu_p, gu_s, dn_p, dn_s)
    prep = _PREPARED.get(key)
    if prep is None:
        prep = _PREPARED[key] = _prepare_moe(x, ids, w, gu_p, gu_s, dn_p, dn_s)
    T, H = x.shape
    A = ids.shape[1]
    L, I, dev = T * A, dn_p.shape[-1] * 2, x.device
    out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    h = torch.empty(L, 2 * I, dtype=torch.bfloat16, device=dev)
    if L == 0:
        return out.zero_()                      # no routed slot: the sum over none
    if prep[0] == "routed":
        _, p_gu, p_dn, pdl = prep
        eids, rm = ids.view(-1), T > 1          # moe_decode_routed: row-major grid for several tokens
        run_gemv(p_gu, x, None, gu_p, gu_s, eids, 2 * I, H, L, h, x_mode=X_FLOAT, rows_per_x=A,
                 pdl=1 if pdl else 0, row_major=rm)
        return run_gemv(p_dn, h, None, dn_p, dn_s, eids, H, I, L, out, x_mode=X_SWIGLU, topk_w=w,
                        pdl=2 if pdl else 0, row_major=rm)
    _, p_gu, p_dn = prep
    tiles = _grouped.route_tiles(ids.view(-1), gu_p.shape[0], p_gu.block_m)
    q = torch.empty(T * H + L * I, dtype=torch.int8, device=dev)           # x's codes, then SwiGLU(h)'s
    s = torch.empty((T * H + L * I) // 32, dtype=torch.float32, device=dev)
    xq, xs = run_quant_rows(x, H, q[:T * H].view(T, H), s[:T * H // 32].view(T, H // 32))
    run_grouped(p_gu, xq, xs, gu_p, gu_s, tiles, h, rows_per_x=A)
    aq, as_ = run_quant_rows(h, I, q[T * H:].view(L, I), s[T * H // 32:].view(L, I // 32), swiglu=True)
    return run_grouped(p_dn, aq, as_, dn_p, dn_s, tiles, out, topk_w=w)


def _moe_impl(x, ids, w, gu_p, gu_s, dn_p, dn_s):
    # More routed rows than one routing program sorts (a scoring forward): chunks of whole tokens, each token's
    # rows independent, so the result is that of one call.
    step = max(1, _grouped.MAX_ROUTED_ROWS // max(1, ids.shape[-1]))
    if x.shape[0] <= step:
        return _moe_rows(x, ids, w, gu_p, gu_s, dn_p, dn_s)
    return torch.cat([_moe_rows(x[i:i + step], ids[i:i + step], w[i:i + step], gu_p, gu_s, dn_p, dn_s)
                      for i in range(0, x.shape[0], step)])


@torch.library.custom_op("int4lab::moe", mutates_args=())
def moe_op(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, gu_p: torch.Tensor, gu_s: torch.Tensor,
           dn_p: torch.Tensor, dn_s: torch.Tensor) -> torch.Tensor:
    """moe_decode_step as one opaque op (arguments in its order) -> bf16 [T, H]."""
    return _moe_impl(x, ids, w, gu_p, gu_s, dn_p, dn_s)


@moe_op.register_fake
def _(x, ids, w, gu_p, gu_s, dn_p, dn_s):
    return x.new_empty((x.shape[0], dn_p.shape[-2]), dtype=torch.bfloat16)


def moe(x, ids, w, gate_up_packed, gate_up_scales, down_packed, down_scales) -> torch.Tensor:
    """moe_decode_step's contract and bits for contiguous x [T, H], ids int [T, A], w float [T, A] (any number
    of tokens: chunked past MAX_ROUTED_ROWS routed rows); ids are not range-checked (module doc)."""
    if torch.compiler.is_compiling():
        return moe_op(x, ids, w, gate_up_packed, gate_up_scales, down_packed, down_scales)
    return _moe_impl(x, ids, w, gate_up_packed, gate_up_scales, down_packed, down_scales)


# ------------------------------------------------------------------------------------------ norm and router

def _rms_norm_impl(x, weight, eps):
    key = signature("rms_norm", x, weight)
    if key not in _PREPARED:
        check_rms_norm(x, weight, eps)
        _PREPARED[key] = True
    return run_rms_norm(x, weight, eps, torch.empty(x.shape, dtype=x.dtype, device=x.device))


@torch.library.custom_op("int4lab::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """norm.rms_norm as one opaque op: x [R, N], weight [N] -> [R, N] in x's dtype."""
    return _rms_norm_impl(x, weight, eps)


@rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [R, N] (norm.py's contract), checked once per signature."""
    if torch.compiler.is_compiling():
        return rms_norm_op(x, weight, eps)
    return _rms_norm_impl(x, weight, eps)


def _add_rms_norm_impl(x, res, weight, eps):
    key = signature("add_rms_norm", x, res, weight)
    if key not in _PREPARED:
        check_rms_norm(x, weight, eps)
        if res.shape != x.shape or res.dtype != x.dtype or res.device != x.device or res.stride(-1) != 1:
            raise ValueError(f"res must be like x {tuple(x.shape)} {x.dtype} with a dense last dim, got "
                             f"{tuple(res.shape)} {res.dtype} strides {res.stride()}")
        _PREPARED[key] = True
    return run_add_rms_norm(x, res, weight, eps, torch.empty(x.shape, dtype=x.dtype, device=x.device),
                            torch.empty(x.shape, dtype=x.dtype, device=x.device))


@torch.library.custom_op("int4lab::add_rms_norm", mutates_args=())
def add_rms_norm_op(x: torch.Tensor, res: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """norm.add_rms_norm_kernel as one opaque op: x, res [R, N] -> (res + x, RMSNorm of it), x's dtype."""
    return _add_rms_norm_impl(x, res, weight, eps)


@add_rms_norm_op.register_fake
def _(x, res, weight, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


def add_rms_norm(x: torch.Tensor, res: torch.Tensor, weight: torch.Tensor, eps: float):
    """(s, y): s = res + x rounded to the dtype (a decoder layer's residual add), y = RMSNorm of s; one launch."""
    if torch.compiler.is_compiling():
        return add_rms_norm_op(x, res, weight, eps)
    return _add_rms_norm_impl(x, res, weight, eps)


def _router_impl(x, weight, top_k, renorm, weights_dtype):
    key = signature("router", x, weight, extra=(top_k, renorm, weights_dtype))
    if key not in _PREPARED:
        check_router(x, weight, top_k, renorm, weights_dtype)
        _PREPARED[key] = True
    T, E, dev = x.shape[0], weight.shape[0], x.device
    return run_router(x, weight, top_k, renorm, torch.empty(T, E, dtype=x.dtype, device=dev),
                      torch.empty(T, top_k, dtype=weights_dtype, device=dev),
                      torch.empty(T, top_k, dtype=torch.int64, device=dev))


@torch.library.custom_op("int4lab::router", mutates_args=())
def router_op(x: torch.Tensor, weight: torch.Tensor, top_k: int, renorm: bool,
              weights_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """router.router_topk as one opaque op -> (logits [T, E], weights [T, top_k], ids int64 [T, top_k])."""
    return _router_impl(x, weight, top_k, renorm, weights_dtype)


@router_op.register_fake
def _(x, weight, top_k, renorm, weights_dtype):
    T, E = x.shape[0], weight.shape[0]
    return (x.new_empty((T, E)), x.new_empty((T, top_k), dtype=weights_dtype),
            x.new_empty((T, top_k), dtype=torch.int64))


def router(x, weight, top_k: int, renorm: bool, weights_dtype: torch.dtype):
    """router_topk's contract (router.py), checked once per signature."""
    if torch.compiler.is_compiling():
        return router_op(x, weight, top_k, renorm, weights_dtype)
    return _router_impl(x, weight, top_k, renorm, weights_dtype)


# ------------------------------------------------------------------------------------------ decode attention

def _decode_attention_impl(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k,
                           scaling, mask):
    key = signature("decode_attention", *(t for t in (q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm,
                                                       mask) if t is not None), extra=(norm, q_norm is None,
                                                                                      mask is None))
    if key not in _PREPARED:
        check_decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, mask, None)
        _PREPARED[key] = True
    out = torch.empty(q.shape[0], q.shape[1], dtype=torch.bfloat16, device=q.device)
    return run_decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k,
                                scaling, mask, out)


@torch.library.custom_op("int4lab::decode_attention", mutates_args=("k_cache", "v_cache", "length"))
def decode_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, length: torch.Tensor,
                        q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, norm: str, eps_q: float,
                        eps_k: float, scaling: float, mask: torch.Tensor | None) -> torch.Tensor:
    """attention.decode_attention as one opaque op: writes the caches at length[], advances it -> bf16 [B, HQ*D]."""
    return _decode_attention_impl(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k,
                                  scaling, mask)


@decode_attention_op.register_fake
def _(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k, scaling, mask):
    return q.new_empty(q.shape, dtype=torch.bfloat16)


def decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm: str, eps_q: float,
                     eps_k: float, scaling: float, mask=None) -> torch.Tensor:
    """attention.decode_attention's contract (every argument given), checked once per signature."""
    if torch.compiler.is_compiling():
        return decode_attention_op(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k,
                                   scaling, mask)
    return _decode_attention_impl(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k,
                                  scaling, mask)
