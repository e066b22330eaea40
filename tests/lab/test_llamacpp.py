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


def test_q8_0_codes_round_as_each_ggml_path():
    # a block whose amax is 127: d = 1, id = 127/127 = 1, so 2.5 and -2.5 are exact ties
    x = torch.zeros(1, 64)
    x[0, :5] = torch.tensor([127.0, 2.5, -2.5, 3.5, 0.5])
    x[0, 32:] = torch.linspace(-1, 1, 32)
    q86, d86 = llamacpp.q8_0_codes(x, "x86")
    qref, dref = llamacpp.q8_0_codes(x, "ref")
    assert q86[0, :5].tolist() == [127, 2, -2, 4, 0]               # _MM_ROUND_NEAREST: half to even
    assert qref[0, :5].tolist() == [127, 3, -3, 4, 1]              # roundf: half away from zero
    assert torch.equal(d86, dref) and d86.dtype == torch.float16
    assert float(d86[0, 0]) == 1.0
    # the one magnitude where the "ref" emulation, floor(|v| + 0.5) in float32, is not roundf: 0.5 - 2^-25,
    # the largest float32 below one half (|v| + 0.5 rounds up to 1.0); roundf gives 0 and -0 there
    z = torch.zeros(1, 32)
    z[0, :3] = torch.tensor([127.0, 0.5 - 2 ** -25, -(0.5 - 2 ** -25)])
    assert llamacpp.q8_0_codes(z, "ref")[0][0, :3].tolist() == [127, 1, -1]
    assert llamacpp.q8_0_codes(z, "x86")[0][0, :3].tolist() == [127, 0, 0]
    # away from ties, the x86 codes are ours (quant_x_rows_ref) and only the stored scale differs
    y = torch.randn(16, 256) * torch.logspace(-2, 2, 256)
    ours, s32 = il.quant_x_rows_ref(y)
    q, d = llamacpp.q8_0_codes(y)
    assert torch.equal(q, ours) and torch.equal(d, s32.half())
    with pytest.raises(ValueError, match="path must be one of"):
        llamacpp.q8_0_codes(y, "arm")
    with pytest.raises(ValueError, match="multiple of 32"):
        llamacpp.q8_0_codes(torch.randn(2, 48))


@needs_llama
@pytest.mark.parametrize("path", llamacpp.Q8_0_PATHS)
def test_q8_0_codes_equal_the_installed_ggml_bit_for_bit(path):
    x = torch.randn(12, 512) * torch.logspace(-4, 3, 512)
    x[3, :32] = 0.0
    x[4, :4] = torch.tensor([127.0, 2.5, -2.5, 0.5])               # ties, where the two paths differ
    # (not built to reach |x * id| = 0.5 - 2^-25, where the "ref" emulation is not roundf; see q8_0_codes)
    x[4, 4:32] = 0.0
    q, d = llamacpp.q8_0_codes(x, path)
    gq, gd = llamacpp.ggml_q8_0(x, path)
    assert torch.equal(q, gq) and torch.equal(d.view(torch.int16), gd.view(torch.int16))


def test_paired_bootstrap_resamples_groups():
    a = torch.rand(12, dtype=torch.float64) + 3
    b = a + 0.01 * torch.randn(12, dtype=torch.float64)
    by_window = llamacpp.paired_bootstrap(a, b)
    one_each = llamacpp.paired_bootstrap(a, b, groups=torch.arange(12) * 7)
    assert by_window["ci95"] == one_each["ci95"] and one_each["groups"] == 12
    pairs = llamacpp.paired_bootstrap(a, b, groups=torch.arange(12) // 2)
    assert pairs["groups"] == 6 and pairs["rel"] == by_window["rel"]
    with pytest.raises(ValueError, match="one id per window"):
        llamacpp.paired_bootstrap(a, b, groups=torch.arange(5))
    with pytest.raises(ValueError, match="at least 2 groups"):
        llamacpp.paired_bootstrap(a, b, groups=torch.zeros(12))


def test_window_documents_locates_each_window():
    tok = il.models.load_tokenizer()
    paras = [" ".join(f"word{i}x{j}" for j in range(40)) for i in range(12)]
    text = "\n\n".join(paras)
    docs = ["\n\n".join(paras[i:i + 3]) for i in range(0, 12, 3)]          # four documents of three paragraphs
    W = 16
    ids = llamacpp.score_windows(tok, text, W)
    doc = llamacpp.window_documents(tok, text, W, docs)
    assert doc.shape == (ids.shape[0],) and doc[0] == 0 and doc[-1] == 3
    assert bool((doc[1:] >= doc[:-1]).all()) and set(doc.tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="first paragraph"):
        llamacpp.window_documents(tok, text, W, ["not in the text"])


def test_llamacpp_numerics_ours_bf16_is_our_model_bit_for_bit():
    m, tok, _ = export.build_model("olmoe", "rtn", "experts")
    ids = llamacpp.score_windows(tok, load_split("test")[:4000], 64)[:2]
    base = llamacpp.ours_logprobs(m, ids)
    with llamacpp.llamacpp_numerics("ours", "bf16"):
        same = llamacpp.ours_logprobs(m, ids)
    with llamacpp.llamacpp_numerics():
        other = llamacpp.ours_logprobs(m, ids)
    assert torch.equal(base, same)
    assert not torch.equal(base, other)
    assert torch.equal(llamacpp.ours_logprobs(m, ids), base)                  # leaving the context restores ours
    with pytest.raises(ValueError, match="activations must be one of"):
        with llamacpp.llamacpp_numerics("fp8", "bf16"):
            pass


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
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        llamacpp.LlamaCppScorer(tmp_path / "q.gguf", 256, kv_cache="q8_0")
    # and leaving the context restores our own numerics exactly
    assert torch.equal(again["nll_ours"], c["ours"]["nll_ours"])


def _checkpoint(tmp_path):
    from lab.synth import write_checkpoint
    ck = tmp_path / "ck"
    write_checkpoint("olmoe", 1, ck, "tiny", dtype=torch.float32, device="cpu")
    return ck


def test_a_checkpoint_whose_vocabulary_cannot_be_written_is_refused_before_any_model(tmp_path, capsys, monkeypatch):
    """config.json's vocab_size against the token count of the tokenizer the GGUF would carry, read before any
    weight loads (the judge is never reached)."""
    import json

    def tripwire(*a, **k):
        raise AssertionError("the judge started before the vocabulary was checked")
    monkeypatch.setattr(llamacpp, "judge", tripwire)
    ck = _checkpoint(tmp_path)
    n = export.read_tokenizer(ck)[-1]
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "vocab_size": n + 64}))
    assert llamacpp.main(["--model", str(ck), "--out", str(tmp_path / "l.json")]) == 2
    err = capsys.readouterr().err
    assert f"gives {n + 64} embedding rows" in err and f"has {n} tokens" in err, err
    with pytest.raises(ValueError, match=f"gives {n + 64} embedding rows"):
        llamacpp.gguf_vocabulary(str(ck))
    assert not (tmp_path / "l.json").exists()
    assert llamacpp.gguf_vocabulary("olmoe") is None                      # a small model: this repository's


@needs_llama
def test_judge_writes_a_checkpoints_own_vocabulary(tmp_path):
    """A checkpoint directory's tokenizer.json (here the ids of the two commonest tokens of the checked text
    swapped: same size, another vocabulary) is the one its GGUF carries, so llama.cpp's tokeniser reproduces the
    checkpoint's ids; with this repository's vocabulary written instead, those two ids would differ."""
    import json

    import gguf
    ck = _checkpoint(tmp_path)
    tj = json.loads((ck / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    ids = il.models.load_tokenizer()(load_split("test")[:20000], add_special_tokens=False)["input_ids"]
    a, b = (t for t, _ in sorted(((t, ids.count(i)) for t, i in vocab.items()), key=lambda x: -x[1])[:2])
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (ck / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    assert llamacpp.gguf_vocabulary(str(ck)) == ck
    work = tmp_path / "work"
    work.mkdir()
    out = llamacpp.judge(str(ck), schemes=(), windows=2, threads=2, workdir=work, progress=False)
    assert out["tokenizer_check"]["identical"], out["tokenizer_check"]
    (path,) = work.glob("*.gguf")
    tokens = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
    names = [bytes(tokens.parts[i]).decode() for i in tokens.data]
    assert (names[vocab[a]], names[vocab[b]]) == (a, b)                   # the checkpoint's ids, not this repository's
    assert out["arms"]["source"]["top1_agreement"] == 1.0
