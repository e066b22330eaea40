"""Qwen3-MoE: 128 experts, top-8, renormalised top-k, per-head q/k norms ([D]), an explicit head_dim."""
from .base import Arch, ConfigKeys, Gguf, Layout, Published, Tiny, frozen_map

ARCH = Arch(
    name="qwen3_moe",
    causal_lm="Qwen3MoeForCausalLM",
    layout=Layout(qk_norms=("q_norm", "k_norm")),
    keys=ConfigKeys(intermediate="moe_intermediate_size", experts="num_experts"),
    gguf=Gguf(arch="qwen3moe", renorm=True, expert_ff=True),
    published=Published(
        label="Qwen3-30B-A3B",
        config=frozen_map({
            "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "sliding_window": None,
            "use_sliding_window": False, "max_window_layers": 48, "hidden_act": "silu",
            "router_aux_loss_coef": 0.001, "initializer_range": 0.02, "tie_word_embeddings": False,
            "bos_token_id": 151643, "eos_token_id": 151645,
        }),
        citations=(
            "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
            "head_dim 128 is explicit (not hidden / heads = 64), as Megatron recipes state with --kv-channels 128 "
            "(zyzshishui/slime scripts/models/qwen3-30B-A3B.sh): q 4096x2048, o 2048x4096",
        ),
        bench_name="qwen3",          # the name the recorded bench receipts use for it
        short="Qwen3",
    ),
    # every layer sparse (decoder_sparse_step 1); intermediate_size is the dense MLP's width, unused here
    tiny=Tiny(intermediate=64, experts=32, top_k=8, kv_heads=2,
              extra=frozen_map({"intermediate_size": 256, "norm_topk_prob": True, "decoder_sparse_step": 1,
                                "mlp_only_layers": []})),
)
