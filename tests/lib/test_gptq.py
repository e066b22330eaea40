"""GPTQ onto int4-b32 (`int4lab.gptq`) and the notebook-02 calibration helpers (`lab.chapters.calib`).

Shapes stay small (N <= 128, K <= 512): the whole file runs in seconds on a CPU.
"""
import pytest
import torch

from lab.chapters import calib
from int4lab.format import BLOCK, dequant_int4_ref, pack_codes, pack_int4_b32, unpack_codes
from int4lab.clip import DEFAULT_CLIP_GRID, clip_scales, rtn_clip_pack_int4_b32
from int4lab.gptq import HessianAccumulator, gptq_pack_int4_b32, gptq_quantize


def _hessian(x):
    acc = HessianAccumulator(x.shape[-1])
    acc.add(x)
    return acc.H


def _out_mse(x, w, packed, scales):
    N, K = w.shape
    return calib.output_mse(x, w, dequant_int4_ref(packed, scales, N, K))


# ---- format identity -------------------------------------------------------------------------------

@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_bytes_format_and_decode_is_what_gptq_believed(device, act_order, dtype):
    N, K = 48, 256                                                  # 8 groups, two lazy batches of 128
    w = (torch.randn(N, K) * 0.05).to(device=device, dtype=dtype)
    H = _hessian(calib.synthetic_activations(512, K)).to(device)
    packed, scales = gptq_pack_int4_b32(w, H, act_order=act_order)
    rp, rs = pack_int4_b32(w)
    assert packed.shape == rp.shape == (N, K // 2) and packed.dtype == rp.dtype == torch.uint8
    assert scales.shape == rs.shape == (N, K // BLOCK) and scales.dtype == rs.dtype == torch.float16
    assert packed.device == w.device and scales.device == w.device
    r = gptq_quantize(w, H, act_order=act_order)
    assert torch.equal(pack_codes(r.codes), packed) and torch.equal(r.scales, scales)
    assert int(r.codes.min()) >= -8 and int(r.codes.max()) <= 7
    assert torch.equal(unpack_codes(packed), r.codes)
    # the error GPTQ compensated is that of the decoded value, so the decode is exactly what it believed
    deq = dequant_int4_ref(packed, scales, N, K)
    assert torch.equal(deq, r.wq)
    assert torch.isfinite(deq).all() and (scales.float() > 0).all()


def test_loss_is_the_damped_h_objective():
    N, K = 32, 128
    w = torch.randn(N, K)
    H = _hessian(calib.synthetic_activations(400, K))
    r = gptq_quantize(w, H, damp=0.05)
    Hd = H.double().clone()
    Hd.diagonal().add_(r.damp)
    assert r.damp == pytest.approx(0.05 * float(H.diagonal().mean()), rel=1e-6)
    dW = r.wq.double() - w.double()
    assert float(r.loss.double().sum()) == pytest.approx(float(torch.trace(dW @ Hd @ dW.t())), rel=1e-4)


def test_inverse_factor_is_the_reference_three_step_cholesky():
    from int4lab.gptq import _inverse_factor
    K = 96
    H = _hessian(calib.synthetic_activations(200, K)).double()
    U, lam = _inverse_factor(H, 0.01)
    Hd = H + lam * torch.eye(K, dtype=H.dtype)
    ref = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(Hd)), upper=True)
    torch.testing.assert_close(U, ref, rtol=1e-9, atol=1e-12)
    assert torch.equal(U, U.triu())


def test_output_mse_equals_h_objective():
    x = calib.synthetic_activations(300, 64)
    w = torch.randn(16, 64)
    wq = dequant_int4_ref(*pack_int4_b32(w), 16, 64)
    assert calib.output_mse(x, w, wq) == pytest.approx(calib.h_objective(w, wq, _hessian(x)), rel=1e-5)
    d, cross = calib.h_objective_split(w, wq, _hessian(x))
    assert d + cross == pytest.approx(calib.h_objective(w, wq, _hessian(x)), rel=1e-9) and d > 0


# ---- quality ---------------------------------------------------------------------------------------

def test_identity_hessian_weight_mse_close_to_rtn():
    N, K = 128, 512
    w = torch.randn(N, K)
    rtn = dequant_int4_ref(*pack_int4_b32(w), N, K)
    g = dequant_int4_ref(*gptq_pack_int4_b32(w, torch.eye(K)), N, K)
    assert ((g - w) ** 2).mean() <= 1.10 * ((rtn - w) ** 2).mean()


def _regime(name, N=96, K=256, R=1024):
    """(w, x_calib, x_eval): calibration and held-out rows from the same distribution."""
    w = torch.randn(N, K)
    if name == "anisotropic":
        x = calib.synthetic_activations(2 * R, K, skew=1.0)
    elif name == "outlier_weight_columns":
        x = calib.synthetic_activations(2 * R, K, skew=0.0)
        w[:, torch.randperm(K)[:6]] *= 10.0
    else:                                     # a few outlier activation channels
        x = calib.synthetic_activations(2 * R, K, skew=0.0, outliers=4, outlier_scale=20.0)
    return w, x[:R], x[R:]


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("regime", ["anisotropic", "outlier_weight_columns", "outlier_activation_channels"])
def test_gptq_beats_rtn_on_held_out_output_error(regime, act_order):
    w, xc, xe = _regime(regime)
    rtn = _out_mse(xe, w, *pack_int4_b32(w))
    cal = _out_mse(xe, w, *gptq_pack_int4_b32(w, _hessian(xc), act_order=act_order))
    assert cal < 0.95 * rtn, (regime, act_order, cal / rtn)


def test_dead_channels_stay_finite_and_zero():
    N, K = 32, 128
    x = calib.synthetic_activations(256, K)
    dead = torch.tensor([0, 5, 31, 32, 100])
    x[:, dead] = 0
    H = _hessian(x)
    w = torch.randn(N, K)
    for act_order in (False, True):
        r = gptq_quantize(w, H, act_order=act_order)
        assert torch.isfinite(r.wq).all() and torch.isfinite(r.loss).all()
        assert (r.codes[:, dead] == 0).all()       # input always zero: the weight carries nothing
        assert _out_mse(x, w, pack_codes(r.codes), r.scales) < _out_mse(x, w, *pack_int4_b32(w))


def test_not_positive_definite_retries_with_warning():
    N, K = 16, 64
    H = 2.0 * torch.ones(K, K) - 1.5 * torch.eye(K)   # diag 0.5, eigenvalues 2K - 1.5 and -1.5: indefinite,
    #                                                  and still indefinite at damp 1 (+0.5): no borderline case
    w = torch.randn(N, K)
    with pytest.warns(RuntimeWarning, match="not positive definite"):
        r = gptq_quantize(w, H)
    assert r.damp > 1.0 and torch.isfinite(r.wq).all()
    assert torch.equal(dequant_int4_ref(pack_codes(r.codes), r.scales, N, K), r.wq)


# ---- clip-search RTN ---------------------------------------------------------------------------------

def _block_err(w, deq, h=None):
    e = (w - deq) ** 2
    if h is not None:
        e = e * h
    return e.reshape(*w.shape[:-1], -1, BLOCK).sum(-1)


@pytest.mark.parametrize("weighted", [False, True])
def test_clip_search_never_worse_than_rtn_per_block(weighted):
    E, N, K = 2, 32, 256
    w = torch.randn(E, N, K)
    w[..., 7] *= 6.0                                # an outlier per block row: clipping pays off elsewhere
    H = torch.stack([_hessian(calib.synthetic_activations(256, K)) for _ in range(E)]) if weighted else None
    h = H.diagonal(dim1=-2, dim2=-1).unsqueeze(-2) if weighted else None
    rtn = _block_err(w, dequant_int4_ref(*pack_int4_b32(w), N, K), h)
    clip = _block_err(w, dequant_int4_ref(*rtn_clip_pack_int4_b32(w, hessian=H), N, K), h)
    assert (clip <= rtn * (1 + 1e-6)).all()
    assert clip.sum() < 0.95 * rtn.sum()


def test_clip_grid_of_one_is_rtn_bytes():
    w = torch.randn(24, 96, dtype=torch.float16)
    p, s = rtn_clip_pack_int4_b32(w, grid=(1.0,))
    rp, rs = pack_int4_b32(w)
    assert torch.equal(p, rp) and torch.equal(s, rs)
    assert DEFAULT_CLIP_GRID[0] == 1.0 and min(DEFAULT_CLIP_GRID) == pytest.approx(0.7)


# ---- Hessian accumulator ---------------------------------------------------------------------------

def test_accumulator_running_mean(device):
    K = 64
    batches = [torch.randn(3, 5, K, device=device, dtype=torch.bfloat16), torch.randn(7, K, device=device),
               torch.randn(0, K, device=device), torch.randn(11, K, device=device, dtype=torch.float16)]
    acc = HessianAccumulator(K, device="cpu")
    for b in batches:
        acc.add(b)
    X = torch.cat([b.reshape(-1, K).double().cpu() for b in batches])
    assert acc.nsamples == X.shape[0] == 33
    assert acc.H.device.type == "cpu" and acc.H.dtype == torch.float32
    torch.testing.assert_close(acc.H.double(), 2.0 / X.shape[0] * X.t() @ X, rtol=1e-5, atol=1e-5)
    acc2 = HessianAccumulator(K)
    acc2.add(batches[1])
    assert acc2.H.device == batches[1].device


def test_accumulator_bad_inputs():
    with pytest.raises(ValueError, match="in_features must be a positive int"):
        HessianAccumulator(0)
    acc = HessianAccumulator(32)
    with pytest.raises(ValueError, match="no rows yet"):
        acc.H
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., in_features=32\]"):
        acc.add(torch.randn(4, 31))
    with pytest.raises(TypeError, match="x must have dtype"):
        acc.add(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        acc.add([[0.0] * 32])
    with pytest.raises(ValueError, match="x must be finite"):
        acc.add(torch.full((2, 32), float("nan")))


# ---- bad inputs -----------------------------------------------------------------------------------

def test_bad_inputs():
    N, K = 16, 64
    w, H = torch.randn(N, K), torch.eye(K)
    with pytest.raises(ValueError, match="blocksize must be a positive int multiple of 32"):
        gptq_pack_int4_b32(w, H, blocksize=48)
    with pytest.raises(ValueError, match="blocksize must be a positive int multiple of 32"):
        gptq_pack_int4_b32(w, H, blocksize=0)
    with pytest.raises(ValueError, match=r"hessian must have shape \(K, K\) = \(64, 64\)"):
        gptq_pack_int4_b32(w, torch.eye(96))
    with pytest.raises(ValueError, match="hessian must have rank 2"):
        gptq_pack_int4_b32(w, torch.ones(K))
    with pytest.raises(TypeError, match="hessian must be a torch.Tensor"):
        gptq_pack_int4_b32(w, H.numpy())
    with pytest.raises(ValueError, match="w must be finite"):
        gptq_pack_int4_b32(torch.where(torch.rand(N, K) < 0.01, float("nan"), w), H)
    Hbad = H.clone()
    Hbad[3, 3] = float("inf")
    with pytest.raises(ValueError, match="hessian must be finite"):
        gptq_pack_int4_b32(w, Hbad)
    with pytest.raises(ValueError, match="non-negative diagonal"):
        gptq_pack_int4_b32(w, -H)
    Hasym = H.clone()
    Hasym[0, 1] = 0.5
    with pytest.raises(ValueError, match="hessian must be symmetric"):
        gptq_pack_int4_b32(w, Hasym)
    with pytest.raises(ValueError, match="hessian is all zero"):
        gptq_pack_int4_b32(w, torch.zeros(K, K))
    with pytest.raises(ValueError, match="damp must be a finite float >= 0"):
        gptq_pack_int4_b32(w, H, damp=-0.1)
    with pytest.raises(ValueError, match="damp must be a finite float >= 0"):
        gptq_pack_int4_b32(w, H, damp=float("nan"))
    with pytest.raises(TypeError, match="act_order must be a bool"):
        gptq_pack_int4_b32(w, H, act_order="yes")
    with pytest.raises(TypeError, match="w must have dtype"):
        gptq_pack_int4_b32(w.to(torch.int32), H)
    with pytest.raises(ValueError, match="w must have rank 2"):
        gptq_pack_int4_b32(w.unsqueeze(0), H)
    with pytest.raises(ValueError, match=r"w.shape\[-1\] \(K\) must be a positive multiple of 32"):
        gptq_pack_int4_b32(torch.randn(N, 48), torch.eye(48))
    with pytest.raises(ValueError, match="exceeds the float16 maximum"):
        gptq_pack_int4_b32(w * 1e6, H)


def test_clip_bad_inputs():
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match=r"grid must be a non-empty sequence of shrink factors in \(0, 1\]"):
        rtn_clip_pack_int4_b32(w, grid=(1.0, 1.2))
    with pytest.raises(ValueError, match="grid must be a non-empty"):
        rtn_clip_pack_int4_b32(w, grid=())
    with pytest.raises(TypeError, match="grid must be a sequence of floats"):
        rtn_clip_pack_int4_b32(w, grid=("a",))
    with pytest.raises(ValueError, match=r"hessian must have shape \(K, K\)"):
        clip_scales(w, hessian=torch.eye(32))
    with pytest.raises(ValueError, match="non-negative diagonal"):
        clip_scales(w, hessian=-torch.eye(64))
    with pytest.raises(ValueError, match="w must be finite"):
        rtn_clip_pack_int4_b32(torch.full((8, 64), float("inf")))


# ---- per-expert Hessians from a tiny MoE model --------------------------------------------------------

def test_collect_hessians_routes_rows_per_expert():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=96, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = MixtralForCausalLM(cfg).eval()
    ids = [torch.randint(0, 96, (2, 24)) for _ in range(2)]
    # an independent record of what the router chose: the gate's input rows and its top-k ids
    seen = []
    moe = model.model.layers[0].mlp
    h = moe.gate.register_forward_hook(lambda mod, args, out: seen.append((args[0].detach(), out[2])))
    accs = calib.collect_hessians(model, ids)
    h.remove()
    hs = torch.cat([s[0].reshape(-1, 64) for s in seen]).double()
    top = torch.cat([s[1].reshape(-1, 2) for s in seen])
    ex = moe.experts
    for e in range(4):
        xe = hs[(top == e).any(-1)]
        assert accs[f"layers.0.experts.{e}.gate_up"].nsamples == xe.shape[0] > 0
        torch.testing.assert_close(accs[f"layers.0.experts.{e}.gate_up"].H.double(),
                                   2.0 / xe.shape[0] * xe.t() @ xe, rtol=1e-4, atol=1e-6)
        gate, up = (xe @ ex.gate_up_proj[e].detach().double().t()).chunk(2, dim=-1)
        mid = torch.nn.functional.silu(gate) * up
        torch.testing.assert_close(accs[f"layers.0.experts.{e}.down"].H.double(),
                                   2.0 / mid.shape[0] * mid.t() @ mid, rtol=1e-3, atol=1e-6)
        assert calib.model_weight(model, f"layers.0.experts.{e}.down").shape == (64, 32)
    assert accs["layers.0.self_attn.q_proj"].nsamples == 2 * 2 * 24


# ---- pack-time harness -------------------------------------------------------------------------------

def test_bench_pack_rows_and_cli(capsys):
    from lab.bench import pack as bench_pack
    rows = bench_pack.bench_pack([(32, 64)], "cpu", repeats=1)
    assert [r["impl"] for r in rows] == list(bench_pack.IMPLS)
    assert all(r["N"] == 32 and r["K"] == 64 and r["device"] == "cpu" and r["seconds"] > 0 for r in rows)
    assert bench_pack.main(["--shapes", "32x64", "--impls", "gptq", "--repeats", "1", "--no-write"]) == 0
    assert "gptq" in capsys.readouterr().out
    assert bench_pack.receipt_name("cpu") == "gptq_pack_cpu.json"
    with pytest.raises(SystemExit):
        bench_pack.main(["--shapes", "32by64", "--no-write"])
