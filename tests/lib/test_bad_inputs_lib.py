"""Library edge cases: packs carry no autograd graph, tensors without data are named, int4_linear refuses
finite activations whose sums would overflow float32 (and still propagates NaN / inf per row), quantize_model
checks its GPTQ settings on entry, and the base model of load_quantized is named when it is not one."""
import math

import pytest
import torch

import int4lab as il
from int4lab.format import dequant_int4_ref

from test_quantize import tiny_model



def test_pack_of_a_weight_that_requires_grad_is_detached():
    w = torch.randn(4, 64, requires_grad=True)
    p, s = il.pack_int4_b32(w)
    assert not s.requires_grad and s.grad_fn is None and not p.requires_grad
    p2, s2 = il.pack_int4_b32(w.detach())
    assert torch.equal(p, p2) and torch.equal(s, s2)


def test_pack_of_a_meta_tensor_names_the_argument():
    with pytest.raises(ValueError, match=r"w must hold data: it is on the meta device"):
        il.pack_int4_b32(torch.ones(2, 32, device="meta"))


@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_int4_linear_refuses_finite_x_beyond_float32_accumulation(device, act):
    """3e38 is finite, but 3e38 * K * 8 * scale overflows: refused with the bound, not answered with NaN."""
    p, s = il.pack_int4_b32(torch.randn(16, 64))
    with pytest.raises(ValueError, match=r"x is out of range for float32 accumulation: max\|x\| = 3e\+38"):
        il.int4_linear(torch.full((1, 64), 3e38, device=device), p.to(device), s.to(device), act=act)


def test_int4_linear_range_bound_admits_large_values_within_it(device):
    """Just inside the bound the output is finite and matches the fp64 reference of the same W4A8 codes."""
    p, s = il.pack_int4_b32(torch.randn(8, 64))
    bound = torch.finfo(torch.float32).max / (64 * 8 * float(s.float().abs().max()))
    x = torch.randn(2, 64)
    x = x / x.abs().max() * bound * 0.5
    y = il.int4_linear(x.to(device), p.to(device), s.to(device)).float().cpu()
    assert y.isfinite().all()
    xq, xs = il.quant_x_rows_ref(x)
    xd = (xq.double().reshape(2, 2, 32) * xs.double()[..., None]).reshape(2, 64)
    ref = xd @ dequant_int4_ref(p, s, 8, 64).double().t()
    assert torch.allclose(y.double(), ref, rtol=1e-2, atol=0)


def test_int4_linear_still_propagates_non_finite_rows(device):
    p, s = il.pack_int4_b32(torch.randn(16, 64))
    x = torch.randn(3, 64)
    x[1, 3] = math.inf
    y = il.int4_linear(x.to(device), p.to(device), s.to(device)).float().cpu()
    assert y.isfinite().all(1).tolist() == [True, False, True]


def _calib():
    return torch.zeros(1, 16, dtype=torch.long)


@pytest.mark.parametrize("kw,match", [({"blocksize": 33}, r"blocksize must be a positive multiple of 32"),
                                      ({"blocksize": 0}, r"blocksize must be"),
                                      ({"batch_size": 0}, r"batch_size must be a positive int"),
                                      ({"batch_size": 1.5}, r"batch_size must be a positive int")])
def test_quantize_model_checks_gptq_settings_on_entry(kw, match, monkeypatch):
    """Checked before any layer is touched, whether or not an expert reaches GPTQ."""
    from int4lab.quantize import driver

    def tripwire(*a, **k):
        raise AssertionError("quantisation started before the settings were checked")
    monkeypatch.setattr(driver, "_quantize_gptq", tripwire)
    with pytest.raises(ValueError, match=match):
        il.quantize_model(tiny_model("olmoe"), "gptq", calib_ids=_calib(), progress=False, **kw)


def test_load_quantized_names_a_base_model_that_is_not_one(tmp_path):
    q, _ = il.quantize_model(tiny_model("olmoe"), progress=False)
    path = tmp_path / "q.safetensors"
    il.save_quantized(q, path)
    for bad in (None, "olmoe", 3):
        with pytest.raises(TypeError, match=r"base_model must be a transformers MoE model"):
            il.load_quantized(path, bad)
