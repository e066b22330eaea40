"""The models a decode step runs, and what one of their layers must read.

Shape legend: B = batch (sequences), C = context (KV positions), E = experts, A = experts per token (top-k),
H = hidden size, I = expert intermediate size, D = head dim, Hkv = key/value heads.

    build(arch, layers, width, device)      the published configuration (lab.synth) at real or tiny width,
                                            random weights as transformers draws them, `layers` decoder layers
    depth(model, n)                         a context in which the model runs its first n layers only
    experts_impls(model) / set_experts_impl transformers' experts implementations (eager, batched_mm, grouped_mm)
    layer_bytes(model, B, C, distinct)      the bytes one decoder layer must read for one step (the read floor)
    routing_census(model)                   distinct experts each layer routes to per step (a hook on the router)
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from lab.synth import synth_config

# transformers 5's experts implementations that need nothing beyond torch (deepgemm, sonicmoe need packages)
EXPERTS_IMPLS = ("eager", "batched_mm", "grouped_mm")


def build(arch: str, layers: int, width: str = "real", device: str = "cpu", dtype=torch.bfloat16, seed: int = 0):
    """A causal LM of the published configuration truncated to `layers`, weights drawn on `device` in `dtype`
    (normal(0, initializer_range), norms 1: lab.synth's draw), in eval mode."""
    from transformers import AutoModelForCausalLM

    from lab.synth import _init_, _reset_buffers
    cfg = synth_config(arch, layers, width)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model = model.to_empty(device=device)
    _init_(model, cfg.initializer_range)
    _reset_buffers(model)
    return model.eval()


@contextlib.contextmanager
def depth(model, n: int):
    """Run only the first n decoder layers inside this block (the config and the layer list both say so)."""
    from int4lab.quantize import decoder_layers
    inner = model.model
    full = decoder_layers(model)
    if not 1 <= n <= len(full):
        raise ValueError(f"n must be in [1, {len(full)}], got {n}")
    old_n = model.config.num_hidden_layers
    inner.layers = nn.ModuleList(list(full)[:n])
    model.config.num_hidden_layers = n
    try:
        yield model
    finally:
        inner.layers = full
        model.config.num_hidden_layers = old_n


def experts_impls(model) -> list[str]:
    """The experts implementations transformers accepts for this model, among EXPERTS_IMPLS."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        known = set(ALL_EXPERTS_FUNCTIONS.keys()) | {"eager"}
    except ImportError:
        return ["eager"]
    return [i for i in EXPERTS_IMPLS if i in known]


def set_experts_impl(model, impl: str) -> str:
    """Switch the bf16 experts' implementation; returns what the config holds afterwards."""
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(impl)
    else:
        model.config._experts_implementation = impl
    return model.config._experts_implementation


def default_experts_impl(model) -> str:
    return getattr(model.config, "_experts_implementation", None) or "eager"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _module_bytes(m: nn.Module) -> int:
    return sum(_nbytes(t) for t in list(m.parameters(recurse=True)) + list(m.buffers(recurse=True)))


def layer_bytes(model, batch: int, context: int, distinct_experts: float, layer: int = 0) -> dict:
    """Bytes one decode step reads in decoder layer `layer`: attention projections, the routed experts
    (`distinct_experts` of them, each read once), a shared expert and its gate (0 without), router, norms,
    and the KV cache of `context` positions for `batch` sequences (keys and values in the model's dtype).
    Weights counted from the modules' own tensors, so int4 packs count 0.5 + 2/32 bytes per weight and bf16
    weights 2."""
    from int4lab.quantize.layout import (ATTN_PROJ, attention, decoder_layers, experts_of, model_arch, moe_block,
                                         router as router_of, shared_expert, shared_gate)
    arch = model_arch(model)
    lay = decoder_layers(model)[layer]
    attn = attention(lay, arch)
    seen, proj = set(), 0
    for name in ATTN_PROJ:
        m = getattr(attn, name)
        for t in list(m.parameters()) + list(m.buffers()):
            if t.data_ptr() not in seen:                    # a fused q/k/v pack is counted once
                seen.add(t.data_ptr())
                proj += _nbytes(t)
    ex = experts_of(lay, arch)
    per_expert = _module_bytes(ex) / ex.num_experts
    router = _module_bytes(router_of(lay, arch))
    shared = shared_expert(lay, arch)
    shared = 0 if shared is None else _module_bytes(shared) + _module_bytes(shared_gate(lay, arch))
    norms = sum(_module_bytes(m) for n, m in lay.named_modules() if "norm" in type(m).__name__.lower()
                and not any(True for _ in m.children()))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = torch.empty((), dtype=model.dtype).element_size()
    kv = 2 * batch * cfg.num_key_value_heads * head_dim * context * elem
    experts = int(round(per_expert * distinct_experts))
    out = {"attn_proj": proj, "experts": experts, "shared_expert": shared, "router": router, "norms": norms,
           "kv_cache": kv, "distinct_experts": distinct_experts, "bytes_per_expert": int(per_expert)}
    out["total"] = proj + experts + shared + router + norms + kv
    return out


@contextlib.contextmanager
def routing_census(model):
    """Inside this block every router call records the number of distinct experts it routes to; yields the list
    of (layer index, distinct) pairs (a read-back per call: for a census, never inside a timed step)."""
    from int4lab.quantize.layout import decoder_layers, model_arch, router
    arch = model_arch(model)
    seen: list = []
    handles = []
    for i, lay in enumerate(decoder_layers(model)):
        gate = router(lay, arch)

        def hook(_m, _args, out, i=i):
            idx = out[2] if isinstance(out, tuple) else out
            seen.append((i, int(torch.unique(idx).numel())))
        handles.append(gate.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
