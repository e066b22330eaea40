"""The one Hessian hook: what GPTQ (`quantize_model`) and chapter 02 (`lab.chapters.calib`) both measure.

Shape legend: E = experts, H = hidden size, I = expert intermediate size, R = rows, k = experts per token.

For a projection y = x Wᵀ the GPTQ Hessian is H = 2/R · XᵀX over the rows X it sees. Keys:
    "layers.{l}.self_attn.{q,k,v,o}_proj"   the projection's input (q, k and v see the same rows)
    "layers.{l}.experts.{e}.gate_up"        the hidden rows the router sent to expert e (top-k), [r, H]
    "layers.{l}.experts.{e}.down"           act(gate) ⊙ up of those rows, in float32, [r, I]
An expert no row reached has no key (and no Hessian).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..gptq import HessianAccumulator
from .layout import ATTN_PROJ, attention, decoder_layers, experts_of, model_arch, shared_expert, shared_proj


def attn_key(layer: int, proj: str) -> str:
    return f"layers.{layer}.self_attn.{proj}"


def expert_key(layer: int, expert: int, which: str) -> str:
    return f"layers.{layer}.experts.{expert}.{which}"


def shared_key(layer: int, proj: str) -> str:
    return f"layers.{layer}.shared_expert.{proj}"


@contextlib.contextmanager
def hessian_hooks(model, layers=None, attn: bool = True, experts: bool = True, device="cpu"):
    """Yield a dict {key: HessianAccumulator} that fills while `model` (or any of its decoder layers, called
    alone) runs forwards inside the block. layers: decoder-layer indices to hook (default all)."""
    arch = model_arch(model)
    accs, handles = {}, []

    def acc(name, k):
        if name not in accs:
            accs[name] = HessianAccumulator(k, device=device)
        return accs[name]

    def attn_hook(name):
        def hook(mod, args):
            acc(name, mod.in_features).add(args[0].detach())
        return hook

    def experts_hook(li):
        @torch.no_grad()
        def hook(mod, args, kwargs):
            hs = args[0] if args else kwargs["hidden_states"]
            ids = args[1] if len(args) > 1 else kwargs["top_k_index"]
            hs = hs.detach().reshape(-1, hs.shape[-1])
            ids = ids.reshape(hs.shape[0], -1)                          # [R, k]
            for e in range(mod.gate_up_proj.shape[0]):
                rows = (ids == e).any(-1)
                if not bool(rows.any()):
                    continue
                xe = hs[rows].float()                                    # rows routed to e [r, H]
                acc(expert_key(li, e, "gate_up"), xe.shape[-1]).add(xe)
                gate, up = F.linear(xe, mod.gate_up_proj[e].float()).chunk(2, dim=-1)
                hmid = mod.act_fn(gate) * up                             # down's input [r, I]
                acc(expert_key(li, e, "down"), hmid.shape[-1]).add(hmid)
        return hook

    for li, layer in enumerate(decoder_layers(model)):
        if layers is not None and li not in layers:
            continue
        if attn:
            for p in ATTN_PROJ:
                mod = getattr(attention(layer, arch), p)
                handles.append(mod.register_forward_pre_hook(attn_hook(attn_key(li, p))))
        ex = experts_of(layer, arch)
        if experts and ex is not None:
            handles.append(ex.register_forward_pre_hook(experts_hook(li), with_kwargs=True))
            for p in shared_proj(layer, arch):          # a shared expert sees every row: a plain linear's hook
                mod = getattr(shared_expert(layer, arch), p)
                handles.append(mod.register_forward_pre_hook(attn_hook(shared_key(li, p))))
    try:
        yield accs
    finally:
        for h in handles:
            h.remove()


class StopForward(Exception):
    """Raised by `stop_after` to end a forward once the hooked layers have run."""


@contextlib.contextmanager
def stop_after(model, layer: int):
    """Inside this block a forward of `model` stops (StopForward) when it reaches decoder layer `layer` + 1:
    Hessians of the first layers need neither the rest of the model nor the lm_head."""
    layers = decoder_layers(model)
    if layer + 1 >= len(layers):
        yield
        return

    def stop(_mod, _args):
        raise StopForward
    h = layers[layer + 1].register_forward_pre_hook(stop)
    try:
        yield
    finally:
        h.remove()
