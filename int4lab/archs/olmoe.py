"""OLMoE: 64 experts, top-8, router weights not renormalised, q/k norms over all heads ([H]), no GQA."""
from .base import Arch, ConfigKeys, Gguf, Layout, Published, Tiny, frozen_map

ARCH = Arch(
    name="olmoe",
    causal_lm="OlmoeForCausalLM",
    layout=Layout(qk_norms=("q_norm", "k_norm")),
    keys=ConfigKeys(intermediate="intermediate_size", experts="num_experts"),
    gguf=Gguf(arch="olmoe", renorm=False),
    published=Published(
        label="OLMoE-1B-7B-0924",
        config=frozen_map({
            "model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
            "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
            "num_experts": 64, "num_experts_per_tok": 8, "max_position_embeddings": 4096,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "norm_topk_prob": False, "clip_qkv": None,
            "hidden_act": "silu", "router_aux_loss_coef": 0.01, "initializer_range": 0.02,
            "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1,
        }),
        citations=(
            "https://huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json (intermediate_size 1024; "
            "OlmoeConfig's default is 2048)",
            "the recorded H200 peer shapes 2048x2048 (gate_up) and 2048x1024 (down) agree: "
            "data/receipts/anchors/decode_h200_2026-12-02.json",
        ),
        bench_name="olmoe",
        short="OLMoE",
    ),
    # OLMoE: no grouped-query attention, router probabilities not renormalised over the top-k
    tiny=Tiny(intermediate=64, experts=32, top_k=8, kv_heads=4, extra=frozen_map({"norm_topk_prob": False})),
)
