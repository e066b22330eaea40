"""The record one architecture is: where its pieces live, what its config calls them, how it maps to GGUF, the
published configuration it is measured at and the tiny one this repository trains.

Shape legend: E = experts, H = hidden size, I = one routed expert's intermediate size, S = the shared expert's
intermediate size, D = head dim.

Every field is data; the code that reads a model (quantize, export, the decode step, the drivers) asks the
record, so a new architecture is one file in this package plus its line in `__init__.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType


def frozen_map(d: dict) -> MappingProxyType:
    """A read-only view of `d` (a record's mappings cannot be changed after registration)."""
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Layout:
    """Where transformers 5 keeps each piece, as attribute paths (dotted from the causal-LM for `layers`,
    `embed`, `final_norm`; from a decoder layer for `attn`, `moe` and the norms; from the MoE block for
    `router`, `experts`, `shared_expert`, `shared_gate`)."""
    layers: str = "model.layers"
    embed: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    attn: str = "self_attn"
    attn_proj: tuple = ("q_proj", "k_proj", "v_proj", "o_proj")
    qk_norms: tuple = ()                       # attention's q/k norms, e.g. ("q_norm", "k_norm")
    input_norm: str = "input_layernorm"
    post_norm: str = "post_attention_layernorm"
    moe: str = "mlp"
    router: str = "gate"                       # a module holding weight [E, H] (not an nn.Linear)
    experts: str = "experts"                   # fused `<Arch>Experts`
    fused: tuple = ("gate_up_proj", "down_proj")   # [E, 2I, H] (gate rows first), [E, H, I]
    shared_expert: str | None = None           # a dense MLP beside the routed experts (every token)
    shared_proj: tuple = ()                    # its nn.Linear names, e.g. ("gate_proj", "up_proj", "down_proj")
    shared_gate: str | None = None             # nn.Linear [1, H]: sigmoid(shared_gate(x)) scales the shared MLP


@dataclass(frozen=True)
class ConfigKeys:
    """The transformers config attribute of each size (None: the architecture has no such piece)."""
    intermediate: str                          # I, one routed expert's
    experts: str                               # E
    top_k: str = "num_experts_per_tok"
    hidden: str = "hidden_size"
    heads: str = "num_attention_heads"
    kv_heads: str = "num_key_value_heads"
    head_dim: str = "head_dim"                 # absent or None in a config: hidden / heads
    layers: str = "num_hidden_layers"
    vocab: str = "vocab_size"
    shared_intermediate: str | None = None     # S
    renorm: str | bool = "norm_topk_prob"      # the config key, or the fixed answer (Mixtral always renormalises)


GGUF_COMMON = frozen_map({
    # decoder-layer / attention / shared-expert module name -> llama.cpp tensor name (gguf-py MODEL_TENSOR)
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    "gate_proj": "ffn_gate_shexp", "up_proj": "ffn_up_shexp", "down_proj": "ffn_down_shexp",
    "shared_expert_gate": "ffn_gate_inp_shexp",
    "router": "ffn_gate_inp", "gate": "ffn_gate_exps", "up": "ffn_up_exps", "down": "ffn_down_exps",
    "embed": "token_embd", "final_norm": "output_norm", "lm_head": "output",
})


@dataclass(frozen=True)
class Gguf:
    """How llama.cpp's graph for this architecture loads it."""
    arch: str                                  # gguf-py MODEL_ARCH name, e.g. "qwen3moe"
    renorm: bool                               # llama.cpp renormalises the top-k weights in this graph
    permute_qk: bool = False                   # "normal" rope: q/k rows permuted (llama.cpp's LlamaModel.permute)
    qkv_bias: bool = False                     # the graph loads q/k/v biases (attn_{q,k,v}.bias)
    expert_ff: bool = False                    # writes {arch}.expert_feed_forward_length (I)
    shared_ff: bool = False                    # writes {arch}.expert_shared_feed_forward_length (S)
    names: MappingProxyType = field(default_factory=lambda: GGUF_COMMON)


@dataclass(frozen=True)
class Published:
    """The published configuration measured at real width: config.json's fields, and where they were read."""
    label: str                                 # the checkpoint, e.g. "Mixtral-8x7B-v0.1"
    config: MappingProxyType                   # config.json keys (those that shape the model or its routing)
    citations: tuple                           # where each number was read
    bench_name: str | None = None              # the key bench receipts record it under (None: not benched)
    short: str = ""                            # the family's name in running text, e.g. "OLMoE"


@dataclass(frozen=True)
class Tiny:
    """A tiny configuration of the architecture: sizes, plus config keys the architecture needs set."""
    intermediate: int
    experts: int
    top_k: int
    kv_heads: int
    extra: MappingProxyType = field(default_factory=lambda: frozen_map({}))
    trained: bool = True                       # data/models/<name>/ holds a checkpoint trained by lab.train


@dataclass(frozen=True)
class Arch:
    """One architecture; `name` is transformers' model_type."""
    name: str
    causal_lm: str                             # the transformers class, e.g. "MixtralForCausalLM"
    layout: Layout
    keys: ConfigKeys
    gguf: Gguf
    published: Published
    tiny: Tiny

    # --- reading a config -------------------------------------------------------------------------------
    def sizes(self, cfg) -> dict:
        """{"experts", "top_k", "hidden", "intermediate", "shared_intermediate" (0: none), "heads", "kv_heads",
        "head_dim", "layers", "vocab"} of a transformers config (or a dict of config.json fields)."""
        get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        k = self.keys
        heads, hidden = get(k.heads), get(k.hidden)
        return {"experts": get(k.experts), "top_k": get(k.top_k), "hidden": hidden,
                "intermediate": get(k.intermediate),
                "shared_intermediate": get(k.shared_intermediate) if k.shared_intermediate else 0,
                "heads": heads, "kv_heads": get(k.kv_heads), "head_dim": get(k.head_dim) or hidden // heads,
                "layers": get(k.layers), "vocab": get(k.vocab)}

    def renormalises(self, cfg) -> bool:
        """Whether the model renormalises its top-k routing weights."""
        r = self.keys.renorm
        return r if isinstance(r, bool) else bool(getattr(cfg, r, False))

    def published_sizes(self) -> dict:
        return self.sizes(dict(self.published.config))

    @property
    def full_layers(self) -> int:
        return self.published.config[self.keys.layers]
