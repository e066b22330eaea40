"""The alternatives chapter 01 measures int4-b32 against: each checked against an independent definition."""
import numpy as np
import pytest
import torch

import int4lab as il
import lab.chapters.format_variants as fv
from int4lab.format import pack_codes
from int4lab.q4_0 import int4_b32_to_q4_0

# bitsandbytes' NF4 table as printed in bitsandbytes/functional.py (get_4bit_type, "nf4"): the data, not the code
BNB_NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
           -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
           0.24611230194568634, 0.33791524171829224, 0.44070982370567322, 0.5626170039176941,
           0.7229568362236023, 1.0]


def test_rtn_dequant_block_32_is_the_format():
    w = torch.randn(48, 320) * torch.logspace(-3, 1, 320)
    p, s = il.pack_int4_b32(w)
    assert torch.equal(fv.rtn_dequant(w, 32), il.dequant_int4_ref(p, s, 48, 320))


@pytest.mark.parametrize("block", [16, 64, 128])
def test_rtn_dequant_error_bound(block):
    w = torch.randn(16, 256, dtype=torch.float64).float()
    wb = w.reshape(16, -1, block)
    s = wb.abs().amax(-1, keepdim=True).double() / 7
    err = (fv.rtn_dequant(w, block).reshape(wb.shape).double() - wb.double()).abs()
    assert bool((err <= s * (0.5 + 7 * 2 ** -11) * (1 + 1e-6)).all())


def test_q4_0_codes_match_gguf_quantiser_byte_for_byte():
    gq = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType
    w = torch.randn(40, 192)
    w[0, :32] = 0                                   # an all-zero block: d = 0
    w[1, :32] = -torch.rand(32)                     # largest magnitude negative: d > 0
    w[2, 5] = 50.0                                  # one outlier
    codes, d = fv.q4_0_codes(w)
    ours = int4_b32_to_q4_0(pack_codes(codes), d, 40, 192).numpy()
    assert np.array_equal(ours, gq.quantize(w.numpy(), GGMLQuantizationType.Q4_0))
    assert int(codes.min()) == -8                   # the level amax/7 never uses


def test_nf4_levels_equal_the_published_table():
    lv = fv.nf4_levels()
    assert lv.shape == (16,) and float(lv[0]) == -1.0 and float(lv[-1]) == 1.0 and 0.0 in lv.tolist()
    assert float((lv - torch.tensor(BNB_NF4, dtype=torch.float64)).abs().max()) < 1e-6


def test_nf4_dequant_picks_the_nearest_level():
    w = torch.randn(8, 128)
    for block, dt in ((64, torch.float32), (32, torch.float16)):
        wh = fv.nf4_dequant(w, block, dt).reshape(8, -1, block)
        amax = w.reshape(8, -1, block).abs().amax(-1, keepdim=True).to(dt).float()
        ratio = wh / amax
        lv = fv.nf4_levels().float()
        assert bool(((ratio.unsqueeze(-1) - lv).abs().min(-1).values < 1e-6).all())     # decodes onto a level
        brute = (w.reshape(8, -1, block) / amax).unsqueeze(-1).sub(lv).abs()
        assert torch.equal(brute.argmin(-1), (ratio.unsqueeze(-1) - lv).abs().argmin(-1))


def test_nf4_int8_levels_give_an_integer_dot_product():
    l8 = fv.nf4_int8_levels()
    assert l8.dtype == torch.int8 and l8.tolist() == [round(127 * v) for v in BNB_NF4]
    w, qx = torch.randn(6, 160), torch.randint(-127, 128, (160,))      # qx: int8 activation codes
    lv = l8.double() / 127
    idx, amax = fv.nf4_codes(w, 32, torch.float16, levels=lv)
    wh = fv.nf4_dequant(w, 32, torch.float16, levels=lv)
    assert torch.equal(wh, (lv.float()[idx] * amax).reshape(w.shape))
    brute = (w.reshape(6, -1, 32) / amax).unsqueeze(-1).sub(lv.float()).abs().argmin(-1)
    assert torch.equal(idx, brute)                                  # nearest of the given levels
    # integer route: int8 levels gathered, an exact integer sum per block, one scale (amax / 127) per block
    block_int = (l8[idx].long() * qx.reshape(5, 32)).sum(-1, keepdim=True)
    y_int = (block_int.double() * amax.double() / 127).sum((-2, -1))
    y_ref = (lv[idx] * amax.double()).reshape(6, 160) @ qx.double()
    assert torch.allclose(y_int, y_ref, rtol=1e-12, atol=0)
    for bad in (torch.zeros(16), torch.linspace(-1, 1, 15), torch.linspace(-2, 2, 16)):
        with pytest.raises(ValueError, match="levels must be 16"):
            fv.nf4_codes(w, 32, levels=bad.double())


def test_codes_dequant_and_relative_errors():
    w = torch.randn(4, 64)
    codes, d = fv.q4_0_codes(w)
    assert torch.equal(fv.codes_dequant(codes, d), il.dequant_int4_ref(pack_codes(codes), d, 4, 64))
    assert fv.rel_weight_err(w, w) == 0.0
    x = torch.randn(10, 64)
    assert fv.rel_output_err(x, w, 2 * w) == pytest.approx(1.0)


def test_mean_ci():
    m, h = fv.mean_ci([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and h == pytest.approx(3.182 * float(torch.tensor([1.0, 2, 3, 4]).std()) / 2)
    with pytest.raises(ValueError, match="at least 2"):
        fv.mean_ci([1.0])
    for df, t in ((11, 2.2010), (12, 2.1788), (20, 2.0860), (30, 2.0423), (120, 1.9799)):   # Student t tables
        v = torch.tensor([0.0, 1.0] * ((df + 1) // 2) + [0.5] * ((df + 1) % 2), dtype=torch.float64)
        assert fv.mean_ci(v.tolist())[1] * (df + 1) ** 0.5 / float(v.std()) == pytest.approx(t, abs=1.5e-3)


def test_bad_inputs():
    w = torch.randn(4, 96)
    with pytest.raises(ValueError, match="multiple of block"):
        fv.rtn_dequant(w, 64)
    with pytest.raises(ValueError, match="positive int"):
        fv.rtn_dequant(w, 0)
    with pytest.raises(ValueError, match="absmax_dtype"):
        fv.nf4_dequant(w, 32, torch.int8)
    with pytest.raises(ValueError, match="multiple of 32"):
        fv.q4_0_codes(torch.randn(4, 48))


@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_q4_0_signed_scale_packs_are_served_by_the_kernels(device, act):
    # Q4_0's rule writes negative scales (half the blocks) and code -8; int4_linear must decode them as
    # dequant_int4_ref does: every output written, within the kernels' 2^-7 tolerance, on awkward sizes
    from lab.chapters import accuracy

    def q4_0_pack(w):
        codes, d = fv.q4_0_codes(w)
        return pack_codes(codes), d

    w = torch.randn(40, 320)
    codes, d = fv.q4_0_codes(w)
    assert bool((d < 0).any()) and bool((d > 0).any()) and bool((codes == -8).any())
    for R in (1, 3):
        r = accuracy.linear_case(R, 40, 320, device, act, pack=q4_0_pack)
        assert r["unwritten"] == 0 and r["rel_err"] <= accuracy.TOLERANCE
