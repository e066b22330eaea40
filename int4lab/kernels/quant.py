"""Activation quantisation on the device: int8 codes with one float32 scale per 32 values.

Shape legend: R = activation rows, K = in features (K % 32 == 0), I = expert intermediate size.

The codes must be bit-identical to `int4lab.format.quant_x_rows_ref` (on the CPU):
    s = amax(|x_block|) / 127 + 1e-12        (float32, IEEE division)
    q = clamp(floor(x / s + 0.5), -127, 127)  (IEEE division, then a separately rounded + 0.5)
Triton's `/` on float32 compiles to an approximate division on NVIDIA GPUs, so both divisions use
`tl.math.div_rn` (round-to-nearest, exact IEEE). Note: torch on CUDA computes `t / 127` as t * (1/127),
which is not always the IEEE quotient, so compare against the reference evaluated on the CPU.

Bytes per call (the floor): read R*K*2 (bf16), write R*K + R*K/32*4  ->  ~3.1 bytes per element.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import FLOAT_DTYPES, check_k, check_tensor
from . import plan as _plan
from ._validate import check_devices, check_out, check_rows_contiguous

X_QMAX = 127


@triton.jit
def _quant_blocks(v):
    """v float32 [NB, 32] -> (int8 codes [NB, 32], float32 scales [NB]); the reference's arithmetic."""
    amax = tl.max(tl.abs(v), axis=1)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)) + 1e-12
    q = tl.floor(tl.math.div_rn(v, tl.broadcast_to(s[:, None], v.shape)) + 0.5)
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    return q.to(tl.int8), s


@triton.jit
def quant_rows_kernel(
    # Pointers
    x_ptr, q_ptr, s_ptr,
    # Dimensions
    K, stride_xr,
    # Meta-parameters
    BLOCK_K: tl.constexpr,
):
    """x [R, K] (any float) -> q int8 [R, K], s float32 [R, K/32]; one program owns BLOCK_K columns of a row."""
    r = tl.program_id(0)
    NB: tl.constexpr = BLOCK_K // 32
    kb = tl.program_id(1) * NB + tl.arange(0, NB)             # scale-block index  [NB]
    offs = kb[:, None] * 32 + tl.arange(0, 32)[None, :]        # column index       [NB, 32]
    mask = offs < K
    v = tl.load(x_ptr + r * stride_xr + offs, mask=mask, other=0.0).to(tl.float32)
    q, s = _quant_blocks(v)
    tl.store(q_ptr + r * K + offs, q, mask=mask)
    tl.store(s_ptr + r * (K // 32) + kb, s, mask=kb < K // 32)


@triton.jit
def swiglu_quant_kernel(
    # Pointers
    h_ptr, q_ptr, s_ptr,
    # Dimensions
    I, stride_hr,
    # Meta-parameters
    BLOCK_K: tl.constexpr,
):
    """h [R, 2I] (gate columns first) -> codes/scales of silu(gate) * up, [R, I] int8 and [R, I/32] fp32."""
    r = tl.program_id(0)
    NB: tl.constexpr = BLOCK_K // 32
    kb = tl.program_id(1) * NB + tl.arange(0, NB)
    offs = kb[:, None] * 32 + tl.arange(0, 32)[None, :]
    mask = offs < I
    g = tl.load(h_ptr + r * stride_hr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + r * stride_hr + I + offs, mask=mask, other=0.0).to(tl.float32)
    a = g / (1.0 + tl.exp(-g)) * u                             # SwiGLU in float32
    q, s = _quant_blocks(a)
    tl.store(q_ptr + r * I + offs, q, mask=mask)
    tl.store(s_ptr + r * (I // 32) + kb, s, mask=kb < I // 32)


def quant_x_rows(x: torch.Tensor, q: torch.Tensor | None = None, s: torch.Tensor | None = None):
    """x [R, K] fp32/fp16/bf16 -> (int8 [R, K], float32 [R, K/32]), bit-identical to quant_x_rows_ref.

    `q` and `s` may be preallocated (CUDA-graph capture). Finiteness is not checked (it would need a
    device sync); a NaN in a block gives that block NaN scale and undefined codes.
    """
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    check_k("x.shape[-1] (K)", x.shape[-1])
    check_rows_contiguous("x", x)
    dev = check_devices(x=x)
    R, K = x.shape
    q = check_out("q", q, (R, K), torch.int8, dev)
    s = check_out("s", s, (R, K // 32), torch.float32, dev)
    bk = _plan.row_block(dev)
    if R:
        quant_rows_kernel[(R, triton.cdiv(K, bk))](x, q, s, K, x.stride(0), BLOCK_K=bk)
    return q, s


def swiglu_quant_rows(h: torch.Tensor, q: torch.Tensor | None = None, s: torch.Tensor | None = None):
    """h [R, 2I] bf16/fp16/fp32, gate columns first -> int8 [R, I], float32 [R, I/32] of silu(g) * u.

    SwiGLU is computed in float32 as g / (1 + exp(-g)) * u, then quantised like quant_x_rows. The GPU's
    exp differs from torch's in the last bit, so codes match `swiglu_quant_rows_ref` to within one step.
    """
    check_tensor("h", h, FLOAT_DTYPES, (2,))
    if h.shape[-1] % 64:
        raise ValueError(f"h.shape[-1] (2I) must be a positive multiple of 64, got {h.shape[-1]}")
    check_rows_contiguous("h", h)
    dev = check_devices(h=h)
    R, I = h.shape[0], h.shape[1] // 2
    check_k("h.shape[-1] / 2 (I)", I)
    q = check_out("q", q, (R, I), torch.int8, dev)
    s = check_out("s", s, (R, I // 32), torch.float32, dev)
    bk = _plan.row_block(dev)
    if R:
        swiglu_quant_kernel[(R, triton.cdiv(I, bk))](h, q, s, I, h.stride(0), BLOCK_K=bk)
    return q, s


def swiglu_quant_rows_ref(h: torch.Tensor):
    """Reference: silu(g) * u in float32, then quant_x_rows_ref."""
    from ..format import quant_x_rows_ref
    I = h.shape[-1] // 2
    g, u = h[:, :I].float(), h[:, I:].float()
    return quant_x_rows_ref(g / (1.0 + torch.exp(-g)) * u)
