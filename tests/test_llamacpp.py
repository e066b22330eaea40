"""llama.cpp as judge (lab.llamacpp): token windows, the paired bootstrap, the Q8_0 emulation, and —
where llama-cpp-python is installed — llama.cpp itself scoring our exported GGUF files on our token ids."""
import math

import pytest
import torch

import int4lab as il
from int4lab import export
from lab import llamacpp
from int4lab.corpus import load_split

needs_llama = pytest.mark.skipif(not llamacpp.have_llama_cpp(),
                                 reason=f"llama_cpp not importable: {llamacpp.INSTALL_HINT}")


class _Tok:
    bos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_score_windows_bos_then_consecutive_tokens():
    w = llamacpp.score_windows(_Tok(), "abcdefghij", window=4)
    assert w.tolist() == [[0, 97, 98, 99], [0, 100, 101, 102], [0, 103, 104, 105]]
    with pytest.raises(ValueError, match="window must be an int >= 2"):
        llamacpp.score_windows(_Tok(), "abc", window=1)
    with pytest.raises(ValueError, match="fewer than window - 1"):
        llamacpp.score_windows(_Tok(), "ab", window=8)


def test_paired_bootstrap_recovers_a_known_shift():
    a = torch.rand(200, dtype=torch.float64) + 3
    same = llamacpp.paired_bootstrap(a, a.clone())
    assert same["rel"] == 0 and same["ci95"] == [0.0, 0.0] and same["ci_contains_zero"]
    noise = torch.randn(200, dtype=torch.float64) * 1e-3
    r = llamacpp.paired_bootstrap(a, a + 0.01 + noise)
    assert r["ci95"][0] < math.expm1(0.01 + noise.mean().item()) < r["ci95"][1]
    assert not r["ci_contains_zero"]
    with pytest.raises(ValueError, match="same length"):
        llamacpp.paired_bootstrap(a, a[:-1])


def test_q8_0_activations_match_ggml_rule_in_float64():
    x = torch.randn(5, 96) * torch.logspace(-3, 2, 5).unsqueeze(-1)
    x[2, 32:64] = 0.0                                                       # an all-zero block decodes to 0
    got = llamacpp.q8_0_activations(x)
    xb = x.double().reshape(5, 3, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    d = (amax.float() / 127).half().double()
    q = torch.round(xb.float() * torch.where(amax > 0, 127 / amax.float(), torch.zeros_like(amax.float()))).double()
    assert q.abs().max() <= 127
    want = (q * d).reshape(5, 96)
    assert torch.equal(got.double(), want.float().double())
    assert torch.all(got[2, 32:64] == 0)
    # the fp16 scale: half an fp16 ulp (2^-11 relative) where the scale is a normal fp16 number; below
    # 2^-14 (amax < 127 * 2^-14 ~ 7.8e-3) it is subnormal and loses more, which our float32 scale does not
    _, s32 = il.quant_x_rows_ref(x)
    rel = (s32.half().float() - s32).abs() / s32
    normal = s32 >= 2 ** -14
    assert normal.any() and (~normal).any()
    assert rel[normal].max() <= 2 ** -11
    assert rel[~normal].max() > 2 ** -11


@pytest.fixture(scope="module")
def test_windows():
    tok = il.models.load_tokenizer()
    return llamacpp.score_windows(tok, load_split("test")[:40000], 256)[:2]


@needs_llama
@pytest.mark.parametrize("arch", il.models.ARCHS)
def test_llamacpp_reproduces_the_source_model(arch, tmp_path, test_windows):
    m, tok, _ = export.build_model(arch, None)
    path = export.write_gguf(m, tmp_path / f"{arch}.gguf")
    scorer = llamacpp.LlamaCppScorer(path, 256, threads=2)
    try:
        c = llamacpp.compare(m, scorer, test_windows)["ours"]
        tok_check = llamacpp.tokenizer_agreement(tok, scorer, load_split("test")[:3000])
    finally:
        scorer.close()
    # F32 weights, F32 KV cache: only summation order differs (measured ~5e-5 at most)
    assert c["max_abs_dlogp"] < 1e-3, c["max_abs_dlogp"]
    assert c["top1_agreement"] == 1.0
    assert tok_check["identical"], tok_check


@needs_llama
def test_llamacpp_numerics_explain_the_q4_0_gap(tmp_path, test_windows):
    m, _, _ = export.build_model("olmoe", "rtn", "experts")
    scorer = llamacpp.LlamaCppScorer(export.write_gguf(m, tmp_path / "q.gguf"), 256, threads=2)
    try:
        c = llamacpp.compare(m, scorer, test_windows, variants={"emul": llamacpp.llamacpp_numerics})
        again = llamacpp.compare(m, scorer, test_windows)["ours"]          # after the context manager
    finally:
        scorer.close()
    # same weight bits; emulating llama.cpp's activation side (fp16 Q8_0 scale, float32 outputs) must close
    # most of the per-token gap between the engines
    assert c["emul"]["mean_abs_dlogp"] < 0.25 * c["ours"]["mean_abs_dlogp"], (c["emul"], c["ours"])
    # and leaving the context restores our own numerics exactly
    assert torch.equal(again["nll_ours"], c["ours"]["nll_ours"])
