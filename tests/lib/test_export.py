"""int4-b32 -> GGUF Q4_0: the transcode, the export, and the byte proof with an outside decoder.

The outside decoder is the `gguf` package (llama.cpp's gguf-py): its reader parses the file and its
reference Q4_0 dequantiser decodes the blocks; every decoded weight must equal `dequant_int4_ref` of our
pack bit for bit (compared as uint32 bit patterns, so -0.0 vs 0.0 or a NaN would show).
"""
import math

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="pip install gguf==0.19.0 (a pinned dependency of int4lab)")

import int4lab as il  # noqa: E402
from int4lab import export as ex  # noqa: E402
from int4lab.q4_0 import Q4_0_BLOCK_BYTES, int4_b32_to_q4_0, q4_0_to_int4_b32  # noqa: E402

Q4_0 = gguf.GGMLQuantizationType.Q4_0


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _random_pack(*lead, N=24, K=96):
    # skewed rows and a few outliers so scales span several binades
    w = torch.randn(*lead, N, K) * torch.logspace(-3, 1, N).unsqueeze(-1)
    w[..., 0, 5] = 40.0
    return il.pack_int4_b32(w)


# ----------------------------------------------------------------------------------------------------
# The transcode (int4lab.q4_0)

@pytest.mark.parametrize("lead", [(), (3,)])
def test_transcode_round_trip_is_lossless(lead):
    packed, scales = _random_pack(*lead)
    blocks = int4_b32_to_q4_0(packed, scales, 24, 96)
    assert blocks.shape == (*lead, 24, 3 * Q4_0_BLOCK_BYTES) and blocks.dtype == torch.uint8
    p2, s2 = q4_0_to_int4_b32(blocks, 24, 96)
    assert torch.equal(p2, packed)
    assert torch.equal(s2.view(torch.int16), scales.view(torch.int16))       # scale bits, not just values


def test_transcode_nibble_order_by_hand():
    # codes q = 0..15 twice: Q4_0 byte j holds element j (low) and element j + 16 (high)
    nib = torch.arange(32, dtype=torch.uint8) % 16
    packed = (nib[0::2] | (nib[1::2] << 4)).reshape(1, 16)
    scales = torch.tensor([[0.5]], dtype=torch.float16)
    blk = int4_b32_to_q4_0(packed, scales, 1, 32)[0]
    assert blk[:2].view(torch.float16).item() == 0.5
    for j in range(16):
        assert blk[2 + j].item() == int(nib[j]) | int(nib[j + 16]) << 4


@pytest.mark.parametrize("lead", [(), (2,)])
def test_gguf_reference_dequantiser_equals_ours_bit_for_bit(lead):
    packed, scales = _random_pack(*lead, N=16, K=128)
    blocks = int4_b32_to_q4_0(packed, scales, 16, 128).numpy()
    theirs = gguf.quants.dequantize(blocks, Q4_0)
    ours = il.dequant_int4_ref(packed, scales, 16, 128).numpy()
    assert theirs.shape == ours.shape
    assert np.array_equal(_bits(theirs), _bits(ours))


def test_gguf_dequantiser_sees_code_minus_8_and_subnormal_scales():
    nib = torch.randint(0, 16, (4, 64), dtype=torch.uint8)
    nib[0, :] = 0                                                           # code -8 everywhere in row 0
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    scales = torch.tensor([[2.0 ** -24, 1.0], [65504.0, 3e-5], [0.1, 7.0], [1e-3, 2.0 ** -14]],
                          dtype=torch.float16)
    theirs = gguf.quants.dequantize(int4_b32_to_q4_0(packed, scales, 4, 64).numpy(), Q4_0)
    ours = il.dequant_int4_ref(packed, scales, 4, 64).numpy()
    assert np.array_equal(_bits(theirs), _bits(ours))
    assert theirs[0, 0] == -8 * 2.0 ** -24


# ----------------------------------------------------------------------------------------------------
# Bad input

def test_q4_0_tensor_refuses_k_not_multiple_of_32():
    packed = torch.zeros(4, 24, dtype=torch.uint8)                            # K = 48
    scales = torch.ones(4, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match="blk.0.attn_q.weight: K = 48"):
        ex.q4_0_tensor("blk.0.attn_q.weight", packed, scales)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_q4_0_tensor_refuses_non_finite_scale(bad):
    packed, scales = _random_pack(N=8, K=64)
    scales[3, 1] = bad
    with pytest.raises(ValueError, match=r"scale at \(3, 1\) .* not finite"):
        ex.q4_0_tensor("w", packed, scales)


def test_q4_0_tensor_refuses_wrong_dtypes():
    packed, scales = _random_pack(N=8, K=64)
    with pytest.raises(TypeError, match="packed must be a uint8"):
        ex.q4_0_tensor("w", packed.to(torch.int16), scales)
    with pytest.raises(TypeError, match="scales must be a float16"):
        ex.q4_0_tensor("w", packed, scales.float())


def test_unmappable_architecture_and_routing_are_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(ValueError, match="unsupported architecture 'llama'"):
        ex.write_gguf(tiny, tmp_path / "x.gguf")
    m = il.models.load_tiny("olmoe")
    m.config.norm_topk_prob = True
    with pytest.raises(ValueError, match="norm_topk_prob = True.*does not renormalise"):
        ex.write_gguf(m, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="ftype must be one of"):
        ex.write_gguf(m, tmp_path / "x.gguf", ftype="bf16")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("extra", [64, -1])
def test_a_vocabulary_other_than_the_tokenizer_is_refused_before_writing(tmp_path, extra):
    m = il.models.load_tiny("olmoe")
    n = ex.read_tokenizer()[-1]
    m.resize_token_embeddings(n + extra, mean_resizing=False)     # a checkpoint with its own vocabulary
    with pytest.raises(ValueError, match=rf"embedding has {n + extra} rows but the tokenizer .* has {n} tokens"):
        ex.write_gguf(m, tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------------
# Mixtral's q/k row permutation: HF rotate-half rope == llama.cpp's adjacent-pair rope on permuted rows

def _rope_half(x, pos, theta=10000.0):           # transformers: rotate halves (x[:d/2], x[d/2:])
    d = x.shape[-1]
    f = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    a = pos * f
    c, s = torch.cos(torch.cat([a, a])), torch.sin(torch.cat([a, a]))
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * c + rot * s


def _rope_pairs(x, pos, theta=10000.0):          # llama.cpp LLAMA_ROPE_TYPE_NORM: rotate (x[2i], x[2i+1])
    d = x.shape[-1]
    a = pos * 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * torch.cos(a) - x1 * torch.sin(a)
    out[..., 1::2] = x0 * torch.sin(a) + x1 * torch.cos(a)
    return out


def test_permute_rows_turns_half_rope_into_pair_rope():
    heads, hd, H = 3, 8, 16
    w, x, pos = torch.randn(heads * hd, H, dtype=torch.float64), torch.randn(H, dtype=torch.float64), 5.0
    hf = _rope_half((w @ x).reshape(heads, hd), pos)
    cpp = _rope_pairs((ex.permute_rows(w, heads) @ x).reshape(heads, hd), pos)
    # scores q.k are what attention uses; the permutation is the same for q and k, so compare per element
    assert torch.allclose(cpp, hf.reshape(heads, 2, hd // 2).transpose(1, 2).reshape(heads, hd), atol=1e-12)


# ----------------------------------------------------------------------------------------------------
# The export, read back with the outside decoder, for all three models

CASES = [(a, s) for a in il.models.ARCHS for s in ("rtn", "gptq")]


def _quantised(arch, scheme):
    """The model to export, experts and attention packed. GPTQ calibrates on a small set (256 tokens in windows
    of 64, for speed) with min_rows=1, so every expert the set routes a row to is a GPTQ pack; at the default
    min_rows (max(H, I)) so small a set would send most experts, and every Mixtral expert, to round-to-nearest."""
    if scheme == "rtn":
        return ex.build_model(arch, "rtn", "experts+attn")[0]
    from int4lab.gate import calibration_ids, load_model
    from int4lab.quantize import quantize_model
    m, tok, _ = load_model(arch, torch.float32, "cpu")
    m, rep = quantize_model(m, "gptq", "experts+attn", "int8", calib_ids=calibration_ids(tok, 256, 64), min_rows=1)
    assert rep.attn_modules == m.config.num_hidden_layers
    assert rep.gptq_experts > 0
    assert all(f["rows"] == 0 for f in rep.fallback)       # round-to-nearest only where no row was routed
    return m


@pytest.mark.parametrize("arch,scheme", CASES, ids=[f"{a}-{s}" for a, s in CASES])
def test_export_q4_0_decodes_bit_for_bit(arch, scheme, tmp_path):
    m = _quantised(arch, scheme)
    path = ex.write_gguf(m, tmp_path / f"{arch}.gguf")
    decoded = ex.read_q4_0_decoded(path)
    expected = ex.expected_q4_0(m)
    L = m.config.num_hidden_layers
    assert len(expected) == L * 7                          # q, k, v, o + gate, up, down experts per layer
    assert set(decoded) == set(expected)
    for name, (packed, scales) in expected.items():
        N, K = packed.shape[-2], packed.shape[-1] * 2
        ours = il.dequant_int4_ref(packed, scales, N, K).numpy()
        assert decoded[name].shape == ours.shape, name
        assert np.array_equal(_bits(decoded[name]), _bits(ours)), f"{name} differs"
    r = gguf.GGUFReader(str(path))
    f = {k: r.fields[k] for k in r.fields}
    arch_name = il.archs.get(arch).gguf.arch
    assert bytes(f["general.architecture"].parts[-1]).decode() == arch_name
    assert int(f[f"{arch_name}.expert_count"].parts[-1][0]) == il.models.expert_shapes(m.config)["experts"]
    assert int(f[f"{arch_name}.block_count"].parts[-1][0]) == L
    assert len(f["tokenizer.ggml.tokens"].data) == m.config.vocab_size


def test_source_export_holds_the_model_exactly(tmp_path):
    m, _, _ = ex.build_model("mixtral", None)
    r = gguf.GGUFReader(str(ex.write_gguf(m, tmp_path / "src.gguf")))
    t = {x.name: x for x in r.tensors}
    assert all(x.tensor_type == gguf.GGMLQuantizationType.F32 for x in r.tensors)
    lay = m.model.layers[1]
    emb = np.asarray(t["token_embd.weight"].data)
    assert np.array_equal(emb, m.model.embed_tokens.weight.detach().numpy())
    # q is written row-permuted for llama.cpp's pair rope; v is not
    q = np.asarray(t["blk.1.attn_q.weight"].data)
    assert np.array_equal(q, ex.permute_rows(lay.self_attn.q_proj.weight.detach(), m.config.num_attention_heads).numpy())
    assert not np.array_equal(q, lay.self_attn.q_proj.weight.detach().numpy())
    assert np.array_equal(np.asarray(t["blk.1.attn_v.weight"].data), lay.self_attn.v_proj.weight.detach().numpy())
    up = np.asarray(t["blk.1.ffn_up_exps.weight"].data)
    I = up.shape[1]                                        # [E, I, H]: the second half of gate_up's rows
    assert np.array_equal(up, lay.mlp.experts.gate_up_proj.detach()[:, I:].numpy())
    assert math.isclose(float(r.fields["llama.attention.layer_norm_rms_epsilon"].parts[-1][0]), 1e-5, rel_tol=1e-6)
