"""int4-b32 format: byte contract, rounding rules, error bound, edge magnitudes and bad input.

The reference here is a deliberately naive per-element re-reading of the spec (numpy float32 scalars,
Python loops) that shares no code with int4lab.format, so a bug in a shared helper cannot hide.
Shape legend: E = experts, N = out features, K = in features, R = activation rows.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import int4lab as il
from int4lab.format import BLOCK, FP16_MAX, pack_codes, unpack_codes

F32 = np.float32
W_LIMIT = 7 * 65504.0            # largest |w| whose scale amax/7 still fits float16
SUBNORMAL_MIN = 2.0 ** -24       # smallest positive float16
NORMAL_MIN = 2.0 ** -14          # smallest normal float16
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- naive spec re-implementations
def naive_pack(w: torch.Tensor):
    """The format's spec, one element at a time, in numpy float32 scalars. Returns numpy (packed, scales)."""
    a = w.detach().cpu().float().numpy()            # fp16/bf16 -> fp32 widening is exact
    lead, K = a.shape[:-1], a.shape[-1]
    packed = np.zeros(lead + (K // 2,), np.uint8)
    scales = np.zeros(lead + (K // BLOCK,), np.float16)
    for idx in np.ndindex(*lead):
        row = a[idx]
        nib = [0] * K
        for b in range(K // BLOCK):
            amax = F32(0.0)
            for k in range(b * BLOCK, (b + 1) * BLOCK):
                amax = max(amax, abs(F32(row[k])))
            s = max(amax, F32(1e-12)) / F32(7.0)          # float32 scale, clamp then divide
            assert isinstance(s, np.float32)
            for k in range(b * BLOCK, (b + 1) * BLOCK):
                q = float(np.rint(F32(row[k]) / s))       # np.rint: round half to even
                nib[k] = int(min(max(q, -8.0), 7.0)) + 8
            scales[idx + (b,)] = np.float16(s)
        for j in range(K // 2):
            packed[idx + (j,)] = nib[2 * j] | (nib[2 * j + 1] << 4)
    return packed, scales


def naive_quant_x(x: torch.Tensor):
    """quant_x_rows_ref's spec in numpy float32 scalars: s = amax/127 + 1e-12, inv = 1/s,
    q = round_half_to_even(x * inv) (Python's round on the float32 product)."""
    a = x.float().numpy()
    R, K = a.shape
    q = np.zeros((R, K), np.int8)
    s_all = np.zeros((R, K // BLOCK), np.float32)
    for r in range(R):
        for b in range(K // BLOCK):
            blk = [F32(v) for v in a[r, b * BLOCK:(b + 1) * BLOCK]]
            s = max(abs(v) for v in blk) / F32(127) + F32(1e-12)
            s_all[r, b] = s
            inv = F32(1) / s
            for i, v in enumerate(blk):
                q[r, b * BLOCK + i] = int(min(max(round(float(F32(v * inv))), -127), 127))
    return q, s_all


def naive_decode(packed: np.ndarray, scales: np.ndarray):
    """(nib - 8) * float(scale), element by element, in float64 (exact for these products)."""
    lead, K = packed.shape[:-1], packed.shape[-1] * 2
    out = np.zeros(lead + (K,), np.float64)
    for idx in np.ndindex(*lead):
        for k in range(K):
            byte = int(packed[idx + (k // 2,)])
            nib = (byte >> 4) if k % 2 else (byte & 0xF)
            out[idx + (k,)] = (nib - 8) * float(scales[idx + (k // BLOCK,)])
    return out


# ---------------------------------------------------------------- hypothesis strategy
@st.composite
def weights(draw):
    """Random [N, K] or [E, N, K] weights of any accepted dtype, magnitudes from far below fp16's
    subnormals to the largest packable, with one block of adversarial hypothesis-chosen floats."""
    lead = draw(st.sampled_from([(), (1,), (2,), (3,)]))
    N, K = draw(st.integers(1, 3)), BLOCK * draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
    w = torch.randn(lead + (N, K), generator=g, dtype=torch.float64)
    w *= 2.0 ** draw(st.integers(-45, 16))
    # one row of blocks at a different magnitude: blocks are independent, so mixing scales must not leak
    w.view(-1, K)[0] *= 2.0 ** draw(st.integers(-20, 20))
    special = draw(st.lists(st.floats(-W_LIMIT, W_LIMIT, width=32), min_size=BLOCK, max_size=BLOCK))
    flat = w.view(-1, K)
    b = draw(st.integers(0, K // BLOCK - 1))
    flat[draw(st.integers(0, flat.shape[0] - 1)), b * BLOCK:(b + 1) * BLOCK] = torch.tensor(special, dtype=torch.float64)
    lim = W_LIMIT if dtype == torch.float32 else 65504.0   # fp16/bf16 cannot hold 7 * 65504
    return w.clamp(-lim, lim).to(dtype)


# ---------------------------------------------------------------- the byte contract
@PROPS
@given(weights())
def test_pack_matches_naive_spec_byte_for_byte(w):
    packed, scales = il.pack_int4_b32(w)
    ref_p, ref_s = naive_pack(w)
    assert packed.dtype == torch.uint8 and scales.dtype == torch.float16
    assert tuple(packed.shape) == w.shape[:-1] + (w.shape[-1] // 2,)
    assert tuple(scales.shape) == w.shape[:-1] + (w.shape[-1] // BLOCK,)
    np.testing.assert_array_equal(packed.numpy(), ref_p)
    np.testing.assert_array_equal(scales.view(torch.int16).numpy(), ref_s.view(np.int16))   # bit-identical


@PROPS
@given(weights())
def test_reconstruction_within_half_step_plus_scale_rounding(w):
    """|w - ŵ| <= s/2 + 7 |s - s16|: half a grid step of the float32 scale s, plus the fp16 rounding of s
    times the largest code RTN emits. Holds everywhere, including scales that underflow to 0."""
    N, K = w.shape[-2:]
    packed, scales = il.pack_int4_b32(w)
    deq = il.dequant_int4_ref(packed, scales, N, K).double()
    wd = w.double()
    amax = wd.reshape(*w.shape[:-1], K // BLOCK, BLOCK).abs().amax(-1)
    s = (amax.float().clamp_min(1e-12) / 7.0).double()           # the float32 scale, as the spec defines it
    s16 = scales.double()
    bound = s * (0.5 + 1e-6) + 7 * (s - s16).abs()                # 1e-6: float32 rounding of w / s
    err = (wd - deq).reshape(*w.shape[:-1], K // BLOCK, BLOCK).abs().amax(-1)
    assert bool((err <= bound).all()), float((err - bound).max())
    np.testing.assert_array_equal(deq.numpy(), naive_decode(packed.numpy(), scales.numpy()))


@PROPS
@given(weights())
def test_round_to_nearest_never_emits_code_minus_8(w):
    codes = unpack_codes(il.pack_int4_b32(w)[0])
    assert int(codes.min()) >= -7 and int(codes.max()) <= 7


def test_minus_8_is_representable_and_decodes():
    """The format holds -8 (nibble 0) even though RTN never picks it; GPTQ and hand-made codes may."""
    q = torch.arange(-8, 8, dtype=torch.int8).repeat(2).reshape(1, 32)
    packed = pack_codes(q)
    assert int(packed[0, 0]) == 0x10                       # nibbles 0 (code -8) low, 1 (code -7) high
    assert torch.equal(unpack_codes(packed), q)
    scales = torch.tensor([[0.25]], dtype=torch.float16)
    deq = il.dequant_int4_ref(packed, scales, 1, 32)
    assert float(deq[0, 0]) == -2.0 and torch.equal(deq, q.float() * 0.25)


def test_nibble_order_hand_constructed():
    # code c at position k has nibble c + 8; byte j = nib[2j] | nib[2j+1] << 4, even k in the low nibble
    q = (torch.arange(64) % 16 - 8).to(torch.int8).reshape(1, 64)
    expected = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] * 4
    assert pack_codes(q)[0].tolist() == expected
    assert torch.equal(unpack_codes(pack_codes(q)), q)
    # the same through the public packer: one spike per block, everything else zero (nibble 8)
    for k in (0, 1, 30, 31, 33):
        w = torch.zeros(1, 64)
        w[0, k] = 3.5                                      # s = 0.5, code 7, nibble 15
        w[0, 63 - k if k < 32 else 0] = -3.5               # other block: code -7, nibble 1
        packed, scales = il.pack_int4_b32(w)
        want = [0x88] * 32
        for kk, nib in ((k, 15), (63 - k if k < 32 else 0, 1)):
            j = kk // 2
            want[j] = (want[j] & 0xF0) | nib if kk % 2 == 0 else (want[j] & 0x0F) | (nib << 4)
        assert packed[0].tolist() == want, k
        assert scales.tolist() == [[0.5, 0.5]]


def test_all_zero_block():
    w = torch.randn(2, 96)
    w[0, 32:64] = 0.0
    packed, scales = il.pack_int4_b32(w)
    assert float(scales[0, 1]) == 0.0                      # 1e-12 / 7 underflows float16 to 0
    assert packed[0, 16:32].tolist() == [0x88] * 16        # code 0 everywhere
    deq = il.dequant_int4_ref(packed, scales, 2, 96)
    assert torch.equal(deq[0, 32:64], torch.zeros(32))
    assert bool((scales[:, [0, 2]] > 0).all()) and bool((scales[1] > 0).all())   # neighbours untouched


def test_ties_round_half_to_even():
    # amax 7 -> s = 1 exactly, so w / s is w itself and every x.5 below is an exact tie
    w = torch.zeros(1, 32)
    ties = [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, -0.5, -1.5, -2.5, -3.5, -4.5, -5.5, -6.5]
    w[0, :len(ties)] = torch.tensor(ties)
    w[0, 31] = 7.0
    packed, scales = il.pack_int4_b32(w)
    assert float(scales[0, 0]) == 1.0
    codes = unpack_codes(packed)[0, :len(ties)].tolist()
    assert codes == [0, 2, 2, 4, 4, 6, 6, 0, -2, -2, -4, -4, -6, -6]


def test_ties_need_true_division_by_the_float32_scale():
    """w = (j + 0.5) * s exactly, for scales that are not powers of two: w / s is an exact tie, while
    w * (1 / s) is often off by an ulp and rounds the other way. The spec says true division."""
    B = 256
    # scales with 16 significant bits, so 7 * s and (j + 0.5) * s are exact in float32
    mant = torch.randint(2 ** 15, 2 ** 16, (B, 1)).double()
    s = mant * 2.0 ** torch.randint(-40, -10, (B, 1)).double()
    j = torch.arange(-7, 7, dtype=torch.float64)                       # ties -6.5 .. 6.5
    w = torch.zeros(B, 32, dtype=torch.float64)
    w[:, :14] = (j + 0.5) * s
    w[:, 31] = 7 * s[:, 0]
    w = w.float()
    assert torch.equal(w.double()[:, :14], (j + 0.5) * s)              # the construction is exact
    codes = unpack_codes(il.pack_int4_b32(w)[0])[:, :14]
    want = torch.round(j + 0.5).to(torch.int8).expand(B, 14)          # half to even: 0.5->0, 1.5->2
    assert torch.equal(codes, want)


def test_deterministic_and_blocks_independent():
    w = torch.randn(3, 8, 128)
    p1, s1 = il.pack_int4_b32(w)
    p2, s2 = il.pack_int4_b32(w.clone())
    assert torch.equal(p1, p2) and torch.equal(s1.view(torch.int16), s2.view(torch.int16))
    # packing experts together or one at a time gives the same bytes
    for e in range(3):
        pe, se = il.pack_int4_b32(w[e])
        assert torch.equal(pe, p1[e]) and torch.equal(se, s1[e])
    # a non-contiguous view packs like its contiguous copy
    wt = torch.randn(128, 8).t()
    assert torch.equal(il.pack_int4_b32(wt)[0], il.pack_int4_b32(wt.contiguous())[0])


def test_same_bytes_on_every_device(device):
    w = torch.randn(2, 8, 128) * 0.05
    p, s = il.pack_int4_b32(w.to(device))
    assert p.device.type == s.device.type == torch.device(device).type
    p_cpu, s_cpu = il.pack_int4_b32(w)
    assert torch.equal(p.cpu(), p_cpu) and torch.equal(s.cpu(), s_cpu)
    q, xs = il.quant_x_rows_ref(w[0].to(device))
    q_cpu, xs_cpu = il.quant_x_rows_ref(w[0])
    assert torch.equal(q.cpu(), q_cpu) and torch.equal(xs.cpu(), xs_cpu)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_pack_like_their_float32_values(dtype):
    w = (torch.randn(4, 64) * 3).to(dtype)
    p, s = il.pack_int4_b32(w)
    p32, s32 = il.pack_int4_b32(w.float())
    assert torch.equal(p, p32) and torch.equal(s, s32)


# ---------------------------------------------------------------- extreme and tiny magnitudes
def test_largest_packable_magnitude_accepted_and_next_refused():
    w = torch.zeros(1, 32)
    w[0, 5] = W_LIMIT                                      # amax / 7 == 65504 exactly in float32
    packed, scales = il.pack_int4_b32(w)
    assert float(scales[0, 0]) == FP16_MAX
    assert float(il.dequant_int4_ref(packed, scales, 1, 32)[0, 5]) == W_LIMIT
    w[0, 5] = float(np.nextafter(F32(W_LIMIT), F32(np.inf)))
    with pytest.raises(ValueError, match=r"float16 maximum 65504 \(\|w\| must not exceed 458528\)"):
        il.pack_int4_b32(w)
    w[0, 5] = -3e38                                        # finite in float32, far beyond float16
    with pytest.raises(ValueError, match=r"w has a block whose scale"):
        il.pack_int4_b32(w)


def _block_with_scale(s: float) -> torch.Tensor:
    """A [1, 32] float32 block whose float32 scale amax/7 is exactly s (the spike is 7 * s)."""
    w = torch.linspace(-1, 1, 32, dtype=torch.float64) * (7 * s)
    w[3] = 7 * s
    w = w.float()
    assert float(w.abs().max() / 7.0) == pytest.approx(s, rel=1e-6)
    return w.reshape(1, 32)


def test_scale_at_half_the_smallest_subnormal_decodes_to_zero():
    # amax/7 = 2**-25 is a tie between 0 and 2**-24 in float16; ties go to even, i.e. to 0
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 7 * 2.0 ** -25, -3 * 2.0 ** -25
    packed, scales = il.pack_int4_b32(w)
    assert float(scales[0, 0]) == 0.0
    assert unpack_codes(packed)[0, :2].tolist() == [7, -3]     # codes are still chosen, then lost
    assert torch.equal(il.dequant_int4_ref(packed, scales, 1, 32), torch.zeros(1, 32))
    for s in (2.0 ** -26, 2.0 ** -40, 1e-30):
        assert float(il.pack_int4_b32(_block_with_scale(s))[1][0, 0]) == 0.0


def test_scale_just_above_half_subnormal_rounds_up_to_smallest_subnormal():
    # amax/7 in (2**-25, 2**-24) rounds up to 2**-24: the block decodes larger than it was
    for frac in (0.51, 0.75, 0.99):
        w = _block_with_scale(frac * SUBNORMAL_MIN)
        packed, scales = il.pack_int4_b32(w)
        assert float(scales[0, 0]) == SUBNORMAL_MIN
        deq = il.dequant_int4_ref(packed, scales, 1, 32)
        assert float(deq.abs().max()) == 7 * SUBNORMAL_MIN
        rel = float((deq[0, 3] - w[0, 3]) / w[0, 3])        # the spike (code 7): all scale rounding
        assert rel == pytest.approx(1 / frac - 1, rel=1e-5)


@pytest.mark.parametrize("s", [1.5 * SUBNORMAL_MIN, 2.0 ** -20 * 1.37, 2.0 ** -15 * 1.37,
                               NORMAL_MIN * 1.37, 1.37e-3, 1.37e2])
def test_subnormal_scales_lose_relative_precision(s):
    """Scale rounding error |s - s16| / s is at most 2**-11 for normal fp16, but up to 2**-25 / s for a
    subnormal scale (absolute spacing 2**-24): the per-block error bound grows as s shrinks."""
    w = _block_with_scale(s)
    packed, scales = il.pack_int4_b32(w)
    s32, s16 = float(w.abs().max() / 7.0), float(scales[0, 0])
    rel = abs(s16 - s32) / s32
    if s32 >= NORMAL_MIN:
        assert rel <= 2.0 ** -11
    else:
        assert abs(s16 - s32) <= 2.0 ** -25 * (1 + 1e-6)   # half a subnormal step, absolute
    deq = il.dequant_int4_ref(packed, scales, 1, 32).double()
    assert float((deq - w.double()).abs().max()) <= s32 * (0.5 + 1e-6) + 7 * abs(s16 - s32)


# ---------------------------------------------------------------- activation quantisation
@pytest.mark.parametrize("exp", [-40, -20, 0, 10])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quant_x_rows_matches_naive(exp, dtype):
    R, K = 3, 96
    x = torch.randn(R, K) * 2.0 ** exp
    if dtype != torch.float32:
        x = x.clamp(-60000, 60000)
    x = x.to(dtype)
    q, s = il.quant_x_rows_ref(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert q.shape == (R, K) and s.shape == (R, K // BLOCK)
    ref_q, ref_s = naive_quant_x(x)
    np.testing.assert_array_equal(s.numpy(), ref_s)
    np.testing.assert_array_equal(q.numpy(), ref_q)


@PROPS
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=64, max_size=64))
def test_quant_x_rows_matches_naive_on_adversarial_floats(vals):
    x = torch.tensor(vals, dtype=torch.float32).reshape(1, 64)
    q, s = il.quant_x_rows_ref(x)
    ref_q, ref_s = naive_quant_x(x)
    np.testing.assert_array_equal(q.numpy(), ref_q)
    np.testing.assert_array_equal(s.numpy(), ref_s)
    assert int(q.min()) >= -127 and int(q.max()) <= 127


def test_quant_x_rows_clamp_rounding_and_zero_row():
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-127, 127, 32)              # s = 127/127 + 1e-12 = 1.0 in float32
    x[0, 0], x[0, 1], x[0, 2], x[0, 3] = -127.0, 2.5, -2.5, 3.5
    x[0, 32:] = torch.randn(32)
    q, s = il.quant_x_rows_ref(x)
    assert float(s[0, 0]) == 1.0
    assert int(q[0, 0]) == -127 and int(q[0, 31]) == 127     # +-amax land on the ends; -128 never used
    assert int(q[0, 1]) == 2 and int(q[0, 2]) == -2 and int(q[0, 3]) == 4   # rint(v * 1/s): ties to even
    assert int(q[0, 32:].abs().max()) == 127
    # an all-zero row keeps a finite scale (1e-12) and codes 0
    assert torch.equal(q[1], torch.zeros(64, dtype=torch.int8))
    assert s[1].tolist() == [float(F32(1e-12))] * 2


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("w, err, msg", [
    ([[1.0] * 32], TypeError, "w must be a torch.Tensor"),
    (np.ones((2, 32), np.float32), TypeError, "w must be a torch.Tensor"),
    (torch.ones(2, 32, dtype=torch.int32), TypeError, "w must have dtype"),
    (torch.ones(2, 32, dtype=torch.uint8), TypeError, "w must have dtype"),
    (torch.ones(2, 32, dtype=torch.float64), TypeError, "w must have dtype"),
    (torch.ones(32), ValueError, "w must have rank 2 or 3"),
    (torch.ones(1, 2, 2, 32), ValueError, "w must have rank 2 or 3"),
    (torch.ones(2, 48), ValueError, r"K\) must be a positive multiple of 32"),
    (torch.ones(2, 0), ValueError, r"K\) must be a positive multiple of 32"),
    (torch.ones(2, 2, 16), ValueError, r"K\) must be a positive multiple of 32"),
])
def test_pack_rejects_bad_input(w, err, msg):
    with pytest.raises(err, match=msg):
        il.pack_int4_b32(w)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_pack_rejects_non_finite(bad, dtype):
    w = torch.randn(2, 3, 64).to(dtype)
    w[1, 2, 40] = bad
    with pytest.raises(ValueError, match="w must be finite"):
        il.pack_int4_b32(w)


def _good_pack(E=None, N=4, K=64):
    w = torch.randn(*(() if E is None else (E,)), N, K)
    return il.pack_int4_b32(w)


@pytest.mark.parametrize("case, err, msg", [
    ("packed_list", TypeError, "packed must be a torch.Tensor"),
    ("packed_int8", TypeError, "packed must have dtype in \\(uint8\\)"),
    ("scales_fp32", TypeError, "scales must have dtype in \\(float16\\)"),
    ("scales_bf16", TypeError, "scales must have dtype in \\(float16\\)"),
    ("packed_rank1", ValueError, "packed must have rank 2 or 3"),
    ("packed_rank4", ValueError, "packed must have rank 2 or 3"),
    ("wrong_N", ValueError, r"packed must have trailing shape \(N, K/2\) = \(5, 32\)"),
    ("wrong_K", ValueError, r"packed must have trailing shape \(N, K/2\) = \(4, 48\)"),
    ("K_not_multiple", ValueError, "K must be a positive multiple of 32"),
    ("N_zero", ValueError, "N must be a positive int"),
    ("N_float", ValueError, "N must be a positive int"),
    ("K_float", ValueError, "K must be a positive int multiple of 32"),
    ("scales_short", ValueError, r"scales must have trailing shape \(N, K/32\) = \(4, 2\)"),
    ("leading_mismatch", ValueError, "packed and scales must have the same leading"),
    ("expert_count_mismatch", ValueError, "packed and scales must have the same leading"),
])
def test_dequant_rejects_bad_input(case, err, msg):
    p, s = _good_pack()
    pe, se = _good_pack(E=2)
    N, K = 4, 64
    args = {
        "packed_list": (p.tolist(), s, N, K),
        "packed_int8": (p.view(torch.int8), s, N, K),
        "scales_fp32": (p, s.float(), N, K),
        "scales_bf16": (p, s.to(torch.bfloat16), N, K),
        "packed_rank1": (p.reshape(-1), s, N, K),
        "packed_rank4": (pe[None], se[None], N, K),
        "wrong_N": (p, s, 5, K),
        "wrong_K": (p, s, N, 96),
        "K_not_multiple": (p, s, N, 48),
        "N_zero": (p, s, 0, K),
        "N_float": (p, s, 4.0, K),
        "K_float": (p, s, N, 64.0),
        "scales_short": (p, s[:, :1], N, K),
        "leading_mismatch": (pe, s, N, K),
        "expert_count_mismatch": (pe, torch.cat([se, se]), N, K),
    }[case]
    with pytest.raises(err, match=msg):
        il.dequant_int4_ref(*args)


def test_dequant_accepts_expert_stacks():
    pe, se = _good_pack(E=3, N=4, K=64)
    assert il.dequant_int4_ref(pe, se, 4, 64).shape == (3, 4, 64)


@pytest.mark.parametrize("x, err, msg", [
    ((1.0,) * 32, TypeError, "x must be a torch.Tensor"),
    (torch.ones(2, 32, dtype=torch.int8), TypeError, "x must have dtype"),
    (torch.ones(32), ValueError, "x must have rank 2"),
    (torch.ones(1, 2, 32), ValueError, "x must have rank 2"),
    (torch.ones(2, 40), ValueError, r"K\) must be a positive multiple of 32"),
    (torch.tensor([[float("nan")] + [0.0] * 31]), ValueError, "x must be finite"),
])
def test_quant_x_rows_rejects_bad_input(x, err, msg):
    with pytest.raises(err, match=msg):
        il.quant_x_rows_ref(x)
