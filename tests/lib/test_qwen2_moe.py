"""Qwen2-MoE, the architecture added by its record alone (int4lab/archs/qwen2_moe.py): a shared expert (a dense
SwiGLU MLP scaled by sigmoid(shared_expert_gate(x))) beside the routed experts, q/k/v biases. Quantised (RTN
and GPTQ), run through the int4 kernels, measured by the decode step and exported to GGUF, on a tiny random
model (H = 128, I = 64, S = 128, 8 experts, top-2; the record's `tiny` configuration).

Shape legend: R = rows (tokens), H = hidden, I = routed expert width, S = shared expert width, E = experts.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from int4lab.archs import TRAINED, get
from int4lab.format import dequant_int4_ref, pack_int4_b32
from int4lab.models.configs import tiny_config
from int4lab.quantize import Int4Experts, Int4Linear, kernels_on_cpu, quantize_model

from test_quantize import _close, _matmul64

ARCH = get("qwen2_moe")
SHARED = ("gate_proj", "up_proj", "down_proj")


def tiny(seed=0, layers=2, vocab=4096):
    """The record's tiny Qwen2-MoE, random weights, q/k/v biases drawn too (transformers starts them at 0)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(tiny_config("qwen2_moe", vocab_size=vocab, layers=layers)).eval()
    with torch.no_grad():
        for lay in m.model.layers:
            for p in ("q_proj", "k_proj", "v_proj"):
                getattr(lay.self_attn, p).bias.normal_(0, 0.02)
    return m


def _deq(lin: Int4Linear) -> torch.Tensor:
    return dequant_int4_ref(lin.packed, lin.scales, lin.out_features, lin.in_features)


def test_record_holds_the_published_configuration_and_is_not_trained():
    s = ARCH.published_sizes()
    assert (s["hidden"], s["intermediate"], s["shared_intermediate"], s["experts"], s["top_k"]) == \
        (2048, 1408, 5632, 60, 4)
    assert (s["heads"], s["kv_heads"], s["head_dim"], s["layers"], s["vocab"]) == (16, 16, 128, 24, 151936)
    assert ARCH.published.citations and "qwen2_moe" not in TRAINED
    assert ARCH.gguf.arch == "qwen2moe" and not ARCH.gguf.renorm and ARCH.gguf.qkv_bias
    from lab.synth import config_fields, synth_config
    assert config_fields("qwen2_moe", 24) == dict(ARCH.published.config)
    cfg = synth_config("qwen2_moe", 1, "real")
    assert (cfg.shared_expert_intermediate_size, cfg.qkv_bias, cfg.sliding_window) == (5632, True, 0)


def test_rtn_quantises_the_shared_expert_with_the_routed_ones():
    src, m = tiny(), tiny()
    gates = [lay.mlp.shared_expert_gate for lay in m.model.layers]
    m, rep = quantize_model(m, "rtn", "experts", "int8", progress=False)
    assert rep.experts_modules == rep.shared_modules == 2
    for lay, s_lay, g in zip(m.model.layers, src.model.layers, gates):
        assert isinstance(lay.mlp.experts, Int4Experts)
        assert lay.mlp.shared_expert_gate is g and type(g) is nn.Linear         # the gate stays full precision
        assert torch.equal(g.weight, s_lay.mlp.shared_expert_gate.weight)
        for p in SHARED:
            q = getattr(lay.mlp.shared_expert, p)
            want = pack_int4_b32(getattr(s_lay.mlp.shared_expert, p).weight.detach())
            assert isinstance(q, Int4Linear) and torch.equal(q.packed, want[0]) and torch.equal(q.scales, want[1])
        assert type(lay.self_attn.q_proj) is nn.Linear                          # targets "experts": no attention


@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_moe_block_matches_float64_reference(act):
    """The whole block: routed int4 experts + sigmoid(gate) * int4 shared MLP, against float64 arithmetic on
    the dequantised weights with the modules' quantisation points (activations int8 or bf16, bf16 outputs)."""
    m, _ = quantize_model(tiny(), "rtn", "experts", act, progress=False)
    moe = m.model.layers[1].mlp
    R, H = 5, 128
    x = torch.randn(1, R, H)
    with torch.no_grad():
        y = moe(x)[0]
        _, wts, idx = moe.gate(x[0])
        sh = moe.shared_expert
        g, u = (_matmul64(x[0], _deq(getattr(sh, p)), act).float() for p in ("gate_proj", "up_proj"))
        shared = _matmul64(F.silu(g) * u, _deq(sh.down_proj), act).double()
        shared = torch.sigmoid(x[0].double() @ moe.shared_expert_gate.weight.double().t()) * shared
        ex = moe.experts
        I = ex.intermediate_dim
        wgu = dequant_int4_ref(ex.gate_up_packed, ex.gate_up_scales, 2 * I, H)
        wdn = dequant_int4_ref(ex.down_packed, ex.down_scales, H, I)
        routed = torch.zeros(R, H, dtype=torch.float64)
        for r in range(R):
            for j in range(idx.shape[1]):
                e = int(idx[r, j])
                gu = _matmul64(x[0, r:r + 1], wgu[e], act).float()
                h = F.silu(gu[:, :I]) * gu[:, I:]
                routed[r] += wts[r, j].double() * _matmul64(h, wdn[e], act).double()[0]
    ref = routed.to(torch.bfloat16).double() + shared
    assert _close(y, ref, 2 ** -7)


def test_quantised_model_stays_near_source():
    ids = torch.randint(0, 4096, (2, 16))
    with torch.no_grad():
        ref = tiny()(ids).logits
        q = quantize_model(tiny(), "rtn", "experts+attn", "int8", progress=False)[0](ids).logits
    err = (q - ref).abs().max().item()
    assert 0 < err < 0.5 * ref.abs().max().item()


def test_gptq_calibrates_the_shared_expert_on_every_row():
    """GPTQ hooks the shared projections as plain Linears (every token reaches them): on its own calibration
    inputs, the GPTQ-packed shared gate_proj reproduces the float output better than round-to-nearest."""
    calib = torch.randint(0, 4096, (4, 48))
    src = tiny()
    xs = []
    h = src.model.layers[0].mlp.shared_expert.gate_proj.register_forward_pre_hook(
        lambda _m, a: xs.append(a[0].detach().reshape(-1, a[0].shape[-1])))
    with torch.no_grad():
        src(calib)
    h.remove()
    X = torch.cat(xs).double()                                                  # [192, H]
    g, rep = quantize_model(tiny(), "gptq", "experts", "int8", calib_ids=calib, progress=False)
    r, _ = quantize_model(tiny(), "rtn", "experts", "int8", progress=False)
    assert rep.shared_modules == 2
    W = src.model.layers[0].mlp.shared_expert.gate_proj.weight.detach().double()
    err = {k: (X @ (_deq(mm.model.layers[0].mlp.shared_expert.gate_proj).double() - W).t()).norm().item()
           for k, mm in (("gptq", g), ("rtn", r))}
    assert err["gptq"] < err["rtn"], err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors reach the kernels only through Triton's "
                    "interpreter; test_quantize compares the CUDA kernels with the reference on a GPU")
def test_kernels_run_the_shared_expert_as_plain_gemvs():
    """One decode token through the int4 kernels (Triton's interpreter here): the shared MLP's three Int4Linear
    GEMVs and the routed experts, against the modules' CPU reference path."""
    m, _ = quantize_model(tiny(layers=1), "rtn", "experts", "int8", progress=False)
    moe = m.model.layers[0].mlp
    x, xl = torch.randn(1, 1, 128), torch.randn(1, 128)                 # K = H = S = 128 for all three GEMVs
    sh = moe.shared_expert
    with torch.no_grad():
        ref, ref_l = moe(x), {p: getattr(sh, p)(xl) for p in SHARED}
        with kernels_on_cpu(moe):
            got, got_l = moe(x), {p: getattr(sh, p)(xl) for p in SHARED}
    assert _close(got, ref, 2 ** -8)
    for p in SHARED:
        assert _close(got_l[p], ref_l[p], 2 ** -8), p


def test_decode_step_counts_the_shared_expert():
    from lab.decode_step import model as M
    b16 = M.build("qwen2_moe", 1, "tiny", "cpu", torch.float32)
    q, _ = quantize_model(b16, "rtn", "experts", progress=False)
    c = q.config
    H, S = c.hidden_size, c.shared_expert_intermediate_size
    int4 = lambda n, k: n * k // 2 + n * k // 32 * 2                      # noqa: E731  packs + fp16 scales
    b = M.layer_bytes(q, 1, 64, 4.0)
    assert b["shared_expert"] == 2 * int4(S, H) + int4(H, S) + H * 4         # three int4 GEMVs + the fp32 gate
    assert b["total"] == sum(b[k] for k in ("attn_proj", "experts", "shared_expert", "router", "norms", "kv_cache"))


# ---------------------------------------------------------------------------------------------------- GGUF

gguf = pytest.importorskip("gguf", reason="pip install gguf==0.19.0 (a pinned dependency of int4lab)")


def _allowed_names(layers: int) -> set:
    """Every tensor name gguf-py's MODEL_TENSORS lists for llama.cpp's qwen2moe architecture."""
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == "qwen2moe")
    out = set()
    for t in gguf.MODEL_TENSORS[arch]:
        fmt = gguf.TENSOR_NAMES[t]
        out |= {fmt.format(bid=L) for L in range(layers)} if "{bid}" in fmt else {fmt}
    return out


def test_export_round_trip_reads_back_with_gguf(tmp_path):
    from int4lab import export as ex
    m, _ = quantize_model(tiny(), "rtn", "experts+attn", "int8", progress=False)
    path = ex.write_gguf(m, tmp_path / "q2.gguf")
    r = gguf.GGUFReader(str(path))
    f = {k: r.fields[k] for k in r.fields}
    assert bytes(f["general.architecture"].parts[-1]).decode() == "qwen2moe"
    ints = {k: int(f[f"qwen2moe.{k}"].parts[-1][0]) for k in
            ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length")}
    assert ints == {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 64,
                    "expert_shared_feed_forward_length": 128}
    tensors = {t.name: t for t in r.tensors}
    assert {n.rsplit(".", 1)[0] for n in tensors} <= _allowed_names(2)
    decoded, expected = ex.read_q4_0_decoded(path), ex.expected_q4_0(m)
    assert len(expected) == 2 * (4 + 3 + 3) and set(decoded) == set(expected)     # attn, routed, shared
    for name, (p, s) in expected.items():
        ours = dequant_int4_ref(p, s, p.shape[-2], p.shape[-1] * 2).numpy()
        assert np.array_equal(decoded[name].view(np.uint32), ours.view(np.uint32)), name
    lay = m.model.layers[1]
    for p, short in (("q_proj", "q"), ("v_proj", "v")):
        got = np.asarray(tensors[f"blk.1.attn_{short}.bias"].data)
        assert np.array_equal(got, getattr(lay.self_attn, p).bias.detach().numpy())
    assert np.array_equal(np.asarray(tensors["blk.1.ffn_gate_inp_shexp.weight"].data).reshape(1, -1),
                          lay.mlp.shared_expert_gate.weight.detach().numpy())


def test_source_export_and_routing_refusal(tmp_path):
    from int4lab import export as ex
    m = tiny()
    r = gguf.GGUFReader(str(ex.write_gguf(m, tmp_path / "src.gguf")))
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    sh = m.model.layers[0].mlp.shared_expert
    for p, name in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
        assert np.array_equal(t[f"blk.0.ffn_{name}_shexp.weight"], getattr(sh, p).weight.detach().numpy())
    m.config.norm_topk_prob = True
    with pytest.raises(ValueError, match="norm_topk_prob = True.*qwen2moe graph does not renormalise"):
        ex.write_gguf(m, tmp_path / "x.gguf")


def test_decode_step_cli_runs_qwen2_moe(tmp_path):
    """The decode-step driver on the published structure at tiny width (the GPU stage `qwen2moe` of
    lab/gpu_run.sh runs it at Qwen1.5-MoE-A2.7B's widths): bf16, int4 and fused int4 states, eager."""
    import json
    from lab.decode_step import cli
    out = tmp_path / "d.json"
    rc = cli.main(["--arch", "qwen2_moe", "--width", "tiny", "--contexts", "64", "--batches", "1",
                   "--impls", "batched_mm", "--runs", "eager", "--greedy-steps", "2", "--prompt", "4",
                   "--eager-steps", "2", "--eager-warmup", "1", "--eager-samples", "1", "--out", str(out)])
    assert rc == 0
    a = json.loads(out.read_text())["archs"]["qwen2_moe"]
    assert not a["errors"], a["errors"]
    assert a["config"]["shared_expert_intermediate_size"] == 128 and a["config"]["num_experts"] == 60
    b = a["bytes"]["int4 B1 C64"]
    assert b["distinct_experts"] == 4.0 and b["shared_expert"] > 0                  # top-4 of 60, and the shared MLP
    assert b["total"] < a["bytes"]["bf16 B1 C64"]["total"]


def test_synthetic_checkpoint_loads_quantises_saves_and_reloads(tmp_path):
    """lab.synth's hub layout at tiny width, loaded as the gate loads a checkpoint directory, quantised, saved
    and reloaded into a fresh copy: the same logits."""
    from int4lab.gate.models import load_model
    from int4lab.quantize import load_quantized, save_quantized
    from lab.synth import write_checkpoint
    write_checkpoint("qwen2_moe", 2, tmp_path / "ck", "tiny", device="cpu", dtype=torch.float32)
    m, _, _ = load_model(str(tmp_path / "ck"), torch.float32, "cpu")
    q, rep = quantize_model(m, "rtn", "experts+attn", "int8", progress=False)
    assert (rep.experts_modules, rep.shared_modules, rep.attn_modules) == (2, 2, 2)
    save_quantized(q, tmp_path / "q.safetensors")
    back, _ = load_quantized(tmp_path / "q.safetensors", load_model(str(tmp_path / "ck"), torch.float32, "cpu")[0])
    ids = torch.randint(0, 4096, (1, 8))
    with torch.no_grad():
        assert torch.equal(q(ids).logits, back(ids).logits)
