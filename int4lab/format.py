"""int4-b32: symmetric int4 codes, one fp16 scale per 32 weights along K.

Shape legend: E = experts, N = out features (rows), K = in features, R = activation rows.

The bytes are a contract (grouped-nf4-gemm's `int4_pack_ref` format):
    w[..., n, k] ~= (nib[..., n, k] - 8) * scales[..., n, k // 32]
    packed[..., n, j] = nib[..., n, 2j] | nib[..., n, 2j + 1] << 4    (even k in the low nibble)
    packed uint8 [..., N, K/2], scales float16 [..., N, K/32]

Value quantisation (which code) is kept apart from bit packing (which byte): `rtn_codes` chooses
codes, `pack_codes` / `unpack_codes` only move bits, so GPTQ (`int4lab.gptq`) reuses the packer.
"""
from __future__ import annotations

import torch

from ._checks import BLOCK, FLOAT_DTYPES, check_dims, check_finite, check_k, check_packed, check_tensor  # noqa: F401
QMIN, QMAX = -8, 7          # int4 levels; round-to-nearest uses only [-7, 7] (scale = amax / 7)
FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 2.0 ** -24
X_QMAX = 127                # int8 activation codes are symmetric: [-127, 127]


def _blocks(t: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., K/32, 32] view."""
    return t.reshape(*t.shape[:-1], t.shape[-1] // BLOCK, BLOCK)


def true_div(a: torch.Tensor, d: float) -> torch.Tensor:
    """a / d as the IEEE float32 quotient on every device (torch on CUDA turns `t / 7.0` into t * (1/7),
    which differs in the last bit for some t; a tensor divisor keeps the true division)."""
    return a / torch.full_like(a, d)


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """float32 block amax -> float32 scale amax.clamp_min(1e-12) / 7 (the same bits on CPU and CUDA)."""
    return true_div(amax.float().clamp_min(1e-12), 7.0)


def block_scales(w: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] -> float32 [..., K/32]: amax(|block|).clamp_min(1e-12) / 7."""
    return scale_from_amax(_blocks(w.float()).abs().amax(-1))


def check_scale_range(s: torch.Tensor, name: str = "w") -> None:
    """Refuse a float32 scale above fp16's largest finite value, 65504. Round-to-nearest would store a scale in
    (65504, 65520) as 65504 (an error under half an ulp) and only one >= 65520 as inf: refusing all of them is
    the packer's conservative choice, not something storage forces."""
    big = s > FP16_MAX
    if bool(big.any()):
        raise ValueError(
            f"{name} has a block whose scale amax/7 = {float(s.max()):.6g} exceeds the float16 maximum "
            f"{FP16_MAX:g} (|{name}| must not exceed {7 * FP16_MAX:g}); rescale the tensor first")


def rtn_codes(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Codes round_half_to_even(w / s) clamped to [-8, 7] as int8; w [..., K], s float32 [..., K/32]."""
    q = torch.round(_blocks(w.float()) / s.unsqueeze(-1))     # torch.round is half-to-even
    return q.clamp_(QMIN, QMAX).to(torch.int8).reshape(w.shape)


def pack_codes(q: torch.Tensor) -> torch.Tensor:
    """int8 codes [..., K] in [-8, 7] -> uint8 [..., K/2], nibble = code + 8, even k low."""
    nib = (q.to(torch.int16) + 8).to(torch.uint8)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> int8 codes [..., K] in [-8, 7]."""
    lo = (packed & 0xF).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _check_weight(w, name: str = "w") -> None:
    check_tensor(name, w, FLOAT_DTYPES, (2, 3))
    check_k(f"{name}.shape[-1] (K)", w.shape[-1], BLOCK)
    check_finite(name, w)


def pack_int4_b32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest pack of w [N, K] or [E, N, K] (fp32/fp16/bf16, K % 32 == 0).

    Per 32-block: s = amax(|block|).clamp_min(1e-12) / 7 in float32; q = round_half_to_even(w / s)
    clamped to [-8, 7] (true division by the float32 scale); stored scale s.to(float16).
    Returns (packed uint8 [..., N, K/2], scales float16 [..., N, K/32]).

    A block whose scale rounds to 0 in float16 (amax/7 <= 2**-25) decodes to all zeros; scales between
    2**-25 and 2**-14 are fp16 subnormals and lose relative precision (notebook 01 measures both).
    """
    _check_weight(w)
    w = w.detach()                                  # packs are data: no autograd graph rides on the scales
    s = block_scales(w)
    check_scale_range(s)
    return pack_codes(rtn_codes(w, s)), s.to(torch.float16)


def dequant_int4_ref(packed: torch.Tensor, scales: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """Reference decode: float32 [..., N, K] = (nib - 8) * float(scale)."""
    check_packed(packed, scales, N, K)
    q = unpack_codes(packed).float()
    return (_blocks(q) * scales.float().unsqueeze(-1)).reshape(q.shape)


def quant_x_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations x [R, K] (fp32/fp16/bf16) -> (int8 [R, K], float32 [R, K/32]).

    Per 32-block, in float32: s = amax(|x|) / 127 + 1e-12; inv = 1 / s; q = round_half_to_even(x * inv)
    clamped to [-127, 127]. Two IEEE divisions per block and one product per value, so a GEMV can
    quantise its own slice of x without a division per value (int4lab/kernels/quant.py says why). The
    +1e-12 keeps an all-zero block finite (codes 0). The Triton `quant_x_rows` returns the same bits.
    """
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    check_k("x.shape[-1] (K)", x.shape[-1], BLOCK)
    check_finite("x", x)
    xb = _blocks(x.float())
    s = true_div(xb.abs().amax(-1), float(X_QMAX)) + 1e-12
    inv = torch.ones_like(s) / s                    # tensor / tensor: the IEEE quotient on every device
    q = torch.round(xb * inv.unsqueeze(-1)).clamp_(-X_QMAX, X_QMAX).to(torch.int8)
    return q.reshape(x.shape), s
