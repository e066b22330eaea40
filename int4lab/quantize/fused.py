"""`fuse_decode`: a quantised model's decode layer in fewer launches (a runtime form, applied after quantize_model).

Shape legend: R = rows (tokens), H = hidden size, E = experts, A = experts per token, N = out features.

    FusedRMSNorm   every RMSNorm (layer norms, q/k norms, the final norm): one launch instead of eight
                   (kernels/norm.py: the module's two roundings, float32 arithmetic)
    FusedRouter    a MoE router: its GEMV, softmax, top-k and renormalisation in one launch (kernels/router.py)
    QKVSlice       q_proj, k_proj, v_proj as views of one Int4Linear over the concatenated packs (attention's
                   `qkv_proj`): one GEMV launch reads all three; k and v are the slices of the q call's output
    FusedAttention (fused_attention.py) a single-token step over a StaticCache: q/k norm, rope, the cache write
                   and attention in one launch (kernels/attention.py); other calls run the model's forward
    FusedDecoderLayer (fused_layer.py) the residual add after attention and post_attention_layernorm in one
                   launch (kernels/norm.py's add_rms_norm)

The module tree keeps transformers' names (q_proj, k_proj, v_proj, gate, *norm), so the model's own forward,
`generate`, hooks and CUDA-graph capture run unchanged. Which router arithmetic each model needs (renormalised
top-k or not, the weights' dtype) is read off what its router computes on a probe, as `_computes_silu` reads
SwiGLU. Like the int4 modules, each module runs its kernel for CUDA tensors (`kernels` = None) and the
transformers arithmetic in torch otherwise (kernels = False; True sends CPU tensors through the interpreter).
A fused model is for running: save the quantised model before fusing (save_quantized reads q/k/v packs apart).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..archs import arch_of
from .layout import attention as attention_of, decoder_layers, model_arch, moe_block
from .layout import router as router_of
from .modules import Int4Linear, _Int4Module


class FusedRMSNorm(_Int4Module):
    """Drop-in for a transformers RMSNorm (weight [N], variance_epsilon): kernels/norm.py's one launch."""

    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight
        self.variance_epsilon = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernels_for(x) and self.weight.dtype == x.dtype:
            from ..kernels import ops
            N = x.shape[-1]
            x2 = x.reshape(-1, N)
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            return ops.rms_norm(x2, self.weight, self.variance_epsilon).view(*x.shape[:-1], N)
        return rms_norm_torch(x, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, one launch"


def rms_norm_torch(x, weight, eps):
    """transformers' RMSNorm arithmetic (Mixtral, OLMoE, Qwen3-MoE)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class FusedRouter(_Int4Module):
    """Drop-in for a transformers top-k router: forward(hidden [R, H]) -> (logits [R, E], weights [R, A], ids [R, A])."""

    def __init__(self, weight: nn.Parameter, top_k: int, renorm: bool, weights_dtype):
        super().__init__()
        self.weight = weight
        self.num_experts, self.hidden_dim = weight.shape
        self.top_k, self.renorm = int(top_k), bool(renorm)
        self.weights_dtype = weights_dtype      # None: the logits' dtype

    @classmethod
    def from_router(cls, router: nn.Module) -> "FusedRouter":
        """The router's arithmetic read off a probe (renormalised or not, the weights' dtype); ValueError when its
        outputs are not what the fused router would compute."""
        w = router.weight
        probe = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)
        with torch.no_grad():
            logits, weights, ids = router(probe)
        top_k = ids.shape[-1]
        renorm = bool(torch.allclose(weights.float().sum(-1), torch.ones(5, device=w.device), atol=1e-2))
        wdt = None if weights.dtype == logits.dtype else weights.dtype
        fused = cls(w, top_k, renorm, wdt)
        with torch.no_grad():
            lg2, w2, i2 = router_torch(logits, top_k, renorm, wdt)
        if not (torch.equal(i2, ids) and w2.dtype == weights.dtype and torch.allclose(w2.float(), weights.float())):
            raise ValueError(f"{type(router).__name__} does not compute softmax, top-{top_k}"
                             f"{', renormalise' if renorm else ''}: it is left as it is")
        return fused

    def forward(self, hidden_states: torch.Tensor):
        x = hidden_states.reshape(-1, self.hidden_dim)
        wdt = self.weights_dtype or x.dtype
        if self._kernels_for(x) and self.weight.dtype == x.dtype:
            from ..kernels import ops
            return ops.router(x if x.stride(-1) == 1 else x.contiguous(), self.weight, self.top_k, self.renorm, wdt)
        return router_torch(nn.functional.linear(x, self.weight), self.top_k, self.renorm, self.weights_dtype)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden_dim}, top_k={self.top_k}, renorm={self.renorm}, "
                "one launch")


def router_torch(logits, top_k, renorm, weights_dtype):
    """transformers' router arithmetic after its GEMV: float32 softmax, top-k, renormalise, cast."""
    p = torch.softmax(logits, dim=-1, dtype=torch.float)
    v, ids = torch.topk(p, top_k, dim=-1)
    if renorm:
        v = v / v.sum(dim=-1, keepdim=True)
    return logits, v.to(weights_dtype or logits.dtype), ids


class _Stash:
    """The q call's x and output slices, which the k and v calls of the same x read back."""
    x = None
    parts = None


class QKVSlice(nn.Module):
    """q_proj / k_proj / v_proj of a fused attention: slice `index` of the shared qkv Int4Linear's output."""

    def __init__(self, qkv: Int4Linear, sizes: tuple, index: int, stash: _Stash):
        super().__init__()
        self.__dict__["qkv"] = qkv              # held, not registered: attention registers it once (qkv_proj)
        self.sizes, self.index, self.stash = tuple(sizes), index, stash
        self.in_features, self.out_features = qkv.in_features, sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = self.stash
        if self.index == 0 or st.parts is None or st.x is not x:
            st.x, st.parts = x, self.qkv(x).split(self.sizes, dim=-1)
        out = st.parts[self.index]
        if self.index == len(self.sizes) - 1:
            st.x = st.parts = None              # nothing is held between steps
        return out

    def extra_repr(self) -> str:
        return f"slice {self.index} of qkv_proj {self.sizes}"


def fuse_qkv(attn: nn.Module) -> bool:
    """Replace attn.q_proj / k_proj / v_proj (Int4Linear of one act and K) by slices of one fused Int4Linear."""
    mods = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if not all(isinstance(m, Int4Linear) for m in mods) or len({(m.act, m.in_features) for m in mods}) != 1:
        return False
    biases = [m.bias for m in mods]
    if any(b is not None for b in biases) and not all(b is not None for b in biases):
        return False
    qkv = Int4Linear(torch.cat([m.packed for m in mods]), torch.cat([m.scales for m in mods]), mods[0].act,
                     None if biases[0] is None else torch.cat([b.detach() for b in biases]))
    qkv.kernels = mods[0].kernels
    attn.qkv_proj = qkv
    sizes, stash = tuple(m.out_features for m in mods), _Stash()
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        setattr(attn, name, QKVSlice(qkv, sizes, i, stash))
    return True


def _is_rms_norm(m: nn.Module) -> bool:
    return (type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.dim() == 1 and isinstance(getattr(m, "variance_epsilon", None), float))


def fuse_decode(model, *, qkv: bool = True, router: bool = True, norms: bool = True, attention: bool = True,
                add_norm: bool = True):
    """Fuse `model` in place (module doc); returns it, with `model.int4_fused` counting what was fused."""
    from .fused_attention import fuse_attention
    from .fused_layer import fuse_layer
    arch = model_arch(model)
    done = {"qkv": 0, "router": 0, "norms": 0, "attention": 0, "add_norm": 0, "left": []}
    layers = decoder_layers(model)
    for li, layer in enumerate(list(layers)):
        if qkv:
            done["qkv"] += fuse_qkv(attention_of(layer, arch))
        if attention:
            done["attention"] += fuse_attention(layer, arch_of(model).layout.attn)
        moe = moe_block(layer, arch)
        gate = router_of(layer, arch)
        if router and moe is not None and not isinstance(gate, FusedRouter):
            try:
                setattr(moe, arch_of(model).layout.router, FusedRouter.from_router(gate))
                done["router"] += 1
            except ValueError as e:
                done["left"].append(f"layer {li} router: {e}")
        if add_norm:
            done["add_norm"] += fuse_layer(layers, li)
    if norms:
        for name, mod in list(model.named_modules()):
            for cname, child in list(mod.named_children()):
                if _is_rms_norm(child) and not isinstance(child, FusedRMSNorm):
                    setattr(mod, cname, FusedRMSNorm(child.weight, child.variance_epsilon))
                    done["norms"] += 1
    model.int4_fused = done
    return model
