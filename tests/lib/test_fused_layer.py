"""The residual add and the next RMSNorm in one launch (kernels/norm.py's add_rms_norm) against its two
transformers roundings, and FusedDecoderLayer as a drop-in: the same bits as the layer's own forward.

Shape legend: R = rows, N = features. Tiny awkward shapes (the CPU interpreter; on CUDA the same tests run there).
"""
import contextlib
import copy

import pytest
import torch

import int4lab.quantize as Q
from int4lab.kernels import ops
from int4lab.kernels.norm import rms_norm
from int4lab.quantize.fused import rms_norm_torch


@pytest.mark.parametrize("R,N", [(1, 33), (3, 96), (2, 300)])
def test_add_rms_norm_is_the_add_then_the_norm(device, R, N):
    x = (torch.randn(R, N) * torch.logspace(-2, 1, N)).bfloat16().to(device)
    res = (torch.randn(R, N) * 3).bfloat16().to(device)
    w = (torch.randn(N) * 0.3 + 1).bfloat16().to(device)
    s, y = ops.add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(s, res + x)                                          # transformers' bf16 add, exactly
    assert torch.equal(y, rms_norm(res + x, w, 1e-5))                       # FusedRMSNorm's bits
    ref = rms_norm_torch((res + x).cpu().double(), w.cpu().double(), 1e-5)
    assert ((y.cpu().double() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-30).all()  # within an ulp of float64


def test_add_rms_norm_refuses_a_mismatched_residual(device):
    x = torch.randn(2, 64).bfloat16().to(device)
    with pytest.raises(ValueError, match="res must be like x"):
        ops.add_rms_norm(x, x[:1], torch.ones(64).bfloat16().to(device), 1e-5)


def test_add_rms_norm_op_passes_opcheck(device):
    x = torch.randn(3, 96, device=device).bfloat16()
    torch.library.opcheck(ops.add_rms_norm_op, (x, torch.randn_like(x), torch.rand(96, device=device).bfloat16(),
                                                1e-5))


@pytest.mark.parametrize("arch", ["olmoe", "mixtral"])
def test_fused_decoder_layer_gives_the_layer_bits(device, arch):
    from test_fused import quantised
    m = quantised(arch, device)
    a = Q.fuse_decode(copy.deepcopy(m), add_norm=False)
    b = Q.fuse_decode(copy.deepcopy(m))
    assert b.int4_fused["add_norm"] == 2 and a.int4_fused["add_norm"] == 0
    ids = torch.randint(0, 256, (1, 3), device=device)
    on = (lambda mod: Q.kernels_on_cpu(mod, True)) if device == "cpu" else (lambda mod: contextlib.nullcontext())
    with torch.no_grad(), on(a), on(b):
        assert torch.equal(a(ids).logits, b(ids).logits)
    with torch.no_grad(), Q.kernels_on_cpu(b, False):                       # no kernels: the layer's own forward
        assert b(ids).logits.shape == (1, 3, 256)
