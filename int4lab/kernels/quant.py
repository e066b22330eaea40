"""Activation quantisation on the device: int8 codes with one float32 scale per 32 values.

Shape legend: R = activation rows, K = in features (K % 32 == 0), I = expert intermediate size.

The codes must be bit-identical to `int4lab.format.quant_x_rows_ref` (on the CPU):
    s   = amax(|x_block|) / 127 + 1e-12      (float32, IEEE division: once per block)
    inv = 1 / s                              (float32, IEEE division: once per block)
    q   = clamp(rint(x * inv), -127, 127)    (one float32 product per value, rounded half to even)
Why this form: a GEMV that quantises its own slice of x (one launch per GEMV) does it once per program, so the
per-value work is a multiply, not an IEEE division (a long instruction sequence on NVIDIA GPUs, where Triton's `/`
is approximate and `tl.math.div_rn` is the exact one; the division form was not timed). `rint` is `cvt.rni` on the
GPU and an exact magic-number round in the interpreter; nothing is left for the compiler to fuse into an FMA, so
the bits match the CPU reference. (The alternative rule q = floor(x / s + 0.5) differs from this one by at most one
code; lab/chapters/accuracy.py counts where.)

The jit helpers here are shared by the quantise launches below and the GEMV prologues (gemv_dp4a.py).

Bytes per call (the floor): read R*K*2 (bf16), write R*K + R*K/32*4  ->  ~3.1 bytes per element.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import FLOAT_DTYPES, check_devices, check_k, check_out, check_rows_contiguous, check_tensor, interpreting
from . import plan as _plan


@triton.jit
def rint(x, USE_ASM: tl.constexpr):
    """float32 -> float32 rounded to the nearest integer, ties to even (|x| < 2**22 in the interpreter)."""
    if USE_ASM:
        return tl.inline_asm_elementwise("cvt.rni.f32.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return (x + 12582912.0) - 12582912.0      # 1.5 * 2**23: the sum's ulp is 1, so it rounds x


@triton.jit
def max_nan(a, b):
    """max that keeps NaN (tl.max drops it, as the GPU's max.f32 does): a NaN input must give a NaN scale."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def quant_blocks(v, USE_ASM: tl.constexpr):
    """v float32 [NB, 32] -> (codes as float32 [NB, 32] in [-127, 127], float32 scales [NB]); module doc.
    A block holding NaN or inf gets a NaN or inf scale, so the row's output is not finite (as F.linear's)."""
    amax = tl.reduce(tl.abs(v), 1, max_nan)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)) + 1e-12
    inv = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    q = rint(v * inv[:, None], USE_ASM)
    return tl.minimum(tl.maximum(q, -127.0), 127.0), s


@triton.jit
def silu_mul(g, u):
    """SwiGLU in float32: g / (1 + exp(-g)) * u with Triton's exp and division (on a GPU its exp and an
    approximate division; in the interpreter numpy's exp and an IEEE division). Neither exp is torch's: both
    differ from it in the last bits on many inputs."""
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def quant_rows_kernel(
    # Pointers
    x_ptr, q_ptr, s_ptr,
    # Dimensions
    K, stride_xr,
    # Meta-parameters
    BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, USE_ASM: tl.constexpr,
):
    """x [R, K] (any float) -> q int8 [R, K], s float32 [R, K/32]; with SWIGLU, x is [R, 2K] (gate columns
    first) and the codes are those of silu(gate) * up. One program owns BLOCK_K columns of a row."""
    r = tl.program_id(0)
    NB: tl.constexpr = BLOCK_K // 32
    kb = tl.program_id(1) * NB + tl.arange(0, NB)             # scale-block index  [NB]
    offs = kb[:, None] * 32 + tl.arange(0, 32)[None, :]        # column index       [NB, 32]
    mask = offs < K
    v = tl.load(x_ptr + r * stride_xr + offs, mask=mask, other=0.0).to(tl.float32)
    if SWIGLU:
        v = silu_mul(v, tl.load(x_ptr + r * stride_xr + K + offs, mask=mask, other=0.0).to(tl.float32))
    q, s = quant_blocks(v, USE_ASM)
    tl.store(q_ptr + r * K + offs, q.to(tl.int8), mask=mask)
    tl.store(s_ptr + r * (K // 32) + kb, s, mask=kb < K // 32)


def _quantise_rows(src, K: int, q, s, swiglu: bool):
    """Launch quant_rows_kernel over src's rows (K codes per row, from src [R, K] or [R, 2K] gate | up)."""
    check_rows_contiguous("x" if not swiglu else "h", src)
    dev = check_devices(**{"h" if swiglu else "x": src})
    R = src.shape[0]
    q = check_out("q", q, (R, K), torch.int8, dev)
    s = check_out("s", s, (R, K // 32), torch.float32, dev)
    bk = _plan.row_block(dev)
    if R:
        quant_rows_kernel[(R, -(-K // bk))](src, q, s, K, src.stride(0), BLOCK_K=bk, SWIGLU=swiglu,
                                                   USE_ASM=not interpreting())
    return q, s


def quant_x_rows(x: torch.Tensor, q: torch.Tensor | None = None, s: torch.Tensor | None = None):
    """x [R, K] fp32/fp16/bf16 -> (int8 [R, K], float32 [R, K/32]), bit-identical to quant_x_rows_ref.

    `q` and `s` may be preallocated (CUDA-graph capture). Finiteness is not checked (it would need a
    device sync); a NaN or inf in a block gives that block a NaN or inf scale (codes undefined), so whatever
    reads the codes with their scales comes out NaN or inf, as torch.nn.functional.linear would.
    """
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    check_k("x.shape[-1] (K)", x.shape[-1])
    return _quantise_rows(x, x.shape[1], q, s, swiglu=False)


def swiglu_quant_rows(h: torch.Tensor, q: torch.Tensor | None = None, s: torch.Tensor | None = None):
    """h [R, 2I] bf16/fp16/fp32, gate columns first -> int8 [R, I], float32 [R, I/32] of silu(g) * u.

    SwiGLU is computed in float32 as g / (1 + exp(-g)) * u (silu_mul), then quantised like quant_x_rows.
    Triton's exp (the GPU's, or numpy's in the interpreter) differs from torch's in the last bits on many inputs,
    on any device, so a scale can differ from `swiglu_quant_rows_ref`'s in its last bits and the codes match its
    codes to within one step.
    """
    check_tensor("h", h, FLOAT_DTYPES, (2,))
    if h.shape[-1] % 64:
        raise ValueError(f"h.shape[-1] (2I) must be a positive multiple of 64, got {h.shape[-1]}")
    check_k("h.shape[-1] / 2 (I)", h.shape[1] // 2)
    return _quantise_rows(h, h.shape[1] // 2, q, s, swiglu=True)


def swiglu_quant_rows_ref(h: torch.Tensor):
    """Reference: silu(g) * u in float32, then quant_x_rows_ref."""
    from ..format import quant_x_rows_ref
    I = h.shape[-1] // 2
    g, u = h[:, :I].float(), h[:, I:].float()
    return quant_x_rows_ref(g / (1.0 + torch.exp(-g)) * u)
