"""`FusedAttention`: a decoder layer's attention whose single-token steps over a StaticCache run in one launch.

Shape legend: B = batch, H = hidden size, HQ / HKV = query / key-value heads, D = head dim, C = cache slots.

What one step runs instead of transformers' forward: the q/k/v projection (one GEMV after fuse_qkv), then
kernels/attention.py's launch (q/k norm where the model has one, rope with the model's position embeddings, the
write of k and v into the layer's StaticLayer tensors at its `cumulative_length`, attention over the cache,
length + 1), then o_proj. The cache object stays authoritative: its keys, values and length are the tensors
the kernel writes, so `update`, `get_seq_length`, a prefill, `generate` and CUDA-graph capture see the same
state as after transformers' own step.

Which steps take the launch: one token per sequence, eval mode, bf16, the layer's cache a plain StaticLayer
already initialised (a prefill or an earlier step did it), a mask that is None or boolean [B or 1, 1, 1, C],
no sliding window, no clip_qkv, no offloading; anything else runs the model's own forward, unchanged. The
models whose attention code this reproduces (where the norms sit): OLMoE (RMSNorm over the whole q and k
projections), Qwen3-MoE (RMSNorm over each head), Mixtral (none).
"""
from __future__ import annotations

import torch

from .modules import _Int4Module

# attention class -> where its q/k norm sits (kernels/attention.py's `norm`)
NORM_OF = {"OlmoeAttention": "row", "Qwen3MoeAttention": "head", "MixtralAttention": "none"}


class FusedAttention(_Int4Module):
    """Wraps a transformers attention module in place: same submodules, names and attributes (module doc)."""

    def __init__(self, attn: torch.nn.Module):
        name = type(attn).__name__
        if name not in NORM_OF:
            raise ValueError(f"FusedAttention knows {sorted(NORM_OF)}, got {name}")
        super().__init__()
        self.__dict__.update(attn.__dict__)         # the same submodules, parameters, config and layer index
        self.__dict__["_original_forward"] = type(attn).forward
        self.__dict__["_original_class"] = name
        self.norm = NORM_OF[name]

    def _fast_args(self, hidden_states, position_embeddings, attention_mask, past_key_values):
        """The kernel's extra arguments when this call can take it, else None (module doc)."""
        from transformers.cache_utils import StaticLayer
        x = hidden_states
        if (self.training or x.dim() != 3 or x.shape[1] != 1 or x.dtype != torch.bfloat16 or x.requires_grad
                or not self._kernels_for(x) or past_key_values is None or position_embeddings is None):
            return None
        cfg = self.config
        if (getattr(self, "sliding_window", None) is not None or getattr(cfg, "sliding_window", None) is not None
                or getattr(cfg, "clip_qkv", None) is not None or getattr(past_key_values, "offloading", False)):
            return None
        layers = getattr(past_key_values, "layers", None)
        if layers is None or self.layer_idx >= len(layers):
            return None
        layer = layers[self.layer_idx]
        if type(layer) is not StaticLayer or not layer.is_initialized or layer.keys.dtype != torch.bfloat16:
            return None
        B, C = x.shape[0], layer.max_cache_len
        if layer.keys.shape[0] != B or layer.keys.device != x.device:
            return None
        mask = attention_mask
        if mask is not None:
            if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4
                    or tuple(mask.shape[1:]) != (1, 1, C) or mask.shape[0] not in (1, B)):
                return None
            mask = mask[:, 0, 0, :].expand(B, C)
        if self.norm != "none" and not (self.q_norm.weight.dtype == self.k_norm.weight.dtype == torch.bfloat16):
            return None
        cos, sin = position_embeddings
        if cos.dtype != torch.bfloat16 or cos.dim() != 3 or cos.shape[1] != 1:
            return None
        return layer, mask, cos[:, 0], sin[:, 0]

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                **kwargs):
        fast = self._fast_args(hidden_states, position_embeddings, attention_mask, past_key_values)
        if fast is None:
            return self._original_forward(self, hidden_states, position_embeddings=position_embeddings,
                                          attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
        from ..kernels import ops
        layer, mask, cos, sin = fast
        B = hidden_states.shape[0]
        q = self.q_proj(hidden_states).reshape(B, -1)
        k = self.k_proj(hidden_states).reshape(B, -1)
        v = self.v_proj(hidden_states).reshape(B, -1)
        qn = kn = None
        eq = ek = 0.0
        if self.norm != "none":
            qn, kn = self.q_norm.weight, self.k_norm.weight
            eq, ek = float(self.q_norm.variance_epsilon), float(self.k_norm.variance_epsilon)
        out = ops.decode_attention(q, k, v, cos, sin, layer.keys, layer.values, layer.cumulative_length, qn, kn,
                                   self.norm, eq, ek, float(self.scaling), mask)
        return self.o_proj(out.view(B, 1, -1)), None

    def extra_repr(self) -> str:
        return f"{self._original_class}, norm={self.norm}, single-token static-cache steps in one launch"


def fuse_attention(layer: torch.nn.Module, name: str = "self_attn") -> bool:
    """Replace layer.<name> by a FusedAttention over it; False (left as it is) for an unknown attention class."""
    attn = getattr(layer, name, None)
    if attn is None or isinstance(attn, FusedAttention) or type(attn).__name__ not in NORM_OF:
        return False
    setattr(layer, name, FusedAttention(attn))
    return True
