"""RMSNorm in one launch, with the roundings of the transformers module it replaces.

Shape legend: R = rows, N = normalised features (hidden size, or head dim for per-head q/k norms).

Why: transformers' RMSNorm (Mixtral, OLMoE, Qwen3-MoE) is eight element-wise and reduction kernels in an eager
or graphed step (cast, square, mean, add, rsqrt, multiply, cast, multiply by the weight); a decode layer has two
(four with OLMoE's and Qwen3's q/k norms), so at batch 1 they cost more than the GEMVs' launches.

Contract (x and weight of one float dtype, all arithmetic in float32):
    v = sum_j x_j^2 / N                     (float32 sum, IEEE division)
    n = round_dtype(x * rsqrt(v + eps))     (the module's `hidden_states.to(input_dtype)`)
    y = round_dtype(weight * n)             (a bf16 x bf16 product is exact in float32: one rounding)
The sum's order is not torch's and rsqrt is the GPU's (libdevice, what torch calls; the interpreter's is
numpy's), so an element can differ from the module by one ulp of the dtype (tests/lib/test_fused.py bounds it).

Bytes per call: read R*N + N (weight), write R*N, in the dtype: the floor is one read of x.
add_rms_norm_kernel: a decoder layer's residual add and the following RMSNorm in one launch (s = round(res + x),
stored as the new residual, then the contract on s): transformers' two bf16 results, one launch fewer.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .._checks import FLOAT_DTYPES, check_rows_and_weight, check_tensor, interpreting
from .epilogue import to_bf16_rne

# Output dtype codes (a kernel's OUT / LOGITS / WTS argument). tl.constexpr, so that a kernel may compare with
# them: the compiler reads no other module-level value inside a kernel (the interpreter would).
OUT_F32, OUT_BF16, OUT_F16 = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
_OUT = {torch.float32: OUT_F32.value, torch.bfloat16: OUT_BF16.value, torch.float16: OUT_F16.value}


@triton.jit
def round_to(v, OUT: tl.constexpr):
    """float32 -> the output dtype's value (round to nearest even), as float32 arithmetic continues."""
    if OUT == OUT_BF16:
        return to_bf16_rne(v).to(tl.float32)
    elif OUT == OUT_F16:
        return v.to(tl.float16).to(tl.float32)
    else:
        return v


@triton.jit
def rms_norm_kernel(
    # Pointers
    x_ptr, w_ptr, y_ptr,
    # Dimensions
    N, stride_x, eps,
    # Meta-parameters
    BLOCK: tl.constexpr, OUT: tl.constexpr, USE_LIBDEVICE: tl.constexpr,
):
    """One program owns one row: y[r, :] = round(w * round(x[r, :] * rsqrt(mean(x[r, :]^2) + eps))) (module doc).
    x [R, N] (rows strided by stride_x), w [N], y [R, N] contiguous; BLOCK >= N, a power of two."""
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + r * stride_x + offs, mask=m, other=0.0).to(tl.float32)
    _norm_row(x, w_ptr, y_ptr + r * N, offs, m, N, eps, OUT, USE_LIBDEVICE)


@triton.jit
def _store(ptr, v, m, OUT: tl.constexpr):
    if OUT == OUT_BF16:
        tl.store(ptr, to_bf16_rne(v), mask=m)
    else:
        tl.store(ptr, v.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _norm_row(x, w_ptr, y_row, offs, m, N, eps, OUT: tl.constexpr, USE_LIBDEVICE: tl.constexpr):
    """The contract's arithmetic on one row x (float32 of the dtype's values), stored at y_row + offs."""
    v = tl.math.div_rn(tl.sum(x * x, axis=0), N.to(tl.float32)) + eps
    if USE_LIBDEVICE:
        inv = libdevice.rsqrt(v)
    else:
        inv = 1.0 / tl.sqrt(v)
    n = round_to(x * inv, OUT)
    y = round_to(tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32) * n, OUT)
    _store(y_row + offs, y, m, OUT)


@triton.jit
def add_rms_norm_kernel(
    # Pointers
    x_ptr, res_ptr, w_ptr, s_ptr, y_ptr,
    # Dimensions
    N, stride_x, stride_r, eps,
    # Meta-parameters
    BLOCK: tl.constexpr, OUT: tl.constexpr, USE_LIBDEVICE: tl.constexpr,
):
    """A decoder layer's `residual + x` then the next RMSNorm, one program a row: s = round(res + x) (the new
    residual, stored), y = the norm of s (rms_norm_kernel's arithmetic). s, y [R, N] contiguous."""
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + r * stride_x + offs, mask=m, other=0.0).to(tl.float32)
    s = round_to(x + tl.load(res_ptr + r * stride_r + offs, mask=m, other=0.0).to(tl.float32), OUT)
    _store(s_ptr + r * N + offs, s, m, OUT)
    _norm_row(s, w_ptr, y_ptr + r * N, offs, m, N, eps, OUT, USE_LIBDEVICE)


def check_rms_norm(x, weight, eps):
    check_tensor("weight", weight, FLOAT_DTYPES, (1,))
    check_rows_and_weight(x, weight, "(H,)")
    if not isinstance(eps, float) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")


def run_rms_norm(x, weight, eps: float, out):
    """The launch alone (arguments checked by the caller): out [R, N] in x's dtype."""
    R, N = x.shape
    if R:
        block = triton.next_power_of_2(N)
        rms_norm_kernel[(R,)](x, weight, out, N, x.stride(0), eps, BLOCK=block, OUT=_OUT[x.dtype],
                              USE_LIBDEVICE=not interpreting(), num_warps=4 if block >= 1024 else 1)
    return out


def run_add_rms_norm(x, res, weight, eps: float, s_out, y_out):
    """add_rms_norm_kernel's launch alone (x, res [R, N] of one dtype, rows strided, checked by the caller)."""
    R, N = x.shape
    if R:
        block = triton.next_power_of_2(N)
        add_rms_norm_kernel[(R,)](x, res, weight, s_out, y_out, N, x.stride(0), res.stride(0), eps, BLOCK=block,
                                  OUT=_OUT[x.dtype], USE_LIBDEVICE=not interpreting(),
                                  num_warps=4 if block >= 1024 else 1)
    return s_out, y_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [R, N] with weight [N] (one dtype), one launch -> [R, N] in x's dtype (module doc)."""
    check_rms_norm(x, weight, eps)
    return run_rms_norm(x, weight, eps, torch.empty(x.shape, dtype=x.dtype, device=x.device))


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """float64 arithmetic with the contract's two roundings to x's dtype (CPU)."""
    xd = x.cpu().double()
    n = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.cpu().double() * n.double()).to(x.dtype)
