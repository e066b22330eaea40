"""Qwen2-MoE: 60 routed experts, top-4 (not renormalised), and a shared expert every token passes through.

The MoE block (transformers 5 `Qwen2MoeSparseMoeBlock`) adds to the routed experts' sum
    sigmoid(shared_expert_gate(x)) * shared_expert(x)
where shared_expert is a dense SwiGLU MLP (gate_proj, up_proj [S, H], down_proj [H, S]) and shared_expert_gate
an nn.Linear [1, H]. The shared MLP is quantised with the experts (three int4 GEMVs per token); its gate,
like the router, stays in full precision. Attention has q/k/v biases (config qkv_bias, default True), which
llama.cpp's qwen2moe graph loads. gguf-py's MODEL_ARCH.QWEN2MOE lists the shared tensors as
ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp.
"""
from .base import Arch, ConfigKeys, Gguf, Layout, Published, Tiny, frozen_map

ARCH = Arch(
    name="qwen2_moe",
    causal_lm="Qwen2MoeForCausalLM",
    layout=Layout(shared_expert="shared_expert", shared_proj=("gate_proj", "up_proj", "down_proj"),
                  shared_gate="shared_expert_gate"),
    keys=ConfigKeys(intermediate="moe_intermediate_size", experts="num_experts",
                    shared_intermediate="shared_expert_intermediate_size"),
    gguf=Gguf(arch="qwen2moe", renorm=False, qkv_bias=True, expert_ff=True, shared_ff=True),
    published=Published(
        label="Qwen1.5-MoE-A2.7B",
        config=frozen_map({
            "model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
            "max_position_embeddings": 8192, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
            "norm_topk_prob": False, "decoder_sparse_step": 1, "sliding_window": 32768,
            "use_sliding_window": False, "max_window_layers": 21, "hidden_act": "silu",
            "router_aux_loss_coef": 0.001, "initializer_range": 0.02, "tie_word_embeddings": False,
            "qkv_bias": True, "bos_token_id": 151643, "eos_token_id": 151643,
        }),
        citations=(
            "Qwen/Qwen1.5-MoE-A2.7B config.json, as copied with _name_or_path Qwen/Qwen1.5-MoE-A2.7B in "
            "https://huggingface.co/MaziyarPanahi/Qwen1.5-MoE-A2.7B-Wikihow/blob/main/config.json and (with "
            "bos_token_id 151643) "
            "https://huggingface.co/RichardErkhov/Qwen_-_Qwen1.5-MoE-A2.7B-8bits/blame/main/config.json",
            "transformers 5.23 Qwen2MoeConfig (documented checkpoint Qwen/Qwen1.5-MoE-A2.7B) has the same defaults: "
            "hidden 2048, moe_intermediate 1408, shared_expert_intermediate 5632, 60 experts, top-4, 16 heads; "
            "qkv_bias is absent from config.json and True by default ('attention QKV bias', "
            "https://huggingface.co/docs/transformers/en/model_doc/qwen2_moe)",
            "head_dim absent: D = 2048 / 16 = 128",
        ),
        short="Qwen2-MoE",
    ),
    # not trained here: the tests build it with random weights (a shared expert of 2 x I, as 4 x 1408 = 5632
    # is 4 routed widths in the published model)
    tiny=Tiny(intermediate=64, experts=8, top_k=2, kv_heads=4, trained=False,
              extra=frozen_map({"shared_expert_intermediate_size": 128, "intermediate_size": 256,
                                "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                                "qkv_bias": True})),
)
