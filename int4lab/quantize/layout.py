"""Where each supported MoE architecture keeps its pieces (read from its `int4lab.archs` record), and what a
quantisation scheme names.

transformers 5 stores each MoE layer's experts as fused 3-D parameters (`<Arch>Experts`):
    gate_up_proj [E, 2I, H]  (gate rows first, then up rows)      down_proj [E, H, I]
and calls `experts(hidden [R, H], top_k_index [R, k], top_k_weights [R, k])`. The router (`mlp.gate`)
is a plain module holding a weight, not an `nn.Linear`; attention q/k/v/o are `nn.Linear`, and so are a
shared expert's projections (Qwen2-MoE: `mlp.shared_expert.{gate,up,down}_proj`, [S, H] / [H, S]).
Shape legend: E = experts, H = hidden size, I = expert intermediate size, S = shared expert intermediate size,
R = rows (tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..archs import ARCHS, Arch, get

SCHEMES = ("rtn", "gptq")
TARGETS = ("experts", "experts+attn")
ACTS = ("int8", "bf16")

# name -> `int4lab.archs.Arch` (its `layout` field says where each piece sits)
LAYOUT = ARCHS
ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Scheme:
    """What was quantised and how; recorded in every saved checkpoint."""
    scheme: str = "rtn"            # "rtn" | "gptq": how codes are chosen
    targets: str = "experts"       # "experts" | "experts+attn"
    act: str = "int8"              # "int8" (W4A8) | "bf16" (W4A16)
    lm_head: bool = False          # round-to-nearest lm_head too (off by default: grouped-nf4-gemm's reference keeps it high precision)

    def __post_init__(self):
        for name, val, allowed in (("scheme", self.scheme, SCHEMES), ("targets", self.targets, TARGETS),
                                   ("act", self.act, ACTS)):
            if val not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {val!r}")
        if not isinstance(self.lm_head, bool):
            raise TypeError(f"lm_head must be a bool, got {type(self.lm_head).__name__}")

    @property
    def name(self) -> str:
        return f"{self.scheme}/{self.targets}/{'W4A8' if self.act == 'int8' else 'W4A16'}"


def model_arch(model) -> str:
    """The architecture name (an `int4lab.archs` key) of a transformers causal-LM, or ValueError naming the
    supported ones."""
    return get(getattr(getattr(model, "config", None), "model_type", None)).name


def module_at(obj, dotted: str):
    """obj.a.b.c for dotted "a.b.c" (the record's paths, e.g. layout.layers = "model.layers")."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _arch(arch) -> Arch:
    return arch if isinstance(arch, Arch) else get(arch)


def decoder_layers(model) -> nn.ModuleList:
    return module_at(model, get(model_arch(model)).layout.layers)


def attention(layer, arch) -> nn.Module:
    return getattr(layer, _arch(arch).layout.attn)


def moe_block(layer, arch):
    """The sparse MoE block of a layer, or None (Qwen3-MoE may keep some layers dense: mlp_only_layers)."""
    lay = _arch(arch).layout
    mlp = getattr(layer, lay.moe)
    return mlp if hasattr(mlp, lay.experts) else None


def experts_of(layer, arch):
    """The fused experts module of a layer, or None for a dense layer."""
    moe = moe_block(layer, arch)
    return None if moe is None else getattr(moe, _arch(arch).layout.experts)


def set_experts(layer, arch, new) -> None:
    """Put `new` where the layer's fused experts are."""
    setattr(moe_block(layer, arch), _arch(arch).layout.experts, new)


def shared_expert(layer, arch):
    """The dense MLP beside a layer's routed experts (Qwen2-MoE), or None."""
    lay = _arch(arch).layout
    moe = moe_block(layer, arch)
    return None if moe is None or lay.shared_expert is None else getattr(moe, lay.shared_expert)


def shared_gate(layer, arch):
    """The nn.Linear [1, H] whose sigmoid scales the shared expert's output (Qwen2-MoE), or None."""
    lay = _arch(arch).layout
    moe = moe_block(layer, arch)
    return None if moe is None or lay.shared_gate is None else getattr(moe, lay.shared_gate)


def shared_proj(layer, arch) -> tuple:
    """The shared expert's projection names (() without one); each is an nn.Linear of `shared_expert`."""
    return _arch(arch).layout.shared_proj if shared_expert(layer, arch) is not None else ()


def router(layer, arch):
    """The router module of a layer's MoE block (None for a dense layer)."""
    moe = moe_block(layer, arch)
    return None if moe is None else getattr(moe, _arch(arch).layout.router)


def input_device(model):
    """Where input ids go: the embedding's device, or the device accelerate executes an offloaded embedding
    on (its weight then sits on the meta device between forwards)."""
    emb = model.get_input_embeddings()
    dev = emb.weight.device
    if dev.type == "meta":
        hook = getattr(emb, "_hf_hook", None)
        dev = getattr(hook, "execution_device", None) or next(
            (h.execution_device for h in getattr(hook, "hooks", ()) if hasattr(h, "execution_device")), dev)
    return torch.device(dev) if not isinstance(dev, torch.device) else dev
