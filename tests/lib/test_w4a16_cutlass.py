"""The W4A16 GEMV on the TensorRT-LLM / Paddle int4 layout: against weight_dequantize + a float64 matmul, poisoned outputs."""
import pytest
import torch
from conftest import poison

from int4lab.cutlass_layout import weight_quantize
from int4lab.kernels.w4a16_cutlass import w4a16_cutlass_bytes, w4a16_cutlass_gemv, w4a16_cutlass_ref

EPS = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}     # half an ulp, relative


def make(R, K, N, dtype, device, wdtype=torch.float16):
    w_t = torch.randn(K, N, device=device).to(wdtype)            # Paddle's [K, N] convention
    qweight, scale = weight_quantize(w_t)
    x = torch.randn(R, K, device=device).to(dtype)
    return x, qweight, scale


def check(out, ref, dtype):
    # fp32 accumulation, one round-to-nearest to dtype at the end: half an ulp of |ref| plus fp32 noise
    err = (out.double().cpu() - ref).abs()
    tol = ref.abs() * EPS[dtype] + 1e-5 * ref.abs().max()
    assert bool((err <= tol).all()), f"max err {float(err.max()):.4g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("R", [1, 16])
def test_matches_reference(R, dtype, device):
    x, q, s = make(R, 128, 72, dtype, device)                     # N = 72: not a multiple of block_n = 64
    out = poison(torch.empty(R, 72, dtype=dtype, device=device))
    got = w4a16_cutlass_gemv(x, q, s, out=out, split_k=1)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    check(got, w4a16_cutlass_ref(x, q, s), dtype)


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_matches_reference(split_k, device):
    # K/64 = 5 runs: split 3 leaves the last program a short range
    x, q, s = make(3, 320, 40, torch.bfloat16, device, wdtype=torch.bfloat16)
    out = poison(torch.empty(3, 40, dtype=torch.bfloat16, device=device))
    got = w4a16_cutlass_gemv(x, q, s, out=out, split_k=split_k, block_n=16)
    check(got, w4a16_cutlass_ref(x, q, s), torch.bfloat16)


def test_default_launch_and_fp32_scale(device):
    x, q, s = make(5, 192, 24, torch.float16, device)
    got = w4a16_cutlass_gemv(x, q, s.float())
    assert got.shape == (5, 24) and got.dtype == torch.float16
    check(got, w4a16_cutlass_ref(x, q, s), torch.float16)


def test_strided_rows_are_read(device):
    x, q, s = make(2, 128, 16, torch.bfloat16, device)
    wide = torch.randn(2, 256, device=device).to(torch.bfloat16)
    wide[:, :128] = x
    got = w4a16_cutlass_gemv(wide[:, :128], q, s)                  # row stride 256
    check(got, w4a16_cutlass_ref(x, q, s), torch.bfloat16)


def test_bytes_floor_is_dominated_by_weights():
    R, N, K = 1, 14336, 4096
    b = w4a16_cutlass_bytes(R, N, K)
    assert b == N * K // 2 + 2 * N + 2 * R * K + 2 * R * N
    assert N * K // 2 / b > 0.99


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda x, q, s: (x.float(), q, s), TypeError, "x must have dtype"),
    (lambda x, q, s: (x.repeat(17, 1)[:17], q, s), ValueError, "1..16 rows"),
    (lambda x, q, s: (x[:, :64], q, s), ValueError, r"qweight must have shape \(N/2, K\)"),
    (lambda x, q, s: (x, q.view(torch.uint8), s), TypeError, "qweight must have dtype"),
    (lambda x, q, s: (x, q, s.view(1, -1)), ValueError, "scale must have rank 1"),
    (lambda x, q, s: (x, q, s.to(torch.int32)), TypeError, "scale must have dtype"),
    (lambda x, q, s: (x, q, s[:12]), ValueError, "multiple of 8"),
    (lambda x, q, s: (torch.cat([x, x[:, :32]], 1), q, s), ValueError, "multiple of 64"),
    (lambda x, q, s: (x.t().contiguous().t(), q, s), ValueError, "contiguous last dimension"),
    (lambda x, q, s: (x, q.t().contiguous().t(), s), ValueError, "qweight must be contiguous"),
])
def test_bad_inputs(mutate, exc, match, device):
    x, q, s = make(2, 128, 16, torch.float16, device)
    with pytest.raises(exc, match=match):
        w4a16_cutlass_gemv(*mutate(x, q, s))


def test_bad_options(device):
    x, q, s = make(2, 128, 16, torch.float16, device)
    with pytest.raises(TypeError, match="out must have dtype"):
        w4a16_cutlass_gemv(x, q, s, out=torch.empty(2, 16, dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="out must have shape"):
        w4a16_cutlass_gemv(x, q, s, out=torch.empty(2, 8, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="split_k must be an int in"):
        w4a16_cutlass_gemv(x, q, s, split_k=0)
    with pytest.raises(ValueError, match="split_k must be an int in"):
        w4a16_cutlass_gemv(x, q, s, split_k=3)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        w4a16_cutlass_gemv(x, q, s, block_n=12)
