"""Mixtral: 8 experts, top-2 (weights always renormalised), grouped-query attention, no q/k norms.

llama.cpp runs it as its `llama` architecture, whose "normal" rope rotates adjacent pairs where transformers
rotates halves: q and k rows are permuted on export (whole rows move, so a Q4_0 pack stays lossless).
"""
from .base import Arch, ConfigKeys, Gguf, Layout, Published, Tiny, frozen_map

ARCH = Arch(
    name="mixtral",
    causal_lm="MixtralForCausalLM",
    layout=Layout(),
    keys=ConfigKeys(intermediate="intermediate_size", experts="num_local_experts", renorm=True),
    gguf=Gguf(arch="llama", renorm=True, permute_qk=True),
    published=Published(
        label="Mixtral-8x7B-v0.1",
        config=frozen_map({
            "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "sliding_window": None, "hidden_act": "silu",
            "router_aux_loss_coef": 0.02, "initializer_range": 0.02, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2,
        }),
        citations=(
            "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
            "transformers 5.23 MixtralConfig defaults agree: head_dim absent, so D = 4096 / 32 = 128",
        ),
        bench_name="mixtral",
        short="Mixtral",
    ),
    # 2 x I=256 per token: the same expert width per token as the 8 x I=64 of the other tiny models
    tiny=Tiny(intermediate=256, experts=8, top_k=2, kv_heads=2),
)
