"""Decode attention over a static KV cache in one launch: q/k norm, rope, the cache write, attention.

Shape legend: B = batch, HQ = query heads, HKV = key/value heads (HQ a multiple), D = head dim (even),
C = cache slots, S = context splits.

Why: transformers' attention of a single-token step over a StaticCache is ~12-16 small kernels a layer (the q/k
norms, rope's slices, negations, concatenations, products and sums, two index_copy_ into the cache, the length's
add, the attention, reshapes); at batch 1 their launches cost more than the layer's weight reads.

    decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, ...) -> out bf16 [B, HQ * D]

Contract (bf16 in and out; attention_kernel.py holds the launch's layout):
    q, k      = RMSNorm (none; per head over D, Qwen3; over the whole projection row, OLMoE) with the module's two
                bf16 roundings (float32 sum of squares, its order not torch's), then rope with cos, sin [B, D]
                (transformers' position embeddings): each product and the sum rounded to bf16, as transformers'
                bf16 ops do. So q and k are transformers' values up to an ulp from the norm's sum order.
    pos       = length[] (a device tensor, read inside the kernel); k_cache[b, j, pos] = k, v_cache[b, j, pos] = v
                (bf16, exactly StaticCache.update's values and slots); length <- pos + 1. pos >= C writes nothing.
    out[b, h] = sum_s softmax_s(q_h . K[b, h // (HQ/HKV), s] * scaling) V[.., s] over slots s <= pos (and
                mask[b, s] when a boolean mask [B, C] is given): q.K with exact products and float32 sums, float32
                softmax, the weights times V as two bf16 terms (relative error <= 2^-16 a weight), the S splits'
                partial softmaxes combined in a fixed order, one bf16 rounding of the result.
Capture: nothing is read back; the grid depends on B, HKV and C only.
Bytes per call: q/k/v rows + 2 * B * HKV * C * D bf16 (the cache; slots past pos are not read) + the output.
"""
from __future__ import annotations

import torch
import triton

from .._checks import check_tensor, interpreting
from .attention_kernel import NORM_HEAD, NORM_NONE, NORM_ROW, decode_attention_kernel

NORMS = {"none": NORM_NONE.value, "head": NORM_HEAD.value, "row": NORM_ROW.value}
BLOCK_N = 64                    # cache slots per loop step
SPLIT_MIN = 128                 # slots a split reads at least (two loop steps: latency, not bytes, at decode)


def _sms(dev) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 1


def plan_splits(B: int, HKV: int, C: int, dev, splits: int | None = None, block_n: int = BLOCK_N):
    """(S, slots per split): enough programs to fill the device when the context is long (flash-decoding),
    one split when it is short; `splits` forces S (then capped so no split is empty)."""
    if splits is None:
        splits = max(1, min(-(-_sms(dev) // (B * HKV)), C // max(SPLIT_MIN, block_n)))
    per = -(-C // splits)
    spl = -(-per // block_n) * block_n
    return -(-C // spl), spl


def check_decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, mask, splits):
    for name, t in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin)):
        check_tensor(name, t, (torch.bfloat16,), (2,))
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a dense last dim, got strides {t.stride()}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, (torch.bfloat16,), (4,))
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [B, HKV, C, D]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    B, HKV, C, D = k_cache.shape
    if D % 2 or k.shape != (B, HKV * D) or v.shape != (B, HKV * D):
        raise ValueError(f"k and v must have shape ({B}, HKV * D = {HKV * D}) with D even, got {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[0] != B or q.shape[1] % (HKV * D):
        raise ValueError(f"q must have shape ({B}, HQ * {D}) with HQ a multiple of HKV = {HKV}, got {tuple(q.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[1] != D or t.shape[0] not in (1, B):
            raise ValueError(f"{name} must have shape ({B} or 1, {D}), got {tuple(t.shape)}")
    check_tensor("length", length, (torch.int64,), (0,))
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {tuple(NORMS)}, got {norm!r}")
    if norm != "none":
        HQ = q.shape[1] // D
        for name, t, n in (("q_norm", q_norm, HQ * D), ("k_norm", k_norm, HKV * D)):
            check_tensor(name, t, (torch.bfloat16,), (1,))
            want = D if norm == "head" else n
            if t.shape[0] != want:
                raise ValueError(f"{name} must have shape ({want},) for norm={norm!r}, got {tuple(t.shape)}")
    if mask is not None:
        check_tensor("mask", mask, (torch.bool,), (2,))
        if mask.shape != (B, C):
            raise ValueError(f"mask must have shape ({B}, {C}), got {tuple(mask.shape)}")
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be an int >= 1 or None, got {splits!r}")
    devs = {t.device for t in (q, k, v, cos, sin, k_cache, v_cache, length)}
    if len(devs) != 1:
        raise ValueError(f"every tensor must be on one device, got {sorted(map(str, devs))}")


def run_decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm: str, eps_q: float,
                         eps_k: float, scaling: float, mask, out, splits=None, block_n: int = BLOCK_N):
    """The launch alone (arguments checked by the caller); out bf16 [B, HQ * D]."""
    from .launch import workspace
    B, HKV, C, D = k_cache.shape
    HQ = q.shape[1] // D
    G = HQ // HKV
    S, spl = plan_splits(B, HKV, C, q.device, splits, block_n)
    gp = max(16, triton.next_power_of_2(G))
    dhp = max(16, triton.next_power_of_2(D // 2))
    part, cnt = workspace(q.device, B * HKV * S * gp * (2 * dhp + 2) if S > 1 else 0, B * HKV + 1)
    if part.numel() == 0:
        part = out
    qw = q_norm if q_norm is not None else q
    kw = k_norm if k_norm is not None else q
    m = mask.view(torch.uint8) if mask is not None else cnt
    decode_attention_kernel[(B * HKV, S)](
        q, k, v, cos, sin, qw, kw, k_cache, v_cache, length, m, out, part, cnt,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0) if cos.shape[0] > 1 else 0,
        mask.stride(0) if mask is not None else 0, mask.stride(1) if mask is not None else 0, C,
        float(scaling), float(eps_q), float(eps_k),
        HQ=HQ, HKV=HKV, G=G, GP=gp, D=D, DH=D // 2, DHP=dhp, NORM=NORMS[norm],
        QNP=triton.next_power_of_2(HQ * D), KNP=triton.next_power_of_2(HKV * D), BLOCK_N=block_n, SPL=spl, SPLITS=S,
        HAS_MASK=mask is not None, USE_LIBDEVICE=not interpreting(), num_warps=4)
    return out


def decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, *, q_norm=None, k_norm=None, norm="none",
                     eps_q=1e-6, eps_k=1e-6, scaling=None, mask=None, splits=None, block_n=BLOCK_N):
    """Module doc: out bf16 [B, HQ * D]; writes k_cache, v_cache at length[] and advances length by one."""
    check_decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, mask, splits)
    D = k_cache.shape[-1]
    scaling = D ** -0.5 if scaling is None else scaling
    out = torch.empty(q.shape[0], q.shape[1], dtype=torch.bfloat16, device=q.device)
    return run_decode_attention(q, k, v, cos, sin, k_cache, v_cache, length, q_norm, k_norm, norm, eps_q, eps_k,
                                scaling, mask, out, splits, block_n)


def _norm_ref(x, w, eps, norm, D):
    """x [B, H, D] bf16 -> the module's RMSNorm (float64 sums, two bf16 roundings)."""
    if norm == "none":
        return x
    B, H, _ = x.shape
    xs = x.reshape(B, H * D) if norm == "row" else x
    xd = xs.double()
    n = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    return (w.double() * n.double()).to(torch.bfloat16).reshape(B, H, D)


def _rope_ref(x, cos, sin):
    """transformers' bf16 rope of x [B, H, D] with cos, sin [B, 1, D]."""
    rot = torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), -1)
    return x * cos + rot * sin


def decode_attention_ref(q, k, v, cos, sin, k_cache, v_cache, pos: int, *, q_norm=None, k_norm=None, norm="none",
                         eps_q=1e-6, eps_k=1e-6, scaling=None, mask=None):
    """The contract in float64 on CPU copies: (out float64 [B, HQ * D], k_cache', v_cache' with slot pos written,
    q and k after norm and rope, bf16 [B, H, D])."""
    B, HKV, C, D = k_cache.shape
    HQ = q.shape[1] // D
    cos, sin = cos.cpu().view(-1, 1, D), sin.cpu().view(-1, 1, D)
    qh = _rope_ref(_norm_ref(q.cpu().view(B, HQ, D), q_norm.cpu() if q_norm is not None else None,
                             eps_q, norm, D), cos, sin)
    kh = _rope_ref(_norm_ref(k.cpu().view(B, HKV, D), k_norm.cpu() if k_norm is not None else None, eps_k, norm, D),
                   cos, sin)
    kc, vc = k_cache.cpu().clone(), v_cache.cpu().clone()
    if pos < C:
        kc[:, :, pos], vc[:, :, pos] = kh, v.cpu().view(B, HKV, D)
    keep = torch.arange(C) <= pos
    keep = keep.view(1, C) & (mask.cpu() if mask is not None else True)
    scaling = D ** -0.5 if scaling is None else scaling
    kr = kc.double().repeat_interleave(HQ // HKV, 1)
    vr = vc.double().repeat_interleave(HQ // HKV, 1)
    sc = torch.einsum("bhd,bhcd->bhc", qh.double(), kr) * scaling
    sc = sc.masked_fill(~keep.view(B if keep.shape[0] > 1 else 1, 1, C), float("-inf"))
    out = torch.einsum("bhc,bhcd->bhd", torch.softmax(sc, -1), vr).reshape(B, HQ * D)
    return out, kc, vc, qh, kh
