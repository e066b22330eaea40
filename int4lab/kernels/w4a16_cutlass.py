"""W4A16 decode GEMV on the Paddle / TensorRT-LLM int4 layout, dequantised in registers with the magic numbers
of TensorRT-LLM's CUTLASS-extension converter.

Shape legend: R = activation rows (decode batch, 1..16), K = in features, N = out features.

    out = w4a16_cutlass_gemv(x, qweight, scale)     # x [R, K] fp16/bf16, qweight int8 [N/2, K], scale [N]
    out[r, n] = sum_k x[r, k] * (code[k, n] * scale[n])     fp32 accumulation, returned in x.dtype

qweight and scale come from `int4lab.cutlass_layout.weight_quantize(w_t)` with w_t [K, N] (arch 80 layout,
per-channel scales). The layout, per column n, is a 32-byte run per 64 k (see cutlass_layout's docstring):
    word  (n, kb, w) = (n // 4) * (K / 2) + kb * 32 + (n % 4) * 8 + w          (int32 words, w = 0..7)
    half j = 0..7 of that word (converter order) is k = 64 kb + 32 (w // 4) + 2 (w % 4) + 8 (j // 2) + j % 2
In registers, as FastInterleavedAndBiasedNumericArrayConverter does: OR the masked nibbles into the fp16 exponent
of 1024 (0x6400), reinterpret each 16-bit half as fp16, then subtract 1032 (bottom nibbles: 1024 + v - 1032 = v - 8)
or fma by 1/16 and -72 (top nibbles, which sit 4 bits up: (1024 + 16 v) / 16 - 72 = v - 8). No lookup table.
The scale is per channel, so it multiplies the fp32 sum once at the end.

Bytes per call (the floor): read N*K/2 (weights) + 2N (scale) + 2RK (x), write 2RN; at R = 1 the weights are
98.8-99.9 % of it at the bench's shapes, so time ~ N*K/2 / bandwidth. `w4a16_cutlass_bytes` counts it for the bench harness.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_tensor
from ..cutlass_layout import K_MULTIPLE, N_MULTIPLE, weight_dequantize
from .._checks import check_contiguous, check_devices, check_out
from .epilogue import to_bf16_rne

X_DTYPES = (torch.float16, torch.bfloat16)
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_ROWS = 16
MAGIC = tl.constexpr(0x64006400)     # {1024.0, 1024.0} as a half2
BOTTOM = tl.constexpr(0x000F000F)    # nibble 0 of each 16-bit half
TOP = tl.constexpr(0x00F000F0)       # nibble 1 of each 16-bit half


@triton.jit
def _halves(h):
    """uint32 [..] -> (fp16 low half, fp16 high half): a half2 register read as two halves."""
    lo = (h & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (h >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    return lo, hi


@triton.jit
def _dot8(acc, x_ptr, xoff, xmask, v):
    """acc [BR, BN] += sum_w x[r, xoff[r, w]] * v[n, w]; v fp16 [BN, 8], xoff / xmask [BR, 8]."""
    xv = tl.load(x_ptr + xoff, mask=xmask, other=0.0).to(tl.float32)                    # [BR, 8]
    return acc + tl.sum(xv[:, None, :] * v.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def w4a16_cutlass_gemv_kernel(
    # Pointers
    x_ptr, w_ptr, s_ptr, o_ptr,
    # Dimensions
    R, N, K, stride_xr, stride_or,
    # Meta-parameters
    KB_PER_SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ATOMIC: tl.constexpr,
):
    """x [R, K] fp16/bf16; w int32 words of the int4 layout [N*K/8]; s [N]; o [R, N].

    Program (pid_n, pid_k) owns columns [pid_n * BLOCK_N, +BLOCK_N) and 64-k runs [pid_k * KB_PER_SPLIT, +KB_PER_SPLIT);
    it loads 8 words (32 bytes) per column per run. ATOMIC: o is float32 and partial sums are atomically added
    (split-K); otherwise o is written once, in o's dtype.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                    # [BN]
    n_mask = n < N
    r = tl.arange(0, BLOCK_R)                                      # [BR]
    r_mask = r < R
    w = tl.arange(0, 8)                                            # word within a 32-byte run
    wbase = (n // 4).to(tl.int64) * (K // 2) + (n % 4) * 8        # [BN] word 0 of the column's first run
    # half j of word w multiplies x[64 kb + xrow + 8 (j // 2) + j % 2]: the LDSM row map, inverted
    xrow = r[:, None] * stride_xr + (32 * (w // 4) + 2 * (w % 4))[None, :]      # [BR, 8]
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for i in range(0, KB_PER_SPLIT):
        kb = pid_k * KB_PER_SPLIT + i
        live = kb < K // 64                                        # the last split may run short
        wmask = n_mask[:, None] & live
        xmask = r_mask[:, None] & live
        words = tl.load(w_ptr + wbase[:, None] + kb * 32 + w[None, :], mask=wmask, other=0)
        words = words.to(tl.uint32, bitcast=True)                  # [BN, 8]
        top = words >> 8
        h0_lo, h0_hi = _halves((words & BOTTOM) | MAGIC)  # halves 0, 1: 1024 + v
        h1_lo, h1_hi = _halves((words & TOP) | MAGIC)  # halves 2, 3: 1024 + 16 v
        h2_lo, h2_hi = _halves((top & BOTTOM) | MAGIC)  # halves 4, 5
        h3_lo, h3_hi = _halves((top & TOP) | MAGIC)  # halves 6, 7
        xk = x_ptr + kb * 64
        acc = _dot8(acc, xk, xrow + 0, xmask, h0_lo - 1032.0)
        acc = _dot8(acc, xk, xrow + 1, xmask, h0_hi - 1032.0)
        acc = _dot8(acc, xk, xrow + 8, xmask, h1_lo * 0.0625 - 72.0)
        acc = _dot8(acc, xk, xrow + 9, xmask, h1_hi * 0.0625 - 72.0)
        acc = _dot8(acc, xk, xrow + 16, xmask, h2_lo - 1032.0)
        acc = _dot8(acc, xk, xrow + 17, xmask, h2_hi - 1032.0)
        acc = _dot8(acc, xk, xrow + 24, xmask, h3_lo * 0.0625 - 72.0)
        acc = _dot8(acc, xk, xrow + 25, xmask, h3_hi * 0.0625 - 72.0)
    s = tl.load(s_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    acc = acc * s[None, :]
    optr = o_ptr + r[:, None] * stride_or + n[None, :]
    omask = r_mask[:, None] & n_mask[None, :]
    if ATOMIC:
        tl.atomic_add(optr, acc, mask=omask)
    elif o_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(optr, to_bf16_rne(acc), mask=omask)
    else:
        tl.store(optr, acc.to(o_ptr.dtype.element_ty), mask=omask)


def _default_split(n_blocks: int, n_runs: int, device: torch.device) -> int:
    """Enough programs to cover the SMs about four times over; 1 on the interpreter."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(n_runs, -(-4 * sms // n_blocks)))


def w4a16_cutlass_gemv(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None,
                       *, block_n: int = 64, split_k: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """x [R, K] fp16/bf16 (R <= 16, rows contiguous) @ the int4 weight in (qweight int8 [N/2, K], scale [N]) -> [R, N].

    qweight/scale as returned by `weight_quantize(w_t, arch=80)` (per channel, group_size=-1); scale fp16, bf16 or
    fp32. K % 64 == 0, N % 8 == 0. Accumulates in fp32, returns x.dtype (into `out` if given, [R, N] contiguous).
    split_k > 1 splits the K runs across programs and sums them with fp32 atomics (default: chosen from the SM count).
    """
    check_tensor("x", x, X_DTYPES, (2,))
    check_tensor("qweight", qweight, (torch.int8,), (2,))
    check_tensor("scale", scale, SCALE_DTYPES, (1,))
    R, K = x.shape
    N = scale.shape[0]
    if not 1 <= R <= MAX_ROWS:
        raise ValueError(f"x must have 1..{MAX_ROWS} rows (a decode GEMV), got R = {R}")
    if K <= 0 or K % K_MULTIPLE:
        raise ValueError(f"x.shape[1] (K) must be a positive multiple of {K_MULTIPLE}, got {K}")
    if N <= 0 or N % N_MULTIPLE:
        raise ValueError(f"scale.shape[0] (N) must be a positive multiple of {N_MULTIPLE}, got {N}")
    if tuple(qweight.shape) != (N // 2, K):
        raise ValueError(f"qweight must have shape (N/2, K) = ({N // 2}, {K}), got {tuple(qweight.shape)}")
    if not isinstance(block_n, int) or block_n < 8 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 8, got {block_n!r}")
    dev = check_devices(x=x, qweight=qweight, scale=scale)
    if x.stride(1) != 1:
        raise ValueError(f"x must have a contiguous last dimension (stride 1), got strides {x.stride()}")
    check_contiguous(qweight=qweight, scale=scale)
    out = check_out("out", out, (R, N), x.dtype, dev)
    n_blocks = triton.cdiv(N, block_n)
    n_runs = K // 64
    split = _default_split(n_blocks, n_runs, dev) if split_k is None else split_k
    if not isinstance(split, int) or isinstance(split, bool) or not 1 <= split <= n_runs:
        raise ValueError(f"split_k must be an int in [1, K/64 = {n_runs}], got {split_k!r}")
    per = triton.cdiv(n_runs, split)
    split = triton.cdiv(n_runs, per)                               # no empty programs
    words = qweight.view(torch.int32)
    block_r = triton.next_power_of_2(R)
    if split == 1:
        w4a16_cutlass_gemv_kernel[(n_blocks, 1)](
            x, words, scale, out, R, N, K, x.stride(0), out.stride(0),
            KB_PER_SPLIT=per, BLOCK_R=block_r, BLOCK_N=block_n, ATOMIC=False, num_warps=num_warps)
        return out
    acc = torch.zeros((R, N), dtype=torch.float32, device=dev)
    w4a16_cutlass_gemv_kernel[(n_blocks, split)](
        x, words, scale, acc, R, N, K, x.stride(0), acc.stride(0),
        KB_PER_SPLIT=per, BLOCK_R=block_r, BLOCK_N=block_n, ATOMIC=True, num_warps=num_warps)
    return out.copy_(acc)


def w4a16_cutlass_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 reference [R, N]: x @ weight_dequantize(qweight, scale) (arch 80, per channel)."""
    w = weight_dequantize(qweight.cpu(), scale.cpu())
    return x.cpu().double() @ w.double()


def w4a16_cutlass_bytes(R: int, N: int, K: int, scale_bytes: int = 2, x_bytes: int = 2) -> int:
    """Bytes one call must move at least: weights N*K/2, scales N*scale_bytes, x R*K*x_bytes, out R*N*x_bytes."""
    return N * K // 2 + N * scale_bytes + R * K * x_bytes + R * N * x_bytes
