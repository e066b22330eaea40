"""transformers configs of the tiny MoE models, built from each architecture's `int4lab.archs` record (its
`tiny` field): Mixtral (8 experts, top-2), OLMoE and Qwen3-MoE (32 experts, top-8) are trained here
(ARCHS); an architecture whose record says trained=False (Qwen2-MoE) gets the same kind of config for tests.

# E = experts, N = out features, K = in features, H = hidden size, I = expert intermediate size

All share H = 128, 4 layers, 4 attention heads of 32 and a 4096-token vocabulary; the trained three spend the
same expert width per token: Mixtral 2 x I=256, OLMoE/Qwen3 8 x I=64. Every matrix an int4-b32 kernel sees
has K a multiple of 32 (gate_up: K = H = 128; down: K = I = 256 or 64).
"""
from __future__ import annotations

from ..archs import ARCHS as _ALL
from ..archs import TRAINED, arch_of, get

ARCHS = TRAINED                               # the tiny models trained in this repository (data/models/<arch>/)

VOCAB_SIZE = 4096
HIDDEN = 128
LAYERS = 4
HEADS = 4
MAX_POSITIONS = 512

# Special-token ids fixed by the tokenizer build (int4lab/models/tokenizer.py puts them first).
BOS_ID, EOS_ID = 0, 1


def check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def tiny_config(arch: str, vocab_size: int = VOCAB_SIZE, layers: int = LAYERS):
    """A fresh transformers config (MixtralConfig / OlmoeConfig / Qwen3MoeConfig / Qwen2MoeConfig) for `arch`.

    output_router_logits stays False in the saved config: with it on, transformers adds the load-balancing
    loss to the loss it returns for `labels`, which would inflate every perplexity measured later. The
    training script asks for router logits per call instead.
    """
    if arch not in _ALL:
        raise ValueError(f"arch must be one of {tuple(_ALL)}, got {arch!r}")
    from transformers import AutoConfig
    a = get(arch)
    t, k = a.tiny, a.keys
    fields = dict(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=layers,
                  num_attention_heads=HEADS, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
                  output_router_logits=False, router_aux_loss_coef=0.01, initializer_range=0.02,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    fields.update({k.intermediate: t.intermediate, k.experts: t.experts, k.top_k: t.top_k, k.kv_heads: t.kv_heads})
    fields.update({key: list(v) if isinstance(v, list) else v for key, v in t.extra.items()})
    return AutoConfig.for_model(arch, **fields)


def expert_shapes(config) -> dict:
    """{"experts": E, "top_k": k, "hidden": H, "intermediate": I} of any supported config (its record's keys)."""
    s = arch_of(config).sizes(config)
    return {k: s[k] for k in ("experts", "top_k", "hidden", "intermediate")}
