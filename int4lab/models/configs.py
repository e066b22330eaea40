"""transformers configs of the three tiny MoE models: Mixtral (8 experts, top-2), OLMoE and Qwen3-MoE
(32 experts, top-8); their sizes are the rows of TINY.

# E = experts, N = out features, K = in features, H = hidden size, I = expert intermediate size

All three share H = 128, 4 layers, 4 attention heads of 32 and a 4096-token vocabulary, and spend the same
expert width per token: Mixtral 2 x I=256, OLMoE/Qwen3 8 x I=64. Every matrix an int4-b32 kernel sees has
K a multiple of 32 (gate_up: K = H = 128; down: K = I = 256 or 64).
"""
from __future__ import annotations

from typing import NamedTuple


class TinySizes(NamedTuple):
    """One tiny model's sizes: H, one expert's I, E experts, top-k, heads, kv heads, head dim D."""
    hidden: int
    intermediate: int
    n_experts: int
    top_k: int
    n_heads: int
    n_kv_heads: int
    head_dim: int


# H = 128, 4 heads of 32, the same expert width per token (2 x 256 = 8 x 64).
TINY = {"mixtral": TinySizes(128, 256, 8, 2, 4, 2, 32), "olmoe": TinySizes(128, 64, 32, 8, 4, 4, 32),
        "qwen3_moe": TinySizes(128, 64, 32, 8, 4, 2, 32)}

ARCHS = tuple(TINY)

VOCAB_SIZE = 4096
HIDDEN = TINY["mixtral"].hidden             # the three share H, heads and head_dim (asserted below)
LAYERS = 4
HEADS = TINY["mixtral"].n_heads
assert all((t.hidden, t.n_heads, t.head_dim) == (HIDDEN, HEADS, HIDDEN // HEADS) for t in TINY.values())
MAX_POSITIONS = 512

# Special-token ids fixed by the tokenizer build (int4lab/models/tokenizer.py puts them first).
BOS_ID, EOS_ID = 0, 1


def check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def tiny_config(arch: str, vocab_size: int = VOCAB_SIZE):
    """A fresh transformers config (MixtralConfig / OlmoeConfig / Qwen3MoeConfig) for `arch`.

    output_router_logits stays False in the saved config: with it on, transformers adds the load-balancing
    loss to the loss it returns for `labels`, which would inflate every perplexity measured later. The
    training script asks for router logits per call instead.
    """
    check_arch(arch)
    t = TINY[arch]
    common = dict(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
                  output_router_logits=False, router_aux_loss_coef=0.01, initializer_range=0.02,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "mixtral":
        from transformers import MixtralConfig
        return MixtralConfig(**common, intermediate_size=t.intermediate, num_local_experts=t.n_experts,
                             num_experts_per_tok=t.top_k, num_key_value_heads=t.n_kv_heads)
    if arch == "olmoe":
        from transformers import OlmoeConfig
        # OLMoE: no grouped-query attention, router probabilities not renormalised over the top-k.
        return OlmoeConfig(**common, intermediate_size=t.intermediate, num_experts=t.n_experts,
                           num_experts_per_tok=t.top_k, num_key_value_heads=t.n_kv_heads, norm_topk_prob=False)
    from transformers import Qwen3MoeConfig
    # Qwen3-MoE: every layer sparse (decoder_sparse_step=1), top-k weights renormalised as in Qwen3-30B-A3B.
    # intermediate_size is the dense MLP's width, unused here: every layer is sparse.
    return Qwen3MoeConfig(**common, moe_intermediate_size=t.intermediate, intermediate_size=256,
                          num_experts=t.n_experts, num_experts_per_tok=t.top_k, num_key_value_heads=t.n_kv_heads,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])


def expert_shapes(config) -> dict:
    """{"experts": E, "top_k": k, "hidden": H, "intermediate": I} read from any of the three configs."""
    inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    return {"experts": experts, "top_k": config.num_experts_per_tok, "hidden": config.hidden_size,
            "intermediate": inter}
