"""Chapter 02's measuring tools: the map coordinates, the in/held-out gains, the OBS identity, the source finder."""
import math

import pytest
import torch

import lab.chapters.gptq_study as gs
from int4lab import gptq


def test_effective_rank_frac_limits():
    K = 64
    assert gs.effective_rank_frac(torch.eye(K)) == pytest.approx(1.0)
    v = torch.randn(K, 1)
    assert gs.effective_rank_frac(v @ v.T) == pytest.approx(1.0 / K)
    # scale-free: skewing the channels does not move it
    x = torch.randn(4096, K, dtype=torch.float64) @ torch.randn(K, K, dtype=torch.float64)
    H = x.T @ x
    D = torch.diag(torch.exp(2 * torch.randn(K, dtype=torch.float64)))
    assert gs.effective_rank_frac(D @ H @ D) == pytest.approx(gs.effective_rank_frac(H), rel=1e-9)
    # dead channels are left out
    Hd = torch.eye(K); Hd[3, 3] = 0
    assert gs.effective_rank_frac(Hd) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive diagonal"):
        gs.effective_rank_frac(torch.zeros(4, 4))


def test_channel_skew_is_std_of_log_rms():
    s = torch.randn(100, dtype=torch.float64)
    H = torch.diag(torch.exp(2 * s))
    assert gs.channel_skew(H) == pytest.approx(float(s.std()), rel=1e-9)


def test_independent_channels_sample_rank():
    K, R = 128, 512
    H = gs.hessian(torch.randn(R, K))
    assert gs.effective_rank_frac(H) == pytest.approx(1 / (1 + K / R), abs=0.03)


def test_gains_in_and_out_of_sample():
    torch.manual_seed(0)
    w = torch.randn(32, 128) * 0.02
    x = torch.randn(512, 128)
    Hc, He = gs.hessian(x[:256]), gs.hessian(x[256:])
    res = gs.packer_errors(w, Hc, He)
    gi, go = gs.gain(res)
    assert res["rtn"]["in"] > 0 and gi == res["gptq"]["in"] / res["rtn"]["in"]
    assert gi < 1 < go                     # R = 2K independent channels: fits in sample, loses held out


def test_obs_step_equals_cholesky_row():
    K = 24
    X = torch.randn(4 * K, K, dtype=torch.float64)
    H = X.T @ X / K + 0.1 * torch.eye(K, dtype=torch.float64)
    U = torch.linalg.cholesky(torch.linalg.inv(H), upper=True)
    err = torch.randn(3, dtype=torch.float64)
    for k in (0, 5, K - 1):
        obs = gs.obs_update(torch.linalg.inv(H[k:, k:]), 0, err)
        assert torch.allclose(obs, -(err / U[k, k]).unsqueeze(1) * U[k, k:].unsqueeze(0), atol=1e-12)
        assert torch.allclose(obs[:, 0], -err)


def test_gnf4_page_example_and_ablation_shapes():
    e = gs.gnf4_page_example(0, N=16, K=64, R=256)
    assert set(e) == {"rtn_in", "gptq_in", "rtn_out", "gptq_out"} and all(math.isfinite(v) for v in e.values())
    rows = gs.ablation(16, 64, [64, 256], [0.01, 1.0], range(1), skew=1.0, shared=0.0, R_eval=256)
    assert [(r["kind"], r["R"], r["damp"]) for r in rows] == [("rows", 64, 0.01), ("rows", 256, 0.01),
                                                             ("damp", 64, 0.01), ("damp", 64, 1.0)]
    m = gs.synthetic_map([0.0], [1.0], range(2), 16, 64, 256)
    assert len(m) == 2 and all(0 < r["erank"] <= 1 for r in m)


def test_source_lines_finds_the_update():
    lines = gs.source_lines(gptq.gptq_quantize, ("err1 = (w_col - wq) / d", "W[:, i2:].addmm_"))
    assert len(lines) == 2 and all(isinstance(n, int) and n > 0 for n, _ in lines)
    assert gs.source_lines(gptq.gptq_quantize, ("no such line",)) == []


def test_paired_map_draws_the_same_layer_and_rows_at_every_skew():
    # the effective rank is scale-free: with the same rows at every skew it is the same, up to float32 rounding
    kw = dict(shared_levels=[1.0], skews=[0.0, 2.0], seeds=range(2), N=16, K=64, R=256)
    for paired in (True, False):
        by = {(r["skew"], r["seed"]): r for r in gs.synthetic_map(**kw, paired=paired)}
        same = [by[(0.0, s)]["erank"] == pytest.approx(by[(2.0, s)]["erank"], rel=1e-3) for s in range(2)]
        assert all(same) if paired else not any(same)
        assert all(by[(0.0, s)]["skew_H"] < 0.5 < by[(2.0, s)]["skew_H"] for s in range(2))


def test_layer_map_accounts_for_every_weight_it_skips():
    # every weight is either measured or listed as skipped, and only for too few rows in a draw
    from transformers import AutoModelForCausalLM
    from int4lab.models.configs import tiny_config
    cfg = tiny_config("mixtral", vocab_size=256, layers=1)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 256, (2, 16))
    skipped = []
    table = gs.layer_map(m, [ids], [ids[:1]], methods=("rtn", "gptq"), min_rows=12, skipped=skipped)
    assert len(table) + len(skipped) == 4 + 2 * cfg.num_local_experts
    assert all(r["rows"] >= 12 for r in table) and all(min(rc, re) < 12 for _, rc, re in skipped)
    assert {r["name"] for r in table} >= {f"layers.0.self_attn.{p}_proj" for p in "qkvo"}
    assert skipped and all(".experts." in n for n, _, _ in skipped)
