"""The Paddle / TensorRT-LLM int4 layout: three constructions byte-identical, the inverse exact, the converter exact."""
import numpy as np
import pytest
import torch

import int4lab as il
import int4lab.cutlass_converter as cc
import int4lab.cutlass_layout as cl
import lab.chapters.tolerance as tolerance
from int4lab.cutlass_layout import weight_dequantize, weight_quantize

SHAPES = [(64, 8), (128, 24), (192, 40), (256, 136)]          # (K, N): K % 64 == 0, N % 8 == 0


def rand_codes(K, N):
    return torch.randint(-8, 8, (K, N), dtype=torch.int8)


# ------------------------------------------------------------------------------------------------ layout
@pytest.mark.parametrize("K,N", SHAPES)
def test_three_constructions_are_byte_identical(K, N):
    codes = rand_codes(K, N)
    trt = cl.trt_preprocess(codes)
    assert trt.dtype == torch.int8 and trt.shape == (N // 2, K)
    assert torch.equal(cl.paddle_gpu_preprocess(codes, "merged"), trt)
    assert torch.equal(cl.paddle_gpu_preprocess(codes, "map"), trt)
    assert torch.equal(cl.interleave_codes(codes), trt)


@pytest.mark.parametrize("K,N", SHAPES)
def test_nibble_position_formula(K, N):
    codes = rand_codes(K, N)
    nib = cl._unpack_bytes(cl.trt_preprocess(codes).reshape(-1).view(torch.uint8)).to(torch.int16)
    pos = cl.nibble_positions(K, N)
    assert torch.equal(torch.sort(pos.reshape(-1)).values, torch.arange(K * N))      # a bijection
    assert torch.equal((nib[pos] - 8).to(torch.int8), codes)


@pytest.mark.parametrize("K,N", SHAPES)
def test_deinterleave_inverts_exactly(K, N):
    codes = rand_codes(K, N)
    assert torch.equal(cl.deinterleave_codes(cl.interleave_codes(codes), K, N), codes)
    assert torch.equal(cl.row_major_decode(cl.row_major_codes(codes), K, N), codes)


def test_every_step_moves_each_nibble_once():
    K, N = 128, 16
    for stage in (cl.pack_along_n, cl.pack_along_k,
                  lambda c: cl.permute_B_rows_for_mixed_gemm(cl.pack_along_n(c)),
                  lambda c: cl.subbyte_transpose(cl.pack_along_n(c)),
                  lambda c: cl.paddle_permute(cl.pack_along_k(c), K),
                  lambda c: cl.paddle_permute(cl.pack_along_k(c), K, "map"),
                  cl.trt_preprocess):
        labels = cc.trace_labels(stage, K, N)
        assert torch.equal(torch.sort(labels).values, torch.arange(K * N))


def test_subbyte_transpose_is_a_transpose():
    codes = rand_codes(64, 16)
    t = cl.subbyte_transpose(cl.pack_along_n(codes))                 # [N, K/2], packed along K
    assert torch.equal(t, cl.pack_along_k(codes.t().contiguous().t()).t().contiguous())


def test_permute_index_pr_text_form_equals_merged():
    # The PR writes total_k * 4 * (n / 4) with total_k already halved to K/2; merged code uses K * 2.
    K, N = 256, 16
    k_id = torch.arange(K // 2).view(-1, 1)
    n_id = torch.arange(N).view(1, -1)
    kk = cl.permute_kk(k_id)
    pr = kk % 32 + kk // 32 * 128 + 32 * (n_id % 4) + (K // 2) * 4 * (n_id // 4)
    assert torch.equal(pr, cl.permute_index(kk, n_id, K))


def test_permute_kk_arithmetic_matches_its_table():
    k = torch.arange(64)
    table = torch.tensor([0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15])
    assert torch.equal(cl.permute_kk(k), table[k % 16] + k // 16 * 16)
    assert not torch.equal(cl.permute_kk(k), cl.permute_kk_map(k))   # the later revision factors differently


def test_pr_tables_regenerated():
    t = cc.pr_tables()
    # The PR's tables, as printed in its description: the layout tables traced through our layout code; int8_map is
    # copied from Paddle, and the recipe replayed on it must end at the traced permute_kk.
    assert t["converter_output"] == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
                                     4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31]
    assert t["word_holds"] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert t["pre_dequant"] == [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]
    assert t["before_swap"] == [0, 1, 16, 17, 8, 9, 24, 25, 2, 3, 18, 19, 10, 11, 26, 27,
                                4, 5, 20, 21, 12, 13, 28, 29, 6, 7, 22, 23, 14, 15, 30, 31]
    assert t["int8_index"] == [0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15]
    assert t["permute_kk"] == [0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15]
    assert t["permute_kk_formula"] == t["permute_kk"]
    assert t["int8_regrouped"] == [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
    assert t["int8_mod8x2"] == [0, 4, 8, 12, 2, 6, 10, 14, 0, 4, 8, 12, 2, 6, 10, 14]
    assert t["int8_plus_half"] == t["permute_kk"]
    # the TensorRT-LLM LDSM row map is the converter's output order
    assert list(cl.LDSM_PERM) == t["converter_output"]


# ------------------------------------------------------------------------------------------- converter
def _expected(words: np.ndarray) -> np.ndarray:
    """result[i] = nibble[(0, 4, 1, 5, 2, 6, 3, 7)[i]] - 8, as float16."""
    nib = (words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    return (nib[..., [0, 4, 1, 5, 2, 6, 3, 7]].astype(np.int32) - 8).astype(np.float16)


def test_fast_dequant_exhaustive_per_nibble():
    rng = np.random.default_rng(1)
    for p in range(8):
        base = rng.integers(0, 2 ** 32, size=16, dtype=np.uint64).astype(np.uint32)
        words = (base & ~np.uint32(0xF << (4 * p))) | (np.arange(16, dtype=np.uint32) << np.uint32(4 * p))
        got = cc.fast_dequant(words)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, _expected(words))


def test_fast_dequant_all_16bit_halves():
    # every value of the low 16 bits (nibbles 0-3) with random high bits, and every value of the high 16 bits
    rng = np.random.default_rng(2)
    v = np.arange(2 ** 16, dtype=np.uint32)
    hi = rng.integers(0, 2 ** 16, size=v.size, dtype=np.uint32)
    for words in (v | (hi << np.uint32(16)), hi | (v << np.uint32(16))):
        np.testing.assert_array_equal(cc.fast_dequant(words), _expected(words))


def test_fast_dequant_wrong_constants_are_wrong():
    words = np.arange(0, 2 ** 32, 2 ** 32 // 4096, dtype=np.uint64).astype(np.uint32)
    ok = _expected(words).astype(np.float32)
    # subtracting 1024 (an unbiased variant's constant) leaves the +8 bias on the bottom nibbles
    d = cc.fast_dequant(words, sub_magic=0x6400).astype(np.float32) - ok
    assert set(np.unique(d[..., [0, 1, 4, 5]])) == {8.0} and set(np.unique(d[..., [2, 3, 6, 7]])) == {0.0}
    # adding -64 instead of -72 does the same to the top nibbles
    d = cc.fast_dequant(words, neg_bias=0xD400).astype(np.float32) - ok
    assert set(np.unique(d[..., [2, 3, 6, 7]])) == {8.0}


def test_converter_on_the_layout_yields_codes_in_k_order():
    K, N = 128, 16
    codes = rand_codes(K, N)
    words = cl.interleave_codes(codes).reshape(-1).view(torch.int32)       # little-endian 32-bit words
    halves = torch.from_numpy(cc.fast_dequant(words).astype(np.float32)).reshape(N // 4, K // 64, 4, 64)
    order = cc.k_order_of_words()                                          # k of the t-th half of a 64-run
    for n in range(N):
        for kb in range(K // 64):
            run = halves[n // 4, kb, n % 4]
            assert torch.equal(run, codes[kb * 64 + order, n].float())


def test_converter_nibble_order():
    assert cc.converter_nibble_order() == [0, 4, 1, 5, 2, 6, 3, 7]


# ------------------------------------------------------------------------------------------- quantiser
def test_round_half_away_is_exact():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 2.4999998, 3.0, -7.0])
    assert cl.round_half_away(v).tolist() == [1.0, 2.0, 3.0, -1.0, -3.0, 0.0, 0.0, 2.0, 3.0, -7.0]


def test_quantize_rounds_half_away_and_clamps():
    K, N = 64, 8
    x = torch.zeros(K, N)
    x[0, :] = 7.0                          # amax 7 -> scale 1
    x[1, :] = torch.tensor([2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 6.5, -6.5])
    codes, scale = cl.quantize_codes(x)
    assert scale.tolist() == [1.0] * N
    assert codes[1].tolist() == [3, -3, 1, -1, 2, -2, 7, -7]      # half-to-even would give 2, -2, 0, 0, 2, -2, 6, -6
    assert int(codes.abs().max()) == 7


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_weight_quantize_contract(dtype):
    K, N = 128, 24
    x = torch.randn(K, N).to(dtype)
    out, scale = weight_quantize(x)
    assert out.dtype == torch.int8 and out.shape == (N // 2, K)
    assert scale.dtype == dtype and scale.shape == (N,)
    amax = x.float().abs().amax(0)
    ieee = torch.from_numpy(amax.cpu().numpy() / np.float32(7))              # numpy float32: the IEEE quotient
    assert torch.equal(scale.cpu(), ieee.to(dtype))
    codes = ((x.float() / amax) * 7)
    ref = torch.sign(codes) * torch.floor(codes.abs().double() + 0.5).float()    # float64: no 0.49999997 trap
    assert torch.equal(cl.deinterleave_codes(out, K, N).float(), ref.clamp(-7, 7))
    assert torch.equal(out, cl.trt_preprocess(cl.deinterleave_codes(out, K, N)))


@pytest.mark.parametrize("arch", cl.ARCHS)
@pytest.mark.parametrize("group_size", cl.GROUP_SIZES)
def test_dequantize_is_exact_inverse(arch, group_size):
    K, N = 256, 40
    x = torch.randn(K, N, dtype=torch.bfloat16)
    out, scale = weight_quantize(x, arch=arch, group_size=group_size)
    codes, s = cl.quantize_codes(x, group_size, "gpu" if group_size == -1 else "cpu")
    assert torch.equal(scale, s)
    expect = codes.float() * (s.float() if group_size == -1 else s.float().repeat_interleave(group_size, 0))
    got = weight_dequantize(out, scale, arch=arch, group_size=group_size)
    assert got.dtype == torch.float32 and got.shape == (K, N)
    assert torch.equal(got, expect)
    # and the reconstruction is a good one: within half a step of x
    step = s.float() if group_size == -1 else s.float().repeat_interleave(group_size, 0)
    assert bool(((got - x.float()).abs() <= step * 0.5 + 1e-6 + step * 2 ** -7 * 7).all())


def test_interleaved_archs_share_one_layout_and_70_is_row_major():
    K, N = 128, 16
    x = torch.randn(K, N, dtype=torch.float16)
    ref, _ = weight_quantize(x, arch=80)
    for arch in cl.INTERLEAVED_ARCHS:
        assert torch.equal(weight_quantize(x, arch=arch)[0], ref)
    out70, _ = weight_quantize(x, arch=70)
    codes = cl.deinterleave_codes(ref, K, N)
    # arch 70: byte b of row k holds columns 2b, 2b+1 before the register interleave; check nibble by nibble
    nib = cl._unpack_bytes(out70.reshape(-1).view(torch.uint8)).to(torch.int16).reshape(K, N // 8, 8)
    src = torch.tensor(cl.REG_SRC)
    assert torch.equal((nib - 8).to(torch.int8), codes.reshape(K, N // 8, 8)[:, :, src])


def test_group_scales_shape_and_values():
    K, N, g = 256, 16, 64
    x = torch.randn(K, N, dtype=torch.float16)
    out, scale = weight_quantize(x, group_size=g)
    assert scale.shape == (K // g, N) and scale.dtype == torch.float16
    for j in range(K // g):
        blk = x[j * g:(j + 1) * g].float()
        assert torch.equal(scale[j], (blk.abs().amax(0) / 7).to(torch.float16))
        v = blk / scale[j].float()
        ref = (torch.sign(v) * torch.floor(v.abs().double() + 0.5).float()).clamp(-7, 7)
        assert torch.equal(cl.deinterleave_codes(out, K, N)[j * g:(j + 1) * g].float(), ref)


def test_gpu_and_cpu_rounding_paths_agree_within_one_code():
    x = torch.randn(512, 64, dtype=torch.bfloat16)
    a, sa = cl.quantize_codes(x, -1, "gpu")
    b, sb = cl.quantize_codes(x, -1, "cpu")
    assert torch.equal(sa, sb)
    assert int((a.to(torch.int16) - b.to(torch.int16)).abs().max()) <= 1


def test_zero_column_gives_zero_scale_and_codes():
    x = torch.randn(64, 8)
    x[:, 3] = 0
    out, scale = weight_quantize(x)
    assert scale[3] == 0
    w = weight_dequantize(out, scale)
    assert bool(torch.isfinite(w).all()) and bool((w[:, 3] == 0).all())


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,match", [
    ({"algo": "weight_only_int8"}, ValueError, "algo must be one of"),
    ({"arch": 100}, ValueError, "arch must be one of"),
    ({"arch": "80"}, ValueError, "arch must be one of"),
    ({"arch": True}, ValueError, "arch must be one of"),
    ({"group_size": 32}, ValueError, "group_size must be one of"),
])
def test_weight_quantize_rejects_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        weight_quantize(torch.randn(64, 8), **kwargs)


@pytest.mark.parametrize("x,exc,match", [
    ([[1.0]], TypeError, "x must be a torch.Tensor"),
    (torch.ones(64, 8, dtype=torch.int32), TypeError, "x must have dtype"),
    (torch.ones(2, 64, 8), ValueError, "x must have rank 2"),
    (torch.ones(96, 8), ValueError, "multiple of 64"),
    (torch.ones(64, 12), ValueError, "multiple of 8"),
    (torch.full((64, 8), float("nan")), ValueError, "finite"),
])
def test_weight_quantize_rejects_bad_x(x, exc, match):
    with pytest.raises(exc, match=match):
        weight_quantize(x)


def test_group_size_must_divide_k():
    with pytest.raises(ValueError, match="multiple of group_size=128"):
        weight_quantize(torch.randn(192, 8), group_size=128)


def test_weight_dequantize_rejects_mismatches():
    out, scale = weight_quantize(torch.randn(128, 16))
    with pytest.raises(TypeError, match="out must have dtype"):
        weight_dequantize(out.view(torch.uint8), scale)
    with pytest.raises(ValueError, match=r"out must have shape \(N/2, K\)"):
        weight_dequantize(out, torch.ones(24))
    with pytest.raises(ValueError, match="scale must have rank 1"):
        weight_dequantize(out, scale.view(1, -1))
    with pytest.raises(ValueError, match=r"scale must have shape \(K/group_size, N\)"):
        weight_dequantize(out, torch.ones(3, 16), group_size=64)
    with pytest.raises(ValueError, match="multiple of 64"):
        weight_dequantize(out[:, :96], scale)


def test_pipeline_and_quantiser_argument_checks():
    with pytest.raises(ValueError, match=r"codes must lie in \[-8, 7\]"):
        cl.trt_preprocess(torch.full((64, 8), 9, dtype=torch.int8))
    with pytest.raises(TypeError, match="codes must have dtype"):
        cl.paddle_gpu_preprocess(torch.zeros(64, 8))
    with pytest.raises(ValueError, match="variant must be"):
        cl.paddle_gpu_preprocess(torch.zeros(64, 8, dtype=torch.int8), "fast")
    with pytest.raises(ValueError, match="path must be"):
        cl.quantize_codes(torch.randn(64, 8), -1, "tpu")
    with pytest.raises(ValueError, match="per-channel GPU kernel"):
        cl.quantize_codes(torch.randn(128, 8), 64, "gpu")


def test_weight_quantize_on_device_matches_cpu(device):
    if device == "cpu":
        pytest.skip("compares a CUDA run with the CPU one")
    x = torch.randn(256, 48, dtype=torch.bfloat16)
    for g in (-1, 64):
        out_d, s_d = weight_quantize(x.to(device), group_size=g)
        out_c, s_c = weight_quantize(x, group_size=g)
        assert torch.equal(out_d.cpu(), out_c) and torch.equal(s_d.cpu(), s_c)
        w_d = weight_dequantize(out_d, s_d, group_size=g)
        assert torch.equal(w_d.cpu(), weight_dequantize(out_c, s_c, group_size=g))


# ------------------------------------------------------------ fragment derivation, bias, int4-b32 transcode
def test_ldsm_map_follows_from_the_mma_fragment():
    assert cc.ldsm_perm_from_fragment() == cl.LDSM_PERM
    assert list(cl.LDSM_PERM) == cc.k_order_of_words()[:32].tolist()
    # every (k, n) of the 16x8 B tile is held by exactly one (lane, i)
    held = sorted(cc.mma_b_fragment_k(lane, i) for lane in range(32) for i in range(4))
    assert held == sorted((k, n) for k in range(16) for n in range(8))
    with pytest.raises(ValueError, match="lane"):
        cc.mma_b_fragment_k(32, 0)


def test_bias_is_xor_0x88():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    by_nibble = (((b & 0xF) + 8) & 0xF) | ((((b >> 4) + 8) & 0xF) << 4)
    assert torch.equal(cc.bias_by_xor(b), by_nibble)
    with pytest.raises(TypeError):
        cc.bias_by_xor(b.to(torch.int8))


@pytest.mark.parametrize("K,N", [(64, 8), (128, 24), (256, 40)])
def test_int4_b32_to_cutlass_is_lossless(K, N):
    w = torch.randn(N, K) * torch.logspace(-2, 1, K)
    q = torch.randint(-8, 8, (N, K), dtype=torch.int8)             # -8 included, as GPTQ may emit
    from int4lab.format import pack_codes
    for packed, scales in (il.pack_int4_b32(w), (pack_codes(q), (torch.rand(N, K // 32) + 0.1).half())):
        out, s = cl.int4_b32_to_cutlass(packed, scales, N, K)
        assert out.shape == (N // 2, K) and out.dtype == torch.int8 and s.shape == (K // 32, N)
        assert torch.equal(cl.cutlass_b32_dequant(out, s), il.dequant_int4_ref(packed, scales, N, K).t())
        p2, s2 = cl.cutlass_b32_to_int4_b32(out, s)
        assert torch.equal(p2, packed) and torch.equal(s2, scales)


def test_int4_b32_to_cutlass_rejects_bad_input():
    p, s = il.pack_int4_b32(torch.randn(8, 96))
    with pytest.raises(ValueError, match="multiple of 64"):
        cl.int4_b32_to_cutlass(p, s, 8, 96)
    p, s = il.pack_int4_b32(torch.randn(12, 64))
    with pytest.raises(ValueError, match="multiple of 8"):
        cl.int4_b32_to_cutlass(p, s, 12, 64)
    p, s = il.pack_int4_b32(torch.randn(2, 8, 64))
    with pytest.raises(ValueError, match="one"):
        cl.int4_b32_to_cutlass(p, s, 8, 64)
    out, sc = cl.int4_b32_to_cutlass(*il.pack_int4_b32(torch.randn(8, 64)), 8, 64)
    with pytest.raises(ValueError, match="scale must have shape"):
        cl.cutlass_b32_dequant(out, sc.t().contiguous())
    with pytest.raises(TypeError):
        cl.cutlass_b32_to_int4_b32(out, sc.float())


def test_single_nibble_errors_and_allclose_rule():
    b = np.array([0, -1, 0x7F, -128], dtype=np.int8)
    bad, err = tolerance.single_nibble_errors(b)
    assert bad.shape == err.shape == (4, 2, 15)
    u = bad.view(np.uint8).astype(np.int64)
    orig = b.view(np.uint8).astype(np.int64)[:, None, None]
    # exactly one nibble changed, by the stated amount
    assert np.array_equal((u & 0xF)[:, 0] - (orig & 0xF)[:, 0], err[:, 0])
    assert np.array_equal((u >> 4)[:, 1] - (orig >> 4)[:, 0], err[:, 1])
    assert np.all((u >> 4)[:, 0] == (orig >> 4)[:, 0]) and np.all((u & 0xF)[:, 1] == (orig & 0xF)[:, 0])
    assert not np.any(err == 0)
    # numpy's own rule, element by element
    a, d = np.array([0.0, 3.0, 20.0]), np.array([1.0, 1.0, 5.0])
    assert np.array_equal(tolerance.allclose_passes(a, d, 1.5, 2), np.isclose(a, d, rtol=2, atol=1.5))


def test_admitted_fraction_counts_numpys_rule():
    d, frac = tolerance.admitted_fraction(1.5, 2.0)
    assert d.tolist() == list(range(-128, 128)) and frac.shape == (256,)
    # brute force with numpy's own isclose, one desired byte at a time
    a = np.arange(-128, 128, dtype=np.float64)
    for dv in (-128, -126, -125, -64, 0, 7, 8, 64, 126, 127):
        assert frac[dv + 128] == np.isclose(a, dv, rtol=2, atol=1.5).mean()
    assert d[frac == 1].tolist() == [-128, -127, -126, 127]
    assert frac[64 + 128] == 193 / 256
    with pytest.raises(ValueError, match="atol and rtol"):
        tolerance.admitted_fraction(-1, 2)
