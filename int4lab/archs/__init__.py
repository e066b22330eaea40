"""One declarative record per supported architecture (`base.Arch`), registered here.

    from int4lab.archs import ARCHS, arch_of, get
    arch_of(model).layout.experts      # "experts": where the fused experts sit in the MoE block
    get("olmoe").gguf.arch             # "olmoe": llama.cpp's architecture name
    get("qwen3_moe").published_sizes() # the published configuration's sizes (hidden, experts, top-k, ...)

A new architecture is one module beside these (layout, config keys, GGUF mapping, published and tiny
configurations) and its line in REGISTERED.
"""
from __future__ import annotations

from . import mixtral, olmoe, qwen2_moe, qwen3_moe
from .base import GGUF_COMMON, Arch, ConfigKeys, Gguf, Layout, Published, Tiny, frozen_map

REGISTERED = (mixtral.ARCH, olmoe.ARCH, qwen3_moe.ARCH, qwen2_moe.ARCH)
ARCHS = {a.name: a for a in REGISTERED}
# the architectures this repository trains a tiny model of (data/models/<name>/)
TRAINED = tuple(n for n, a in ARCHS.items() if a.tiny.trained)


def get(name: str) -> Arch:
    """The record of architecture `name` (transformers' model_type), or ValueError naming the known ones."""
    if name not in ARCHS:
        raise ValueError(f"unsupported architecture {name!r}: int4lab handles {tuple(ARCHS)} "
                         "(transformers 5 fused-expert MoE models)")
    return ARCHS[name]


def arch_of(model) -> Arch:
    """The record of a transformers model (or config), read off its config's model_type."""
    cfg = getattr(model, "config", model)
    return get(getattr(cfg, "model_type", None))


def bench_label(bench_name: str) -> str:
    """The running-text name of the architecture bench receipts record as `bench_name` (e.g. "qwen3" -> "Qwen3")."""
    return bench_models()[bench_name].published.short


def bench_models() -> dict:
    """{bench name: record} of the architectures the benches time at their published sizes (a bench_name set)."""
    return {a.published.bench_name: a for a in REGISTERED if a.published.bench_name}


__all__ = ["ARCHS", "Arch", "ConfigKeys", "GGUF_COMMON", "Gguf", "Layout", "Published", "REGISTERED", "TRAINED",
           "Tiny", "arch_of", "bench_label", "bench_models", "frozen_map", "get"]
