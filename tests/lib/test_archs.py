"""The architecture records (int4lab/archs/): each one's paths resolve on a model transformers builds, its config
keys exist, its GGUF names are the ones gguf-py lists for its llama.cpp architecture, its published
configuration is the one the benches and lab.synth read; and no code outside the records branches on an
architecture's name."""
import dataclasses
import re

import pytest
import torch

from int4lab import archs
from int4lab.archs import ARCHS, arch_of, get
from int4lab.models.configs import tiny_config
from int4lab.quantize import layout
from lab.paths import ROOT

NAMES = list(ARCHS)


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    return {n: AutoModelForCausalLM.from_config(tiny_config(n, vocab_size=256, layers=1)) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_layout_paths_resolve_on_the_transformers_model(models, name):
    a, m = get(name), models[name]
    assert arch_of(m) is a and type(m).__name__ == a.causal_lm and layout.model_arch(m) == name
    lay = layout.decoder_layers(m)[0]
    lo = a.layout
    for p in lo.attn_proj:
        assert isinstance(getattr(layout.attention(lay, a), p), torch.nn.Linear)
    for n in lo.qk_norms:
        assert getattr(layout.attention(lay, a), n).weight.dim() == 1
    for n in (lo.input_norm, lo.post_norm):
        assert getattr(lay, n).weight.dim() == 1
    s = a.sizes(m.config)
    E, H, I = s["experts"], s["hidden"], s["intermediate"]
    ex = layout.experts_of(lay, a)
    gu, dn = (getattr(ex, p) for p in lo.fused)
    assert gu.shape == (E, 2 * I, H) and dn.shape == (E, H, I)
    assert layout.router(lay, a).weight.shape == (E, H)
    assert layout.module_at(m, lo.embed).weight.shape[1] == H
    assert layout.module_at(m, lo.final_norm).weight.shape == (H,)
    shared = layout.shared_expert(lay, a)
    assert (shared is None) == (lo.shared_expert is None) == (s["shared_intermediate"] == 0)
    if shared is not None:
        S = s["shared_intermediate"]
        assert [tuple(getattr(shared, p).weight.shape) for p in layout.shared_proj(lay, a)] == [(S, H), (S, H), (H, S)]
        assert layout.shared_gate(lay, a).weight.shape == (1, H)


@pytest.mark.parametrize("name", NAMES)
def test_config_keys_and_routing_read_the_config(models, name):
    a, cfg = get(name), models[name].config
    for f in dataclasses.fields(a.keys):
        key = getattr(a.keys, f.name)
        if isinstance(key, str) and f.name != "head_dim":
            assert hasattr(cfg, key), (name, f.name, key)
    t = a.tiny
    s = a.sizes(cfg)
    assert (s["intermediate"], s["experts"], s["top_k"], s["kv_heads"]) == (t.intermediate, t.experts, t.top_k,
                                                                           t.kv_heads)
    assert a.renormalises(cfg) == a.gguf.renorm              # the tiny configs route as llama.cpp's graph does


@pytest.mark.parametrize("name", NAMES)
def test_gguf_names_are_gguf_py_s_for_the_llama_cpp_architecture(name):
    gguf = pytest.importorskip("gguf")
    a = get(name)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == a.gguf.arch)
    allowed = {gguf.TENSOR_NAMES[t].replace("blk.{bid}.", "") for t in gguf.MODEL_TENSORS[arch]}
    lo, n = a.layout, a.gguf.names
    used = [n[k] for k in (lo.input_norm, lo.post_norm, *lo.attn_proj, *lo.qk_norms, "router", "gate", "up", "down",
                           "embed", "final_norm", "lm_head")]
    used += [n[k] for k in lo.shared_proj] + ([n[lo.shared_gate]] if lo.shared_gate else [])
    assert set(used) <= allowed, set(used) - allowed


@pytest.mark.parametrize("name", NAMES)
def test_published_configuration_is_what_synth_and_the_benches_read(name):
    from lab.synth import FULL_LAYERS, config_fields, synth_config
    from lab.bench import shapes
    a = get(name)
    assert a.published.config["model_type"] == name and a.published.citations and a.published.short
    assert config_fields(name, a.full_layers) == dict(a.published.config) and FULL_LAYERS[name] == a.full_layers
    cfg = synth_config(name, 1, "real")
    assert {k: v for k, v in a.sizes(cfg).items() if k != "layers"} == \
        {k: v for k, v in a.published_sizes().items() if k != "layers"}
    if a.published.bench_name:
        m = shapes.MODELS[a.published.bench_name]
        s = a.published_sizes()
        assert (m.hidden, m.intermediate, m.n_experts, m.top_k, m.n_heads, m.n_kv_heads, m.head_dim) == \
            (s["hidden"], s["intermediate"], s["experts"], s["top_k"], s["heads"], s["kv_heads"], s["head_dim"])


def test_registry_refuses_unknown_names_and_records_are_frozen():
    with pytest.raises(ValueError, match=r"unsupported architecture 'llama': int4lab handles \('mixtral'"):
        get("llama")
    with pytest.raises(dataclasses.FrozenInstanceError):
        get("olmoe").gguf.arch = "x"
    with pytest.raises(TypeError):
        get("olmoe").gguf.names["q_proj"] = "x"
    assert archs.TRAINED == ("mixtral", "olmoe", "qwen3_moe") and [a.name for a in archs.REGISTERED] == NAMES


# `arch == ...` (but the CLI's `--arch all`), `model_type != ...`, or a comparison with an architecture's name
BRANCH = re.compile(r"""\b(arch|model_type|mt)\s*(==|!=)(?!\s*["']all["'])"""
                    r"""|(==|!=)\s*["'](mixtral|olmoe|qwen3_moe|qwen3|qwen2_moe)["']""")


def test_no_code_branches_on_an_architecture_name_outside_the_records():
    hits = []
    for folder in ("int4lab", "lab"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "archs" in p.relative_to(ROOT).parts[:2]:
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if BRANCH.search(line.split("#")[0]):
                    hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)
