"""The lottery's dither (int4lab/quantize/dither.py): one stream, the same bytes from every implementation and
device — integer torch ops, the Triton kernel (compiled on CUDA, the interpreter on a CPU) and a numpy uint64
reference written here from the definition."""
import numpy as np
import pytest
import torch

from int4lab.format import block_scales, pack_int4_b32, unpack_codes
from int4lab.quantize import dithered_pack
from int4lab.quantize import dither as D

CUDA = torch.cuda.is_available()


def reference(n, seed, dither, offset=0):
    """Module doc's definition in numpy uint64 (wrap-around is numpy's defined behaviour)."""
    i = np.arange(offset, offset + n, dtype=np.uint64)
    u64 = np.uint64
    with np.errstate(over="ignore"):
        z = i * u64(D.GOLDEN) + u64(D.stream_key(seed))
        z = (z ^ (z >> u64(30))) * u64(D.M1)
        z = (z ^ (z >> u64(27))) * u64(D.M2)
        z = z ^ (z >> u64(31))
    k = (z >> u64(40)).astype(np.int64) - (1 << 23)
    return torch.from_numpy(k.astype(np.float32) * np.float32(D.step_scale(dither)))


CASES = [(0, 0, 1), (1, 0, 5003), (16, 2 ** 40 + 7, 1029), (12345, 3 * 2 ** 32 - 5, 2048)]


@pytest.mark.parametrize("seed,offset,n", CASES)
def test_torch_and_triton_give_the_reference_bytes(seed, offset, n):
    ref = reference(n, seed, 0.1, offset)
    assert torch.equal(D.noise_torch(n, seed, 0.1, offset), ref)
    assert torch.equal(D.noise_triton(n, seed, 0.1, offset, "cuda" if CUDA else "cpu").cpu(), ref)
    if CUDA:
        assert torch.equal(D.noise_torch(n, seed, 0.1, offset, "cuda").cpu(), ref)
        assert torch.equal(D.dither_noise(n, seed, 0.1, offset, "cuda").cpu(), ref)


def test_distribution_is_uniform_on_the_dither_interval():
    u = D.noise_torch(1 << 20, 3, 0.25).double()
    assert -0.25 <= float(u.min()) and float(u.max()) < 0.25
    assert abs(float(u.mean())) < 3 * 0.5 / 12 ** 0.5 / 2 ** 10                 # 3 sigma of the mean
    assert float(u.std()) == pytest.approx(0.5 / 12 ** 0.5, rel=3e-3)
    hist = torch.histc(u, bins=16, min=-0.25, max=0.25)                         # flat within 5 sigma
    assert ((hist - 2 ** 16).abs() < 5 * 2 ** 8).all()
    steps = (u / D.step_scale(0.25)).round() - u / D.step_scale(0.25)
    assert float(steps.abs().max()) == 0.0                                       # on the 2**24-point grid
    a, b = D.noise_torch(1 << 16, 1, 0.25).double(), D.noise_torch(1 << 16, 2, 0.25).double()
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.02          # seeds independent
    assert abs(float(torch.corrcoef(torch.stack([a[1:], a[:-1]]))[0, 1])) < 0.02  # neighbours too


def test_stream_positions_make_chunked_packing_whole():
    s = D.DitherStream(5, 0.1)
    first, second = s.noise((3, 7), "cpu"), s.noise((11,), "cpu")
    assert s.position == 32
    assert torch.equal(torch.cat([first.flatten(), second]), reference(32, 5, 0.1))
    w = torch.randn(5, 8, 96)
    whole = dithered_pack(w, 0.1, 5, offset=100)
    parts = [dithered_pack(w[:2], 0.1, 5, 100), dithered_pack(w[2:], 0.1, 5, 100 + 2 * 8 * 96)]
    assert torch.equal(whole[0], torch.cat([parts[0][0], parts[1][0]]))


def test_dithered_pack_rounds_w_over_s_plus_the_noise():
    w = torch.randn(3, 16, 64, dtype=torch.float64).float()
    p, s = dithered_pack(w, 0.3, 9)
    x = w.double().reshape(3, 16, 2, 32) / block_scales(w).double()[..., None]
    u = reference(w.numel(), 9, 0.3).double().reshape(x.shape)
    want = torch.round(x + u).clamp(-8, 7).reshape(w.shape)
    got = unpack_codes(p).double()
    close = ((x + u) - (x + u).floor() - 0.5).abs().reshape(w.shape) < 1e-5      # float32 vs float64 ties
    assert torch.equal(got[~close], want[~close])
    assert torch.equal(s, pack_int4_b32(w)[1])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_dithered_pack_same_bytes_on_cuda_and_cpu():
    w = torch.randn(4, 48, 160)
    a = dithered_pack(w, 0.1, 2, 17)
    b = dithered_pack(w.cuda(), 0.1, 2, 17)
    assert torch.equal(a[0], b[0].cpu()) and torch.equal(a[1], b[1].cpu())


def test_bad_arguments():
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        D.stream_key(-1)
    with pytest.raises(ValueError, match="dither must be a number in"):
        D.noise_torch(4, 1, 0.7)
    with pytest.raises(ValueError, match="offset must be a non-negative int"):
        D.dither_noise(4, 1, 0.1, -3)
