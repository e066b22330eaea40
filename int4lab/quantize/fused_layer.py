"""`FusedDecoderLayer`: a decoder layer whose residual add after attention and the next RMSNorm are one launch.

Shape legend: B = batch, T = tokens, H = hidden size.

transformers' decoder layers of OLMoE, Qwen3-MoE and Mixtral run
    residual = x; h = input_layernorm(x); h = self_attn(h); x = residual + h
    residual = x; h = post_attention_layernorm(x); h = mlp(h); x = residual + h
This form runs the middle `residual + h` and `post_attention_layernorm` as kernels/norm.py's add_rms_norm (the
same two bf16 results: the add rounded once, then the norm's arithmetic, FusedRMSNorm's), so a layer has one
launch fewer. Anything the launch does not take (a CPU tensor without the interpreter switch, another dtype,
training, positional arguments beyond the hidden states) runs the layer's own forward.
"""
from __future__ import annotations

import torch

from .fused_attention import Wrapped

LAYERS = ("OlmoeDecoderLayer", "Qwen3MoeDecoderLayer", "MixtralDecoderLayer")


class FusedDecoderLayer(Wrapped):
    """Wraps a transformers decoder layer in place: same submodules, names and attributes (module doc)."""

    def __init__(self, layer: torch.nn.Module):
        name = type(layer).__name__
        if name not in LAYERS:
            raise ValueError(f"FusedDecoderLayer knows {LAYERS}, got {name}")
        super().__init__(layer)

    def _fast(self, x, args) -> bool:
        n = self.post_attention_layernorm
        return (not args and not self.training and x.dtype == torch.bfloat16 and not x.requires_grad
                and self._kernels_for(x) and getattr(n, "weight", None) is not None
                and n.weight.dtype == x.dtype and isinstance(getattr(n, "variance_epsilon", None), float))

    def forward(self, hidden_states, *args, **kwargs):
        if not self._fast(hidden_states, args):
            return self._original_forward(self, hidden_states, *args, **kwargs)
        from ..kernels import ops
        shape, H = hidden_states.shape, hidden_states.shape[-1]
        residual = hidden_states.reshape(-1, H)
        h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        n = self.post_attention_layernorm
        s, h = ops.add_rms_norm(h.reshape(-1, H), residual, n.weight, n.variance_epsilon)
        return s.view(shape) + self.mlp(h.view(shape))

    def extra_repr(self) -> str:
        return f"{self._original_class}, residual add + post_attention_layernorm in one launch"


def fuse_layer(model_layers: torch.nn.ModuleList, i: int) -> bool:
    """Replace model_layers[i] by a FusedDecoderLayer over it; False (left as it is) for an unknown layer class."""
    layer = model_layers[i]
    if isinstance(layer, FusedDecoderLayer) or type(layer).__name__ not in LAYERS:
        return False
    model_layers[i] = FusedDecoderLayer(layer)
    return True
