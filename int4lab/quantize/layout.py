"""Where each supported MoE architecture keeps its pieces, and what a quantisation scheme names.

transformers 5 stores each MoE layer's experts as fused 3-D parameters (`<Arch>Experts`):
    gate_up_proj [E, 2I, H]  (gate rows first, then up rows)      down_proj [E, H, I]
and calls `experts(hidden [R, H], top_k_index [R, k], top_k_weights [R, k])`. The router (`mlp.gate`)
is a plain module holding a weight, not an `nn.Linear`; attention q/k/v/o are `nn.Linear`.
Shape legend: E = experts, H = hidden size, I = expert intermediate size, R = rows (tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

SCHEMES = ("rtn", "gptq")
TARGETS = ("experts", "experts+attn")
ACTS = ("int8", "bf16")

# transformers 5 happens to use the same names for all three; a new architecture is one more row here.
LAYOUT = {
    "mixtral": dict(layers="model.layers", attn="self_attn", moe="mlp", router="gate", experts="experts"),
    "olmoe": dict(layers="model.layers", attn="self_attn", moe="mlp", router="gate", experts="experts"),
    "qwen3_moe": dict(layers="model.layers", attn="self_attn", moe="mlp", router="gate", experts="experts"),
}
ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Scheme:
    """What was quantised and how; recorded in every saved checkpoint."""
    scheme: str = "rtn"            # "rtn" | "gptq": how codes are chosen
    targets: str = "experts"       # "experts" | "experts+attn"
    act: str = "int8"              # "int8" (W4A8) | "bf16" (W4A16)
    lm_head: bool = False          # round-to-nearest lm_head too (off by default: the seed keeps it high precision)

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
    """The LAYOUT key of a transformers causal-LM, or ValueError naming the supported ones."""
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt not in LAYOUT:
        raise ValueError(f"unsupported architecture {mt!r}: int4lab handles {tuple(LAYOUT)} "
                         "(transformers 5 fused-expert MoE models)")
    return mt


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def decoder_layers(model) -> nn.ModuleList:
    return _get(model, LAYOUT[model_arch(model)]["layers"])


def attention(layer, arch: str) -> nn.Module:
    return getattr(layer, LAYOUT[arch]["attn"])


def moe_block(layer, arch: str):
    """The sparse MoE block of a layer, or None (Qwen3-MoE may keep some layers dense: mlp_only_layers)."""
    lay = LAYOUT[arch]
    mlp = getattr(layer, lay["moe"])
    return mlp if hasattr(mlp, lay["experts"]) else None


def experts_of(layer, arch: str):
    """The fused experts module of a layer, or None for a dense layer."""
    moe = moe_block(layer, arch)
    return None if moe is None else getattr(moe, LAYOUT[arch]["experts"])


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
