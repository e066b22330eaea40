"""Three small Mixture-of-Experts language models trained by this repository (nothing downloaded).

    from int4lab.models import ARCHS, load_tiny, load_tokenizer
    model = load_tiny("olmoe")                   # OlmoeForCausalLM, fp32, eval mode, on the CPU
    tok = load_tokenizer()

# E = experts, N = out features, K = in features, H = hidden size, I = expert intermediate size

| arch      | class               | experts E | top-k | H   | I   | layers | attention heads (kv) |
| mixtral   | MixtralForCausalLM  | 8         | 2     | 128 | 256 | 4      | 4 (2)                |
| olmoe     | OlmoeForCausalLM    | 32        | 8     | 128 | 64  | 4      | 4 (4), q/k norm       |
| qwen3_moe | Qwen3MoeForCausalLM | 32        | 8     | 128 | 64  | 4      | 4 (2), per-head q/k norm |

Where the expert weights are (transformers 5 stores each layer's experts fused, as 3-D parameters; the
same names in all three architectures, L = layer index):

    model.model.layers[L].mlp.experts.gate_up_proj   [E, 2I, H]  rows 0..I-1 = gate, I..2I-1 = up
    model.model.layers[L].mlp.experts.down_proj      [E, H, I]
    model.model.layers[L].mlp.gate.weight            [E, H]      router (kept in full precision)

Each expert e computes  down_proj[e] @ (silu(gate[e] @ x) * up[e] @ x)  with gate/up = gate_up_proj[e]
split in halves along dim 1 — so both are [N, K] matrices in the int4-b32 sense (K = H for gate_up,
K = I for down, both multiples of 32). In-memory state-dict keys: `model.layers.{L}.mlp.experts.gate_up_proj`,
`...down_proj`, `model.layers.{L}.mlp.gate.weight`. Attention projections are ordinary nn.Linear
(`model.layers.{L}.self_attn.{q,k,v,o}_proj.weight`), the output head is `lm_head.weight` [V, H].

On disk the keys differ: transformers 5 `save_pretrained` writes the per-expert layout the public hub
checkpoints use, each expert 2-D: OLMoE/Qwen3 `model.layers.{L}.mlp.experts.{e}.{gate,up,down}_proj.weight`,
Mixtral `model.layers.{L}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight` (w1 = gate, w3 = up, w2 = down);
`from_pretrained` fuses them back. So read weights through a loaded model, not by key from the
safetensors file.

Checkpoints: data/models/<arch>/{config.json, generation_config.json, model.safetensors} (bf16), trained
by `python -m lab.train`, with receipts data/receipts/train_<arch>.json (loss curve, validation
perplexity against the unigram baseline, device, versions, sha256 of the files). The tokenizer is not
copied into them: give lm-eval `tokenizer=<data/tokenizer>` or `HFLM(pretrained=model, tokenizer=load_tokenizer())`.
"""
from .checkpoints import MODELS_DIR, TOKENIZER_DIR, load_tiny, model_dir
from .configs import ARCHS, expert_shapes, tiny_config


def load_tokenizer(path=None, add_bos: bool = False):
    """The saved tokenizer as a PreTrainedTokenizerFast; `add_bos` adds exactly one BOS (see .tokenizer)."""
    # Imported here so `python -m int4lab.models.tokenizer` does not find its module already imported.
    from .tokenizer import load_tokenizer as _load
    return _load(path, add_bos)


__all__ = ["ARCHS", "MODELS_DIR", "TOKENIZER_DIR", "expert_shapes", "load_tiny", "load_tokenizer", "model_dir",
           "tiny_config"]
