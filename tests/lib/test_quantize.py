"""quantize_model, Int4Linear / Int4Experts numerics, the GPTQ driver, save/load (CPU, tiny random models)."""
import json

import pytest
import torch
import torch.nn as nn

import int4lab.quantize as Q
from int4lab.archs import ARCHS as RECORDS
from int4lab.format import BLOCK, dequant_int4_ref, pack_int4_b32, quant_x_rows_ref
from int4lab.quantize import (Int4Experts, Int4Linear, load_quantized, quantize_model, read_metadata,
                              save_quantized)

ARCHS = ("mixtral", "olmoe", "qwen3_moe")


def tiny_model(arch, seed=0, hidden=64, inter=64, experts=8, layers=2, vocab=256, dtype=torch.float32):
    """A randomly initialised transformers-5 MoE causal LM: E = experts, top-2, H = hidden, I = inter (a shared
    expert, where the architecture has one, 2I wide); an architecture int4lab does not handle gets a Llama."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    if arch in RECORDS:
        k = RECORDS[arch].keys
        # intermediate_size first: where it is not the routed width, it is a dense MLP's (2I, unused)
        sizes = {"intermediate_size": 2 * inter, k.intermediate: inter, k.experts: experts, k.top_k: 2}
        if k.shared_intermediate:
            sizes[k.shared_intermediate] = 2 * inter
        cfg = AutoConfig.for_model(arch, **common, **sizes)
    else:
        cfg = LlamaConfig(intermediate_size=inter, **common)
    cfg.pad_token_id = cfg.bos_token_id = cfg.eos_token_id = 0
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval().to(dtype)


def _deq_rows(q, s):
    return (q.double().reshape(q.shape[0], -1, BLOCK) * s.double()[..., None]).reshape(q.shape[0], -1)


def _matmul64(x, w, act):
    """float64 reference of one projection with the module's quantisation points; bf16 output rounding."""
    xd = _deq_rows(*quant_x_rows_ref(x)) if act == "int8" else x.to(torch.bfloat16).double()
    return (xd @ w.double().t()).to(torch.bfloat16)


def _close(a, b, rel=2 ** -7):
    scale = b.float().abs().max().clamp_min(1e-6)
    return (a.float() - b.float()).abs().max().item() <= rel * scale.item()


# ---------------------------------------------------------------------------------------------- modules

@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_int4_linear_matches_float64_reference(act):
    lin = nn.Linear(96, 40, bias=True)
    q = Int4Linear.from_linear(lin, act)
    w = dequant_int4_ref(q.packed, q.scales, 40, 96)
    x = torch.randn(3, 5, 96)
    y = q(x)
    ref = _matmul64(x.reshape(-1, 96), w, act).float() + lin.bias.detach()
    assert y.shape == (3, 5, 40) and y.dtype == x.dtype
    assert _close(y.reshape(-1, 40), ref, 2 ** -12)       # same bf16 values, then + bias in fp32


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_int4_experts_match_expert_math(arch, act):
    # Reference: the HF experts module itself, its weights replaced by the dequantised int4 weights, fed
    # the same quantisation points (W4A16: x rounded to bf16) -> catches gate/up order and routing weights.
    model = tiny_model(arch)
    ex = model.model.layers[0].mlp.experts
    q = Int4Experts.from_experts(ex, act)
    E, I2, H = ex.gate_up_proj.shape
    R = 7
    x = torch.randn(R, H)
    idx = torch.stack([torch.randperm(E)[:2] for _ in range(R)])            # [R, 2]
    wts = torch.softmax(torch.randn(R, 2), -1)
    y = q(x, idx, wts)

    ref = torch.zeros(R, H, dtype=torch.float64)                             # float64, kernel rounding points
    wgu = dequant_int4_ref(q.gate_up_packed, q.gate_up_scales, I2, H)
    wdn = dequant_int4_ref(q.down_packed, q.down_scales, H, I2 // 2)
    for r in range(R):
        for j in range(2):
            e = int(idx[r, j])
            gu = _matmul64(x[r:r + 1], wgu[e], act).float()
            gate, up = gu[:, :I2 // 2], gu[:, I2 // 2:]
            h = torch.nn.functional.silu(gate) * up
            ref[r] += wts[r, j].double() * _matmul64(h, wdn[e], act).double()[0]
    ref = ref.to(torch.bfloat16)                                             # the block emits bf16
    assert _close(y, ref, 2 ** -12)

    if act == "bf16":   # the HF module on dequantised weights: same math up to the bf16 output roundings
        with torch.no_grad():
            ex.gate_up_proj.copy_(wgu)
            ex.down_proj.copy_(wdn)
            hf = ex(x.to(torch.bfloat16).float(), idx, wts)
        assert _close(y, hf, 2 ** -6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors reach the kernels only through Triton's "
                    "interpreter; on a GPU the test below compares the CUDA kernels with the reference")
def test_int4_experts_kernel_path_matches_reference(monkeypatch):
    # The CUDA branch (int4lab.kernels, here in Triton's interpreter) against the CPU reference branch.
    model = tiny_model("mixtral", experts=4)
    ex = model.model.layers[0].mlp.experts
    q = Int4Experts.from_experts(ex, "int8")
    x = torch.randn(3, 64)
    idx = torch.tensor([[0, 3], [2, 1], [3, 2]])
    wts = torch.softmax(torch.randn(3, 2), -1)
    ref = q(x, idx, wts)
    q.kernels = True                                    # the module's own switch; no global state
    got = q(x, idx, wts)
    # same quantisation points and roundings: equal up to a rare one-ulp flip from fp32 summation order
    assert _close(got, ref, 2 ** -8)
    lins = {a: Int4Linear.from_linear(nn.Linear(64, 32, bias=False), a) for a in ("int8", "bf16")}
    xl = torch.randn(2, 64)
    with Q.kernels_on_cpu(nn.ModuleList(lins.values())):
        got_l = {a: m(xl) for a, m in lins.items()}
    assert all(m.kernels is None for m in lins.values())            # restored on exit
    for a, m in lins.items():
        assert _close(got_l[a], m(xl), 2 ** -8), a


def test_int4_experts_kernel_path_chunks_a_full_forward(monkeypatch):
    """More routed rows than one routing program sorts (a scoring forward at real width: 16384 rows of
    OLMoE/Qwen3) go through the kernels in chunks of whole tokens, with the same result as one call."""
    import int4lab.kernels.grouped as G
    model = tiny_model("mixtral", experts=4)
    q = Int4Experts.from_experts(model.model.layers[0].mlp.experts, "int8")
    q.kernels = True
    x = torch.randn(5, 64)
    idx = torch.tensor([[0, 3], [2, 1], [3, 2], [1, 0], [2, 2]])
    wts = torch.softmax(torch.randn(5, 2), -1)
    whole = q(x, idx, wts)
    monkeypatch.setattr(G, "MAX_ROUTED_ROWS", 4)        # 2 tokens of top-2 per chunk: chunks of 2, 2, 1
    calls = []
    import int4lab.kernels.ops as ops
    real = ops._moe_rows
    monkeypatch.setattr(ops, "_moe_rows", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    chunked = q(x, idx, wts)
    assert calls == [2, 2, 1]
    assert torch.equal(chunked, whole)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: compares the kernels with the CPU reference")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_cuda_kernels_and_cpu_reference_give_same_logits(arch, act):
    model, _ = quantize_model(tiny_model(arch, dtype=torch.bfloat16), "rtn", "experts+attn", act, progress=False)
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        cpu = model(ids).logits.float()
        gpu = model.cuda()(ids.cuda()).logits.float().cpu()
    # bf16 rounding of each projection's output (and fp32 summation order) is the only allowed difference:
    # a few bf16 ulps after 2 layers (the first H200 run measured 0.0117 on 0.67 logits for qwen3_moe)
    assert (gpu - cpu).abs().max().item() <= 8 * 2 ** -8 * cpu.abs().max().item()


# ---------------------------------------------------------------------------------------------- driver

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("targets", ["experts", "experts+attn"])
def test_quantize_model_replaces_exactly_the_intended_modules(arch, targets):
    model = tiny_model(arch)
    routers = [layer.mlp.gate for layer in model.model.layers]
    router_w = [r.weight.detach().clone() for r in routers]
    lm_head, lm_w = model.lm_head, model.lm_head.weight.detach().clone()
    model, rep = quantize_model(model, "rtn", targets, "int8", progress=False)
    for layer, r, w in zip(model.model.layers, routers, router_w):
        assert isinstance(layer.mlp.experts, Int4Experts)
        assert layer.mlp.gate is r and torch.equal(r.weight, w)               # router untouched
        for name in Q.ATTN_PROJ:
            want = Int4Linear if targets == "experts+attn" else nn.Linear
            assert type(getattr(layer.self_attn, name)) is want
    assert model.lm_head is lm_head and torch.equal(lm_head.weight, lm_w)
    assert rep.experts_modules == len(model.model.layers)
    assert rep.attn_modules == (len(model.model.layers) if targets == "experts+attn" else 0)
    n_int4 = sum(isinstance(m, (Int4Linear, Int4Experts)) for m in model.modules())
    assert n_int4 == len(model.model.layers) * (5 if targets == "experts+attn" else 1)
    # the packed experts are exactly pack_int4_b32 of the source weights
    src = tiny_model(arch)
    p, s = pack_int4_b32(src.model.layers[1].mlp.experts.down_proj.detach())
    assert torch.equal(model.model.layers[1].mlp.experts.down_packed, p)
    assert torch.equal(model.model.layers[1].mlp.experts.down_scales, s)


def test_quantized_model_stays_near_source():
    src = tiny_model("olmoe")
    ids = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        ref = src(ids).logits
        q = quantize_model(tiny_model("olmoe"), "rtn", "experts+attn", "int8", progress=False)[0](ids).logits
    err = (q - ref).abs().max().item()
    assert 0 < err < 0.5 * ref.abs().max().item()


def test_lm_head_only_when_asked():
    m, rep = quantize_model(tiny_model("mixtral"), "rtn", "experts", "bf16", lm_head=True, progress=False)
    assert isinstance(m.lm_head, Int4Linear) and rep.lm_head


class _Recorder:
    """Wraps int4lab.gptq.HessianAccumulator and keeps every instance in creation order."""
    made = []

    def __init__(self, real):
        self.real = real

    def __call__(self, *a, **k):
        acc = self.real(*a, **k)
        _Recorder.made.append(acc)
        return acc


def test_gptq_streams_layers_and_reports_fallbacks(monkeypatch):
    import int4lab.quantize.hessian as Hk
    arch, E, L = "mixtral", 4, 2
    _Recorder.made = []
    monkeypatch.setattr(Hk, "HessianAccumulator", _Recorder(Hk.HessianAccumulator))
    calib = torch.randint(0, 256, (4, 32))
    min_rows = 30
    model, rep = quantize_model(tiny_model(arch, experts=E, layers=L), "gptq", "experts+attn", "int8",
                                calib_ids=calib, min_rows=min_rows, progress=False)
    accs = _Recorder.made
    per_layer = [accs[i * len(accs) // L:(i + 1) * len(accs) // L] for i in range(L)]
    rows = {(f["layer"], f["expert"]): f["rows"] for f in rep.fallback}
    assert rep.gptq_experts + len(rep.fallback) == L * E
    assert [sum(r) for r in rep.rows] == [calib.numel() * 2] * L      # every token reaches top-2 experts
    for li in range(L):
        assert len(per_layer[li]) == 4 + 2 * sum(n > 0 for n in rep.rows[li])   # q, k, v, o; routed experts
        for e, n in enumerate(rep.rows[li]):
            assert (n < min_rows) == ((li, e) in rows)
            if (li, e) in rows:
                assert rows[(li, e)] == n
    assert all(isinstance(layer.mlp.experts, Int4Experts) for layer in model.model.layers)

    # Streamed: layer 1 was calibrated on the outputs of the *quantised* layer 0. Recompute layer 1's
    # attention-input Hessian from the final model (quantised layer 0) and from the source model.
    def qkv_hessian(m):
        xs = []
        h = m.model.layers[1].self_attn.q_proj.register_forward_pre_hook(lambda mod, a: xs.append(a[0]))
        with torch.no_grad():
            m(calib, use_cache=False)
        h.remove()
        x = torch.cat([t.reshape(-1, t.shape[-1]).float() for t in xs])
        return 2 * x.t() @ x / x.shape[0]
    H_stream = per_layer[1][0].H
    ref = qkv_hessian(model)
    src = qkv_hessian(tiny_model(arch, experts=E, layers=L))
    assert torch.allclose(H_stream, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    assert not torch.allclose(H_stream, src, rtol=1e-4, atol=1e-5 * src.abs().max().item())


def test_gptq_with_all_experts_below_min_rows_equals_rtn():
    calib = torch.randint(0, 256, (2, 16))
    g, rep = quantize_model(tiny_model("qwen3_moe"), "gptq", "experts", "int8", calib_ids=calib,
                            min_rows=10 ** 6, progress=False)
    r, _ = quantize_model(tiny_model("qwen3_moe"), "rtn", "experts", "int8", progress=False)
    assert rep.gptq_experts == 0 and len(rep.fallback) == 2 * 8
    for a, b in zip(g.model.layers, r.model.layers):
        assert torch.equal(a.mlp.experts.gate_up_packed, b.mlp.experts.gate_up_packed)
        assert torch.equal(a.mlp.experts.down_scales, b.mlp.experts.down_scales)


def test_quantize_model_bad_inputs():
    m = tiny_model("mixtral")
    with pytest.raises(ValueError, match="scheme must be one of"):
        quantize_model(m, "awq")
    with pytest.raises(ValueError, match="targets must be one of"):
        quantize_model(m, "rtn", "attn")
    with pytest.raises(ValueError, match="act must be one of"):
        quantize_model(m, "rtn", "experts", "fp8")
    with pytest.raises(TypeError, match="calib_ids must be a torch.Tensor"):
        quantize_model(m, "gptq")
    with pytest.raises(TypeError, match="calib_ids must have dtype"):
        quantize_model(m, "gptq", calib_ids=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="only used by scheme='gptq'"):
        quantize_model(m, "rtn", calib_ids=torch.zeros(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="min_rows must be a positive int"):
        quantize_model(m, "rtn", min_rows=0)
    with pytest.raises(ValueError, match="dither must be a number in"):
        quantize_model(m, "rtn", dither=0.7)
    with pytest.raises(ValueError, match="dither applies to scheme='rtn' only"):
        quantize_model(m, "gptq", calib_ids=torch.zeros(2, 8, dtype=torch.int64), dither=0.1)
    with pytest.raises(ValueError, match="unsupported architecture 'llama'"):
        quantize_model(tiny_model("llama"), "rtn")
    with pytest.raises(ValueError, match="not a multiple of 32"):
        quantize_model(tiny_model("olmoe", hidden=48), "rtn")


# ---------------------------------------------------------------------------------------------- save/load

def test_save_load_round_trip_is_bit_exact(tmp_path):
    q, _ = quantize_model(tiny_model("qwen3_moe"), "rtn", "experts+attn", "bf16", progress=False)
    path = tmp_path / "q.safetensors"
    save_quantized(q, path)
    meta = read_metadata(path)
    assert meta["format_version"] == str(Q.FORMAT_VERSION) and meta["arch"] == "qwen3_moe"
    assert json.loads(meta["scheme"]) == {"scheme": "rtn", "targets": "experts+attn", "act": "bf16", "lm_head": False}
    loaded, sch = load_quantized(path, tiny_model("qwen3_moe", seed=1))      # different random base
    assert sch == q.int4_scheme
    a, b = q.state_dict(), loaded.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        assert torch.equal(q(ids).logits, loaded(ids).logits)


def test_load_refuses_mismatches(tmp_path):
    from safetensors.torch import load_file, save_file
    q, _ = quantize_model(tiny_model("mixtral"), "rtn", "experts", "int8", progress=False)
    path = tmp_path / "q.safetensors"
    save_quantized(q, path)
    with pytest.raises(ValueError, match="holds a model with arch = 'mixtral', base_model has arch = 'olmoe'"):
        load_quantized(path, tiny_model("olmoe"))
    with pytest.raises(ValueError, match="holds a model with intermediate = 64, base_model has intermediate = 96"):
        load_quantized(path, tiny_model("mixtral", inter=96))
    with pytest.raises(ValueError, match="holds a model with layers = 2, base_model has layers = 3"):
        load_quantized(path, tiny_model("mixtral", layers=3))
    meta = read_metadata(path)
    bad = tmp_path / "v99.safetensors"
    save_file(load_file(str(path)), str(bad), metadata={**meta, "format_version": "99"})
    with pytest.raises(ValueError, match="format_version '99' is not supported"):
        load_quantized(bad, tiny_model("mixtral"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_quantized(tmp_path / "nope.safetensors", tiny_model("mixtral"))
    with pytest.raises(ValueError, match="not quantised"):
        save_quantized(tiny_model("mixtral"), tmp_path / "plain.safetensors")


# ---------------------------------------------------------------------------------------------- lottery, hook

def test_dithered_pack_is_seeded_and_moves_only_near_halves():
    w = torch.randn(2, 16, 64)
    p0, s0 = pack_int4_b32(w)
    a = Q.dithered_pack(w, 0.1, 3)
    b = Q.dithered_pack(w, 0.1, 3)
    c = Q.dithered_pack(w, 0.1, 4)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])      # same seed, same bytes
    assert torch.equal(a[1], s0)                                       # same scales as round-to-nearest
    from int4lab.format import unpack_codes
    q0, qa = unpack_codes(p0).double(), unpack_codes(a[0]).double()
    x = (w.double().reshape(2, 16, 2, 32) / s0.double()[..., None]).reshape(2, 16, 64)
    moved = q0 != qa
    assert 0 < moved.double().mean() < 0.1                             # about dither / 2 of the codes
    assert ((x - x.floor() - 0.5).abs()[moved] <= 0.1 + 1e-6).all()    # only where w / s sits near a half
    assert ((qa - q0).abs() <= 1).all()
    assert torch.equal(Q.dithered_pack(w, 0.0, 3)[0], p0)


def test_quantize_model_lottery_ticket_reports_its_seed():
    m1, r1 = quantize_model(tiny_model("olmoe"), "rtn", "experts+attn", dither=0.1, dither_seed=7, progress=False)
    m2, _ = quantize_model(tiny_model("olmoe"), "rtn", "experts+attn", dither=0.1, dither_seed=7, progress=False)
    m0, _ = quantize_model(tiny_model("olmoe"), "rtn", "experts+attn", progress=False)
    assert r1.dither == 0.1 and r1.dither_seed == 7
    a, b, c = m1.state_dict(), m2.state_dict(), m0.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.experts.gate_up_packed"], c["model.layers.0.mlp.experts.gate_up_packed"])
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.packed"], c["model.layers.0.self_attn.q_proj.packed"])


def test_one_hessian_hook_serves_quantize_and_calib():
    # calib.collect_hessians (chapter 02) is the same hook GPTQ calibrates with: same keys, same rows.
    from lab.chapters import calib as C
    m = tiny_model("qwen3_moe")
    ids = torch.randint(0, 256, (2, 16))
    accs = C.collect_hessians(m, [ids])
    part = C.collect_hessians(m, [ids], layers=[0])          # stops after layer 0: same Hessians for it
    assert set(part) == {k for k in accs if k.startswith("layers.0.")}
    assert all(torch.equal(part[k].H, accs[k].H) for k in part)
    assert {k for k in accs if "self_attn" in k} == {f"layers.{li}.self_attn.{p}" for li in range(2)
                                                     for p in Q.ATTN_PROJ}
    xs = []
    h = m.model.layers[1].mlp.experts.register_forward_pre_hook(lambda mod, a: xs.append(a), with_kwargs=False)
    with torch.no_grad():
        m(input_ids=ids, use_cache=False)
    h.remove()
    hs, idx = xs[0][0].reshape(-1, 64), xs[0][1]
    e = int(idx[0, 0])
    x = hs[(idx == e).any(-1)].double()
    assert accs[f"layers.1.experts.{e}.gate_up"].nsamples == x.shape[0]
    assert torch.allclose(accs[f"layers.1.experts.{e}.gate_up"].H.double(), 2 * x.t() @ x / x.shape[0], rtol=1e-4,
                          atol=1e-6)
    w = C.model_weight(m, f"layers.1.experts.{e}.down")
    assert w.shape == (64, 64) and w.data_ptr() == m.model.layers[1].mlp.experts.down_proj[e].data_ptr()


def test_swiglu_is_recognised_by_what_it_computes():
    from int4lab.quantize.modules import _computes_silu
    assert _computes_silu(nn.SiLU()) and _computes_silu(torch.nn.functional.silu)
    assert not _computes_silu(nn.GELU()) and not _computes_silu(nn.ReLU())
