"""The Paddle / TensorRT-LLM int4 weight-only layout ("weight_only_int4") that FasterTransformer's /
TensorRT-LLM's CUTLASS-based mixed-input GEMM (fpA_intB; Paddle's weight_only_linear uses it) reads.

Shape legend: K = in features, N = out features. Paddle's convention: the float weight is x [K, N].

    out, scale = weight_quantize(x)              # x [K, N] fp16/bf16 -> int8 [N/2, K], scale [N] (x's dtype)
    w = weight_dequantize(out, scale)            # float32 [K, N] = code * scale, exactly

Value quantisation (which code) and layout (which nibble goes where) are separate steps, as in int4lab.format:
`quantize_codes` chooses codes in [-7, 7]; `interleave_codes` / `deinterleave_codes` only move nibbles.

The layout is built here three ways, each step a small named function, and tests prove them byte-identical:
  1. TensorRT-LLM's CPU preprocessing (also Paddle's CPU path): `pack_along_n` -> `permute_B_rows_for_mixed_gemm`
     -> `subbyte_transpose` -> `interleave_column_major_tensor` -> `add_bias_and_interleave_int4s`.
     Sources: NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp
     (@05316d33); PaddlePaddle/Paddle paddle/phi/kernels/impl/weight_quantize_kernel_impl.h (@0c22d955) and
     paddle/phi/kernels/cpu/weight_quantize_kernel.cc (@04818d11).
  2. Paddle's GPU formulation (the PR): `pack_along_k` -> `permute_kk` / `permute_index` scatter ->
     `interval_nibble_swap`. Source: PaddlePaddle/Paddle paddle/phi/kernels/impl/weight_quantize_kernel_gpu_impl.h
     (@2c8abd87; the PR's first revision is @0767731a). `variant="map"` is a later revision of the same file
     (seen in feixi139/Paddle@d58d925a): a table-driven `permute_kk` and an 8-nibble gather instead of the swap.
  3. The closed form used by `weight_quantize`: one 7-axis permutation of the biased nibbles (`interleave_codes`).

Where a code element (k, n) lands, for K % 64 == 0 and N % 8 == 0 (byte offsets into out.view(-1)):
    kb, kk = divmod(k, 64); g, m = divmod(n, 4)
    word  = 4 * (kk // 32) + (kk % 8) // 2                # which of the 8 words of a 32-byte run
    byte  = g * 2K + kb * 128 + m * 32 + 4 * word + nib // 2
    nib   = (kk % 32) // 8 + 4 * (kk % 2)                 # nibble in the little-endian 32-bit word
    value = code + 8                                      # biased, unsigned
TensorRT-LLM's `FastInterleavedAndBiasedNumericArrayConverter<half_t, uint4b_t, 8>` (a CUTLASS extension; emulated by
`fast_dequant`)
turns word w of a run into 8 halves j = 2c + e (c = 0..3, e = 0..1) holding kk = 32 (w // 4) + 2 (w % 4) + 8c + e.
"""
from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check_finite, check_tensor

ALGOS = ("weight_only_int4",)
INTERLEAVED_ARCHS = (75, 80, 86, 89, 90)   # the column-interleaved CUTLASS layout at the cited Paddle revisions
ROW_MAJOR_ARCHS = (70,)                     # Volta: row-major bytes, bias + in-register interleave only
ARCHS = ROW_MAJOR_ARCHS + INTERLEAVED_ARCHS
GROUP_SIZES = (-1, 64, 128)                 # Paddle's WeightQuantizeKernel accepts exactly these
K_MULTIPLE = 64     # one 32-byte run per column holds 64 k; the interleave tiles K by 64
N_MULTIPLE = 8      # Paddle's vectorised GPU quantiser loads 8 halves of a row; 4 columns interleave
QMAX = 7            # codes in [-7, 7]; scale = amax / 7 (TensorRT-LLM's own quantiser uses amax / 8, [-8, 7])
BIAS = 8

# TensorRT-LLM get_permutation_map(W4_A16): row t of each 32-row group is read from row LDSM_PERM[t].
LDSM_PERM = tuple((t % 2) + 8 * ((t % 8) // 2) + 2 * (t // 8) for t in range(32))
# add_bias_and_interleave_int4s: destination nibble i of a 32-bit word takes source nibble REG_SRC[i].
REG_SRC = (0, 2, 4, 6, 1, 3, 5, 7)


# ----------------------------------------------------------------------------------------------- checks
def _check_algo_arch(algo, arch, group_size) -> None:
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
    if isinstance(arch, bool) or not isinstance(arch, int) or arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} (-1 = per channel), got {group_size!r}")


def check_layout_dims(K: int, N: int, arch: int = 80, group_size: int = -1) -> None:
    """K % 64 == 0 (interleaved archs; K even for arch 70) and N % 8 == 0; K % group_size == 0 when grouped."""
    if arch in INTERLEAVED_ARCHS and (K <= 0 or K % K_MULTIPLE):
        raise ValueError(f"K (x.shape[0]) must be a positive multiple of {K_MULTIPLE} for arch {arch}, got {K}")
    if arch in ROW_MAJOR_ARCHS and (K <= 0 or K % 2):
        raise ValueError(f"K (x.shape[0]) must be a positive even number for arch {arch}, got {K}")
    if N <= 0 or N % N_MULTIPLE:
        raise ValueError(f"N (x.shape[1]) must be a positive multiple of {N_MULTIPLE}, got {N}")
    if group_size > 0 and K % group_size:
        raise ValueError(f"K (x.shape[0]) must be a multiple of group_size={group_size}, got {K}")


def _check_codes(codes) -> None:
    check_tensor("codes", codes, (torch.int8,), (2,))
    if codes.numel() and (int(codes.min()) < -8 or int(codes.max()) > 7):
        raise ValueError("codes must lie in [-8, 7]")


# ------------------------------------------------------------------------------------ value quantisation
def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's roundf/lroundf on float32: nearest integer, ties away from zero. Exact: floor(|v| + 0.5) is not
    (0.49999997 + 0.5 rounds up to 1.0 in float32), so the fraction is compared instead."""
    t = torch.trunc(v)
    return t + torch.sign(v) * ((v - t).abs() >= 0.5).to(v.dtype)


def quantize_codes(x: torch.Tensor, group_size: int = -1, path: str = "gpu") -> tuple[torch.Tensor, torch.Tensor]:
    """x [K, N] -> (codes int8 [K, N] in [-7, 7], scale in x.dtype [N] or [K/group_size, N]).

    amax over K (per channel) or over each group of `group_size` rows, in float32; scale = (amax / 7) cast to
    x.dtype (Paddle returns scales in the weight's dtype). Codes round half away from zero, clamp to [-7, 7]:
      path="gpu": q = lroundf((x / amax) * 7)        per_channel_quant_gpu_int4_col_pack (per channel only;
                                                      Paddle's GPU quantiser for arch 75/80/86/89/90)
      path="cpu": q = round(x / float(scale))         per_channel_quant / group_wise_quant (..._impl.h)
    The two can differ by one code where x / amax * 7 sits near a half (the notebook counts how often).
    Paddle's GPU quantiser for arch 70, per_channel_quant_gpu_int4_row_pack (@2c8abd87), rounds a third
    expression, roundf(x * (1 / float(scale))) with the scale already in x.dtype; it is not emulated here.
    An all-zero column or group has scale 0 and codes 0 (Paddle computes 0/0 there).
    """
    if path not in ("gpu", "cpu"):
        raise ValueError(f"path must be 'gpu' or 'cpu', got {path!r}")
    if path == "gpu" and group_size != -1:
        raise ValueError("path='gpu' is Paddle's per-channel GPU kernel: use group_size=-1 (or path='cpu')")
    K, N = x.shape
    g = K if group_size == -1 else group_size
    xf = x.float().reshape(K // g, g, N)
    amax = xf.abs().amax(dim=1, keepdim=True)                       # [K/g, 1, N]
    # a tensor divisor: torch on CUDA turns `t / 7.0` into t * (1/7), not the IEEE quotient Paddle computes
    scale = (amax / torch.full_like(amax, float(QMAX))).to(x.dtype)
    safe = lambda d: torch.where(d == 0, torch.ones_like(d), d)     # noqa: E731  (0 codes where amax == 0)
    if path == "gpu":
        v = (xf / safe(amax)) * float(QMAX)
    else:
        sf = scale.float()
        v = xf / safe(sf)
    q = round_half_away(v).clamp_(-QMAX, QMAX)
    q = torch.where(amax == 0, torch.zeros_like(q), q)
    scale = scale.reshape(K // g, N)
    return q.reshape(K, N).to(torch.int8), (scale[0] if group_size == -1 else scale)


# ------------------------------------------------------------------------------------------- nibble I/O
def _nib(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes -> uint8 two's-complement nibbles (code & 0xF), as C's `(int8 & 0x0F)` does."""
    return (codes.to(torch.int16) & 0xF).to(torch.uint8)


def _unpack_bytes(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., B] -> uint8 nibbles [..., 2B], low nibble first."""
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def _pack_nibbles(nib: torch.Tensor) -> torch.Tensor:
    """uint8 nibbles [..., 2B] -> uint8 [..., B], even index in the low nibble."""
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def _signed(nib: torch.Tensor) -> torch.Tensor:
    """Two's-complement nibble 0..15 -> int8 -8..7."""
    return (nib.to(torch.int16) ^ 8).sub_(8).to(torch.int8)


# ------------------------------------------------------------------------- pipeline 1: TensorRT-LLM (CPU)
def pack_along_n(codes: torch.Tensor) -> torch.Tensor:
    """codes int8 [K, N] -> uint8 [K, N/2]: two adjacent columns per byte, even n low (per_channel_quant<T, 4>)."""
    nib = _nib(codes)
    return nib[:, 0::2] | (nib[:, 1::2] << 4)


def permute_B_rows_for_mixed_gemm(b: torch.Tensor) -> torch.Tensor:
    """uint8 [K, N/2] -> same shape; within each 32-row group, row t is read from row LDSM_PERM[t].
    The rows move as whole 32-bit words (8 int4 along N), so N % 8 == 0; K % 32 == 0."""
    K, H = b.shape
    perm = torch.tensor(LDSM_PERM, device=b.device)
    return b.reshape(K // 32, 32, H)[:, perm, :].reshape(K, H)


def subbyte_transpose(b: torch.Tensor) -> torch.Tensor:
    """int4 transpose: uint8 [K, N/2] (packed along N) -> uint8 [N, K/2] (packed along K, even k low)."""
    return _pack_nibbles(_unpack_bytes(b).t().contiguous())


def interleave_column_major_tensor(b: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] column-major -> flat uint8 [N*K/2]: ColumnMajorTileInterleave<64, 4>, i.e. for each group
    of 4 columns, the 32-byte runs (64 k) of the 4 columns alternate: [N/4, K/64, 4, 32]."""
    N, H = b.shape
    return b.reshape(N // 4, 4, H // 32, 32).permute(0, 2, 1, 3).reshape(-1)


def add_bias_and_interleave_int4s(b: torch.Tensor) -> torch.Tensor:
    """Each nibble +8 (signed -> unsigned), then inside each little-endian 32-bit word destination nibble i
    takes source nibble REG_SRC[i] = 0,2,4,6,1,3,5,7: [e7 .. e0] -> [e7 e5 e3 e1 e6 e4 e2 e0]."""
    nib = (_unpack_bytes(b.reshape(-1, 4)) + BIAS) & 0xF           # [words, 8]
    nib = nib[:, list(REG_SRC)]
    return _pack_nibbles(nib).reshape(b.shape)


def trt_preprocess(codes: torch.Tensor) -> torch.Tensor:
    """Pipeline 1 (TensorRT-LLM / Paddle CPU, arch 75-90): codes int8 [K, N] -> int8 [N/2, K]."""
    _check_codes(codes)
    K, N = codes.shape
    check_layout_dims(K, N)
    b = pack_along_n(codes)
    b = permute_B_rows_for_mixed_gemm(b)
    b = subbyte_transpose(b)
    b = interleave_column_major_tensor(b)
    b = add_bias_and_interleave_int4s(b)
    return b.view(torch.int8).reshape(N // 2, K)


# -------------------------------------------------------------------------- pipeline 2: Paddle GPU (PR)
def pack_along_k(codes: torch.Tensor) -> torch.Tensor:
    """codes int8 [K, N] -> uint8 [K/2, N]: two adjacent rows per byte, even k low ("column pack",
    per_channel_quant_gpu_int4_col_pack)."""
    nib = _nib(codes)
    return nib[0::2] | (nib[1::2] << 4)


def permute_kk(k_id: torch.Tensor) -> torch.Tensor:
    """Destination byte row of source byte row k_id, as the merged kernel computes it (integer arithmetic,
    weight_permute_kernel_wint4 @2c8abd87). Equals 0,4,8,12,2,6,10,14,1,5,9,13,3,7,11,15 + 16 * (k_id // 16)."""
    k8 = k_id % 8
    e1 = k8 - k8 // 4 * 4
    e2 = k8 // 4
    inner = (e1 + e2 + (e2 + 1) % 2 * k8 * 2 // 2 + e1 * e2) % 8 * 2
    return inner + (k_id % 16) // 8 + k_id // 16 * 16


def permute_kk_map(k_id: torch.Tensor) -> torch.Tensor:
    """The later table-driven permute_kk (map 0,4,8,12,1,5,9,13,2,6,10,14,3,7,11,15); pairs with `interval_gather`."""
    table = torch.tensor([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15], device=k_id.device)
    return table[k_id % 16] + k_id // 16 * 16


def permute_index(kk: torch.Tensor, n_id: torch.Tensor, K: int) -> torch.Tensor:
    """Byte offset in out: kk % 32 + kk // 32 * 128 + 32 * (n % 4) + 2K * (n // 4).
    The PR's text writes `total_k * 4` because its launcher first halved total_k to K/2; merged code uses K * 2."""
    return kk % 32 + kk // 32 * 128 + 32 * (n_id % 4) + K * 2 * (n_id // 4)


def paddle_permute(b: torch.Tensor, K: int, variant: str = "merged") -> torch.Tensor:
    """Scatter uint8 [K/2, N] byte (k_id, n_id) to out[permute_index(permute_kk(k_id), n_id)]; flat uint8 [N*K/2]."""
    H, N = b.shape
    k_id = torch.arange(H, device=b.device).view(H, 1)
    n_id = torch.arange(N, device=b.device).view(1, N)
    kk = permute_kk(k_id) if variant == "merged" else permute_kk_map(k_id)
    dst = permute_index(kk, n_id, K).reshape(-1)
    out = torch.empty(H * N, dtype=torch.uint8, device=b.device)
    out[dst] = b.reshape(-1)
    return out


def interval_nibble_swap(b: torch.Tensor) -> torch.Tensor:
    """weight_interval_kernel_wint4 (@2c8abd87): per group of 4 bytes, byte p and byte p+2 (p = 0, 1) trade
    nibbles, new[p] = lo(b[p]) | lo(b[p+2]) << 4, new[p+2] = hi(b[p]) | hi(b[p+2]) << 4, each nibble +8 mod 16."""
    w = b.reshape(-1, 4)
    lo = ((w & 0xF) + BIAS) & 0xF
    hi = ((w >> 4) + BIAS) & 0xF
    out = torch.empty_like(w)
    out[:, 0:2] = lo[:, 0:2] | (lo[:, 2:4] << 4)
    out[:, 2:4] = hi[:, 0:2] | (hi[:, 2:4] << 4)
    return out.reshape(b.shape)


def interval_gather(b: torch.Tensor) -> torch.Tensor:
    """The later weight_interval_kernel_wint4: destination nibble i = source nibble REG_SRC[i] + 8 (mod 16)."""
    return add_bias_and_interleave_int4s(b)


def paddle_gpu_preprocess(codes: torch.Tensor, variant: str = "merged") -> torch.Tensor:
    """Pipeline 2 (Paddle GPU, arch 75-90): codes int8 [K, N] -> int8 [N/2, K]. variant 'merged' or 'map'."""
    if variant not in ("merged", "map"):
        raise ValueError(f"variant must be 'merged' or 'map', got {variant!r}")
    _check_codes(codes)
    K, N = codes.shape
    check_layout_dims(K, N)
    b = paddle_permute(pack_along_k(codes), K, variant)
    b = interval_nibble_swap(b) if variant == "merged" else interval_gather(b)
    return b.view(torch.int8).reshape(N // 2, K)


# ------------------------------------------------------------------------------ closed form (pipeline 3)
# k = 64*kb + 32*a + 8*c + 2*d + e and n = 4*g + m; out's nibble order is (g, kb, m, a, d, e, c):
# word = 4a + d, nibble = c + 4e. One permute of the biased nibbles, then pair them into bytes.
def interleave_codes(codes: torch.Tensor) -> torch.Tensor:
    """Closed form of the arch-80 layout: codes int8 [K, N] -> int8 [N/2, K]. Device-agnostic, no index tensors."""
    K, N = codes.shape
    u = (codes.to(torch.int16) + BIAS).to(torch.uint8)
    u = u.reshape(K // 64, 2, 4, 4, 2, N // 4, 4)                  # kb a c d e g m
    u = u.permute(5, 0, 6, 1, 3, 4, 2).reshape(-1)                 # g kb m a d e c
    return _pack_nibbles(u).view(torch.int8).reshape(N // 2, K)


def deinterleave_codes(out: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """Inverse of `interleave_codes`: int8 [N/2, K] -> codes int8 [K, N]."""
    u = _unpack_bytes(out.reshape(-1).view(torch.uint8))
    u = u.reshape(N // 4, K // 64, 4, 2, 4, 2, 4)                  # g kb m a d e c
    u = u.permute(1, 3, 6, 4, 5, 0, 2).reshape(K, N)               # kb a c d e g m
    return (u.to(torch.int16) - BIAS).to(torch.int8)


def row_major_codes(codes: torch.Tensor) -> torch.Tensor:
    """arch 70: pack along N, then bias + register interleave; out.view(-1) is the row-major [K, N/2] bytes."""
    K, N = codes.shape
    return add_bias_and_interleave_int4s(pack_along_n(codes)).view(torch.int8).reshape(N // 2, K)


def row_major_decode(out: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """Inverse of `row_major_codes`: int8 [N/2, K] -> codes int8 [K, N]."""
    nib = _unpack_bytes(out.reshape(-1, 4).view(torch.uint8))      # [words, 8], position i holds REG_SRC[i]
    inv = [REG_SRC.index(j) for j in range(8)]
    nib = (nib[:, inv].to(torch.int16) - BIAS).to(torch.int8)
    return nib.reshape(K, N)


def nibble_positions(K: int, N: int) -> torch.Tensor:
    """int64 [K, N]: index of (k, n)'s nibble in out.view(uint8) unpacked low-first (the docstring's formula)."""
    k = torch.arange(K).view(K, 1)
    n = torch.arange(N).view(1, N)
    kb, kk = k // 64, k % 64
    word = 4 * (kk // 32) + (kk % 8) // 2
    nib = (kk % 32) // 8 + 4 * (kk % 2)
    byte_of_word = (n // 4) * 2 * K + kb * 128 + (n % 4) * 32 + 4 * word
    return 2 * byte_of_word + nib


# ------------------------------------------------------------------------------------------- public API
def weight_quantize(x: torch.Tensor, algo: str = "weight_only_int4", arch: int = 80,
                    group_size: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Paddle's `weight_quantize` for algo="weight_only_int4": x [K, N] -> (out int8 [N/2, K], scale).

    x: float16 / bfloat16 (Paddle's registered dtypes) or float32, finite, any device; K % 64 == 0 and N % 8 == 0.
    scale: x.dtype, [N] (group_size=-1) or [K/group_size, N] (64, 128). Codes: `quantize_codes` with the
    arithmetic of Paddle's column-pack GPU quantiser (arch 75/80/86/89/90) per channel, for every arch, and its CPU
    arithmetic per group (Paddle's GPU launcher @04818d11 validates group_size but does not pass it to the
    quantiser). For arch 70 per channel, Paddle's GPU path uses its row-pack quantiser, roundf(x * (1 / scale)),
    which is not emulated: there the codes can differ by one code near a half from Paddle's GPU and CPU paths alike.
    arch 75/80/86/89/90: the interleaved CUTLASS layout (`interleave_codes`); arch 70: row-major bytes with bias
    and register interleave (`row_major_codes`). arch 100 is refused, following the cited revisions: Paddle's CPU
    path @04818d11 admits it but has no layout branch for it (nothing is written to out), and the GPU permute
    @2c8abd87 has none either; a later revision of the permute (feixi139/Paddle@d58d925a) sends 100 to the
    interleaved layout too.
    """
    _check_algo_arch(algo, arch, group_size)
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    K, N = x.shape
    check_layout_dims(K, N, arch, group_size)
    check_finite("x", x)
    codes, scale = quantize_codes(x, group_size, "gpu" if group_size == -1 else "cpu")
    out = interleave_codes(codes) if arch in INTERLEAVED_ARCHS else row_major_codes(codes)
    return out, scale


def weight_dequantize(out: torch.Tensor, scale: torch.Tensor, algo: str = "weight_only_int4", arch: int = 80,
                      group_size: int = -1) -> torch.Tensor:
    """Exact inverse of `weight_quantize`'s layout: float32 [K, N] = code * float(scale) (exact in float32)."""
    _check_algo_arch(algo, arch, group_size)
    check_tensor("out", out, (torch.int8,), (2,))
    check_tensor("scale", scale, FLOAT_DTYPES, (1,) if group_size == -1 else (2,))
    N = scale.shape[-1]
    if out.shape[0] * 2 != N:
        raise ValueError(f"out must have shape (N/2, K) with N = scale.shape[-1] = {N}, got {tuple(out.shape)}")
    K = out.shape[1]
    check_layout_dims(K, N, arch, group_size)
    if group_size != -1 and tuple(scale.shape) != (K // group_size, N):
        raise ValueError(f"scale must have shape (K/group_size, N) = ({K // group_size}, {N}), "
                         f"got {tuple(scale.shape)}")
    codes = deinterleave_codes(out, K, N) if arch in INTERLEAVED_ARCHS else row_major_decode(out, K, N)
    s = scale.float().view(1, N) if group_size == -1 else scale.float().repeat_interleave(group_size, dim=0)
    return codes.float() * s


# --------------------------------------------------------------------------- int4-b32 -> this layout
def int4_b32_to_cutlass(packed: torch.Tensor, scales: torch.Tensor, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int4-b32 (uint8 [N, K/2], float16 [N, K/32]) -> arch-80 layout (int8 [N/2, K], float16 [K/32, N]).

    The same codes, moved: `unpack_codes` then `interleave_codes` of the [K, N] transpose; the same fp16 scale
    bits, regrouped to Paddle's [groups, N] order (a group of 32 k, which Paddle's own API does not offer: it
    accepts -1, 64, 128). Lossless: `cutlass_b32_dequant` of the result equals `dequant_int4_ref` transposed,
    bit for bit, and GPTQ's -8 codes survive (the +8 bias maps -8..7 onto 0..15). K % 64 == 0, N % 8 == 0.
    """
    from .format import check_packed, unpack_codes
    check_packed(packed, scales, N, K)
    if packed.dim() != 2:
        raise ValueError(f"packed must be one [N, K/2] matrix (call per expert), got shape {tuple(packed.shape)}")
    check_layout_dims(K, N)
    codes = unpack_codes(packed).t().contiguous()                   # [K, N]
    return interleave_codes(codes), scales.t().contiguous()


def _check_b32_layout(out, scale) -> tuple[int, int]:
    """Contract of the group-32 layout: int8 out [N/2, K] with float16 scale [K/32, N]; returns (K, N)."""
    from .format import BLOCK
    check_tensor("out", out, (torch.int8,), (2,))
    check_tensor("scale", scale, (torch.float16,), (2,))
    N, K = out.shape[0] * 2, out.shape[1]
    check_layout_dims(K, N)
    if tuple(scale.shape) != (K // BLOCK, N):
        raise ValueError(f"scale must have shape (K/32, N) = ({K // BLOCK}, {N}), got {tuple(scale.shape)}")
    return K, N


def cutlass_b32_to_int4_b32(out: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `int4_b32_to_cutlass`: (int8 [N/2, K], float16 [K/32, N]) -> (uint8 [N, K/2], float16 [N, K/32])."""
    from .format import pack_codes
    K, N = _check_b32_layout(out, scale)
    codes = deinterleave_codes(out, K, N).t().contiguous()          # [N, K]
    return pack_codes(codes), scale.t().contiguous()


def cutlass_b32_dequant(out: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Decode the group-32 layout: float32 [K, N] = code * float(scale[k // 32, n])."""
    from .format import BLOCK
    K, N = _check_b32_layout(out, scale)
    return deinterleave_codes(out, K, N).float() * scale.float().repeat_interleave(BLOCK, dim=0)
