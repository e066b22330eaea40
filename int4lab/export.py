"""Export a model to GGUF for llama.cpp: int4-b32 packs become `Q4_0` losslessly, the rest F32 (or F16).

    python -m int4lab.export --model mixtral --scheme rtn --targets experts --out mixtral-q4_0.gguf
    python -m int4lab.export --model olmoe --source --out olmoe-f32.gguf          # the unquantised reference
    python -m int4lab.export --model /path/to/ckpt --scheme gptq --out ckpt.gguf   # its tokenizer.json, if it has one
Shapes: E experts, N out, K in features (K % 32 == 0 for Q4_0), H hidden, I expert intermediate, V vocabulary, L layer.
Unless `--source`, `build_model` first quantises (`quantize_model`: RTN, or GPTQ on `--calib-tokens`); the writer
re-rounds no pack. `int4lab.q4_0.int4_b32_to_q4_0` transcodes each pack: other bytes (nibbles j|j+16, fp16 scale bits
copied per block), bit-identical decoded weights. Embeddings, lm_head, other 2+-dim weights F32 (exact for bf16/fp32) or
F16 (rounded, inf past fp16's range; finiteness is checked first, not the embedding's); F32 under either: norms, router,
biases, Qwen2-MoE's shared-expert gate [1, H]. Vocabulary: a checkpoint's tokenizer.json (ByteLevel BPE, else refused).

How transformers 5 names map onto llama.cpp's (gguf-py `MODEL_TENSOR` names, per block L; each architecture's
`int4lab.archs` record holds its mapping, llama.cpp architecture and routing flags):

    input_layernorm            blk.L.attn_norm          post_attention_layernorm  blk.L.ffn_norm
    self_attn.{q,k,v,o}_proj   blk.L.attn_{q,k,v,output}
    self_attn.{q,k}_norm       blk.L.attn_{q,k}_norm    (OLMoE: all heads, [H]; Qwen3: per head, [head_dim], explicit)
    mlp.gate (router)          blk.L.ffn_gate_inp       [E, H]
    mlp.experts.gate_up_proj   blk.L.ffn_gate_exps [E, I, H] (rows 0..I-1) and blk.L.ffn_up_exps (rows I..2I-1)
    mlp.experts.down_proj      blk.L.ffn_down_exps [E, H, I]
    mlp.shared_expert.{gate,up,down}_proj   blk.L.ffn_{gate,up,down}_shexp   (Qwen2-MoE, [S, H] / [H, S])
    mlp.shared_expert_gate     blk.L.ffn_gate_inp_shexp [1, H]     self_attn.{q,k,v}_proj.bias  blk.L.attn_{q,k,v}.bias

Mixtral goes to llama.cpp's `llama` architecture, which rotates adjacent pairs (its "normal" rope) where transformers
rotates halves; llama.cpp's converter therefore permutes the rows of q and k (`LlamaModel.permute`), and so do we:
whole Q4_0 rows move, losslessly. OLMoE, Qwen3-MoE and Qwen2-MoE use llama.cpp's NEOX rope, transformers' layout.
llama.cpp fixes each architecture's top-k renormalisation (llama, qwen3moe: yes; olmoe, qwen2moe: no); others refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from .format import BLOCK
from .q4_0 import int4_b32_to_q4_0
from .archs import arch_of
from .quantize import SCHEMES, TARGETS, Int4Experts, Int4Linear, decoder_layers, model_arch
from .quantize.layout import attention, experts_of, module_at, moe_block, shared_expert, shared_proj

FLOAT_TYPES = ("f32", "f16")


# ---- The one place that knows where a quantised module keeps its pack (adapt here if the modules change).

def module_packs(mod) -> dict | None:
    """{part: (packed uint8 [..., N, K/2], scales fp16 [..., N, K/32])} of a quantised module, None otherwise.
    Int4Linear -> {"weight": ...}; Int4Experts -> {"gate": ..., "up": ..., "down": ...}, gate/up being the two row
    halves of gate_up (rows 0..I-1 gate, I..2I-1 up), each [E, I, ...]."""
    if isinstance(mod, Int4Linear):
        return {"weight": (mod.packed, mod.scales)}
    if isinstance(mod, Int4Experts):
        I = mod.intermediate_dim
        p, s = mod.gate_up_packed, mod.gate_up_scales
        return {"gate": (p[:, :I], s[:, :I]), "up": (p[:, I:], s[:, I:]),
                "down": (mod.down_packed, mod.down_scales)}
    return None


# ---- Tensors -----------------------------------------------------------------------------------------------

def q4_0_tensor(name: str, packed: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """uint8 [..., N, K/32 * 18] Q4_0 bytes of one int4-b32 pack; ValueError naming `name` when K is not a
    multiple of 32 or a scale is not finite (llama.cpp would decode NaN/inf weights without a word)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"{name}: packed must be a uint8 torch.Tensor")
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float16:
        raise TypeError(f"{name}: scales must be a float16 torch.Tensor")
    N, K = packed.shape[-2], packed.shape[-1] * 2
    if K % BLOCK or scales.shape[-1] * BLOCK != K:
        raise ValueError(f"{name}: K = {K} with {scales.shape[-1]} scales per row; Q4_0 needs K a multiple "
                         f"of {BLOCK} and one scale per {BLOCK}")
    bad = ~torch.isfinite(scales)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: scale at {idx} is {float(scales[idx])}, not finite: refusing to write it")
    return int4_b32_to_q4_0(packed.contiguous(), scales.contiguous(), N, K).numpy()


def permute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's `LlamaModel.permute` on dim 0 (rows of q or k, [heads * head_dim, ...]): within each head,
    rows (0, hd/2, 1, hd/2 + 1, ...) -> the adjacent pairs its normal rope rotates."""
    n = t.shape[0]
    return t.reshape(heads, 2, n // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _float(t: torch.Tensor, ftype: str) -> np.ndarray:
    # 1-D tensors (norms) stay F32: llama.cpp's norm ops expect it (its converter does the same).
    dt = torch.float16 if (ftype == "f16" and t.dim() >= 2) else torch.float32
    return t.detach().to("cpu", dt).contiguous().numpy()


def _finite(name: str, t: torch.Tensor) -> torch.Tensor:
    """t, or ValueError naming `name` when it holds NaN or inf."""
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: holds NaN or inf values: refusing to write it")
    return t


def _block_linears(model, L: int, layer) -> tuple[list, list]:
    """Block L's Linears: (attention, shared expert) lists of (gguf base name, module, heads to permute by)."""
    a = arch_of(model)
    names, cfg = a.gguf.names, model.config
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads} if a.gguf.permute_qk else {}
    attn, shared = attention(layer, a), shared_expert(layer, a)
    return ([(f"blk.{L}.{names[p]}", getattr(attn, p), heads.get(p)) for p in a.layout.attn_proj],
            [(f"blk.{L}.{names[p]}", getattr(shared, p), None) for p in shared_proj(layer, a)])


def gguf_tensors(model, ftype: str = "f32"):
    """Yield (gguf name, numpy array, "Q4_0" | None) for every tensor llama.cpp loads for this model: a quantised
    module yields Q4_0 bytes (uint8 [..., N, K/32 * 18]); any other weight yields float data."""
    a = arch_of(model)
    lay, names = a.layout, a.gguf.names

    def linear(base, mod, heads=None):
        name = f"{base}.weight"
        packs = module_packs(mod)
        if packs is not None:
            p, s = packs["weight"]
            if heads is not None:
                p, s = permute_rows(p, heads), permute_rows(s, heads)
            yield name, q4_0_tensor(name, p, s), "Q4_0"
        else:
            w = mod.weight.detach()
            yield name, _float(_finite(name, w if heads is None else permute_rows(w, heads)), ftype), None
        if getattr(mod, "bias", None) is not None:
            if not a.gguf.qkv_bias:
                raise ValueError(f"{name}: has a bias; llama.cpp's {a.gguf.arch} graph has none to load it into")
            bias = mod.bias.detach() if heads is None else permute_rows(mod.bias.detach(), heads)
            yield f"{base}.bias", _float(_finite(f"{base}.bias", bias), "f32"), None

    def norm(name, mod):
        return name, _float(_finite(name, mod.weight), "f32"), None

    yield f"{names['embed']}.weight", _float(module_at(model, lay.embed).weight, ftype), None
    for L, layer in enumerate(decoder_layers(model)):
        b = f"blk.{L}"
        attn, moe = attention(layer, a), moe_block(layer, a)
        attn_lin, shared_lin = _block_linears(model, L, layer)
        yield norm(f"{b}.{names[lay.input_norm]}.weight", getattr(layer, lay.input_norm))
        for base, mod, heads in attn_lin:
            yield from linear(base, mod, heads)
        for qk in lay.qk_norms:
            yield norm(f"{b}.{names[qk]}.weight", getattr(attn, qk))
        yield norm(f"{b}.{names[lay.post_norm]}.weight", getattr(layer, lay.post_norm))
        if moe is None:
            raise ValueError(f"layer {L} has a dense MLP (mlp_only_layers / decoder_sparse_step): llama.cpp's "
                             f"{a.gguf.arch} graph expects experts in every layer")
        yield norm(f"{b}.{names['router']}.weight", getattr(moe, lay.router))     # kept F32, as the router runs
        ex = experts_of(layer, a)
        packs = module_packs(ex)
        if packs is None:
            gu, dn = (getattr(ex, n).detach() for n in lay.fused)
            I = gu.shape[1] // 2
            packs = {"gate": gu[:, :I], "up": gu[:, I:], "down": dn}
        for part in ("gate", "up", "down"):
            name = f"{b}.{names[part]}.weight"
            if isinstance(packs[part], tuple):
                yield name, q4_0_tensor(name, *packs[part]), "Q4_0"
            else:
                yield name, _float(_finite(name, packs[part]), ftype), None
        for base, mod, _ in shared_lin:
            yield from linear(base, mod)
        if lay.shared_gate is not None:
            yield norm(f"{b}.{names[lay.shared_gate]}.weight", getattr(moe, lay.shared_gate))
    yield norm(f"{names['final_norm']}.weight", module_at(model, lay.final_norm))
    yield from linear(names["lm_head"], model.lm_head)


# ---- Metadata ----------------------------------------------------------------------------------------------

def _check_mappable(model) -> str:
    """llama.cpp architecture name for `model`, or ValueError saying what cannot be mapped."""
    a = arch_of(model)                  # ValueError for an architecture int4lab does not handle
    gguf_arch, renorm = a.gguf.arch, a.gguf.renorm
    cfg = model.config
    ours = a.renormalises(cfg)
    if ours != renorm:
        raise ValueError(f"config.norm_topk_prob = {ours}, but llama.cpp's {gguf_arch} graph "
                         f"{'renormalises' if renorm else 'does not renormalise'} the top-k weights: cannot map")
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope.get('rope_type')!r} is not mapped (only 'default' rope)")
    if getattr(cfg, "attention_bias", False):
        raise ValueError("attention_bias = True: llama.cpp's MoE graphs load no q/k/v biases here")
    if getattr(cfg, "sliding_window", None):
        raise ValueError(f"sliding_window = {cfg.sliding_window} is not mapped")
    return gguf_arch


def add_hparams(writer, model) -> None:
    """The {arch}.* keys llama.cpp reads for this model (names as llama.cpp's converter writes them)."""
    cfg = model.config
    a = arch_of(model)
    ex = a.sizes(cfg)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(ex["hidden"])
    writer.add_block_count(ex["layers"])
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(ex["heads"])
    writer.add_head_count_kv(ex["kv_heads"])
    writer.add_key_length(ex["head_dim"])
    writer.add_value_length(ex["head_dim"])
    writer.add_rope_dimension_count(ex["head_dim"])
    writer.add_rope_freq_base(float((cfg.rope_parameters or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_expert_count(ex["experts"])
    writer.add_expert_used_count(ex["top_k"])
    writer.add_vocab_size(ex["vocab"])
    if a.gguf.expert_ff:
        writer.add_expert_feed_forward_length(ex["intermediate"])
    if a.gguf.shared_ff:
        writer.add_expert_shared_feed_forward_length(ex["shared_intermediate"])


def read_tokenizer(tokenizer_dir=None):
    """(path, tokenizer.json dict, {token: id} with specials, {id: special}, token count) of `tokenizer_dir`'s BPE."""
    from .models import TOKENIZER_DIR
    path = Path(tokenizer_dir or TOKENIZER_DIR) / "tokenizer.json"
    tj = json.loads(path.read_text(encoding="utf-8"))
    if tj["model"]["type"] != "BPE" or (tj.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise ValueError(f"{path}: only a BPE whose pre_tokenizer is ByteLevel itself maps onto llama.cpp's gpt2 vocab")
    vocab = dict(tj["model"]["vocab"])
    specials = {t["id"]: t["content"] for t in tj.get("added_tokens", [])}
    if not {"<|bos|>", "<|eos|>"} <= set(specials.values()):    # what `add_tokenizer` names llama.cpp's BOS and EOS
        raise ValueError(f"{path}: needs special tokens <|bos|> and <|eos|> (written as the GGUF's BOS and EOS)")
    vocab.update({c: i for i, c in specials.items()})
    return path, tj, vocab, specials, max(vocab.values()) + 1


def add_tokenizer(writer, tokenizer_dir=None, add_bos: bool = True) -> None:
    """Our byte-level BPE (tokenizer.json) as a gpt2-style vocabulary: tokens, types, merges, specials. llama.cpp's
    `gpt-2` pre-tokeniser is the regex of HF's ByteLevel(use_regex=True). add_bos: llama.cpp prepends <|bos|> when it
    tokenises a prompt, matching the <|bos|> + text windows that lab.llamacpp scores (in training the models saw a
    single <|bos|>, at the start of the training stream)."""
    import gguf
    path, tj, vocab, specials, n = read_tokenizer(tokenizer_dir)
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for tok, i in vocab.items():
        tokens[i] = tok
        types[i] = gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    byname = {c: i for i, c in specials.items()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(byname["<|bos|>"])
    writer.add_eos_token_id(byname["<|eos|>"])
    writer.add_pad_token_id(byname["<|eos|>"])
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)


# ---- Writing and reading back ------------------------------------------------------------------------------

def write_gguf(model, path, *, name: str | None = None, ftype: str = "f32", tokenizer_dir=None,
               force: bool = False) -> Path:
    """Write `model` (quantised by `quantize_model`, or not) to `path` as GGUF; returns the path.

    ftype: "f32" or "f16" for the weights that are not int4-b32 packs (norms, the router, biases and the shared-expert
    gate stay F32). An existing file is refused unless force=True. The file is written beside `path` and renamed onto
    it when complete: an error or an interrupt leaves no partial file under `path` (and the old one intact). The
    tokenizer written is the one in `tokenizer_dir` (default: this repository's); a model whose embedding rows differ
    from its token count is refused before anything is written (llama.cpp would refuse the file).
    """
    import gguf
    from .files import check_out_path
    from .files import atomic_path
    if ftype not in FLOAT_TYPES:
        raise ValueError(f"ftype must be one of {FLOAT_TYPES}, got {ftype!r}")
    path = check_out_path(path, flag="path", force=bool(force))
    gguf_arch = _check_mappable(model)
    tok_path, _, _, _, n_tokens = read_tokenizer(tokenizer_dir)
    rows = model.get_input_embeddings().weight.shape[0]
    if rows != n_tokens:      # llama.cpp sizes the embedding by the token list and refuses the file at load
        raise ValueError(f"model: its embedding has {rows} rows but the tokenizer written beside it ({tok_path}) has "
                         f"{n_tokens} tokens; llama.cpp sizes the embedding by the token list, so they must match "
                         "(convert a hub checkpoint with llama.cpp's convert_hf_to_gguf.py)")
    tensors = list(gguf_tensors(model, ftype))          # every check runs before the file is opened
    quantised = any(q == "Q4_0" for _, _, q in tensors)
    ft = (gguf.LlamaFileType.MOSTLY_Q4_0 if quantised else
          gguf.LlamaFileType.MOSTLY_F16 if ftype == "f16" else gguf.LlamaFileType.ALL_F32)
    with atomic_path(path) as tmp:
        w = gguf.GGUFWriter(str(tmp), gguf_arch)
        w.add_name(name or f"int4lab-{model_arch(model)}")
        w.add_file_type(ft)
        sch = getattr(model, "int4_scheme", None)
        w.add_string("int4lab.scheme", sch.name if sch is not None else "source")
        add_hparams(w, model)
        add_tokenizer(w, tokenizer_dir)
        for tname, data, q in tensors:
            w.add_tensor(tname, data, raw_dtype=gguf.GGMLQuantizationType.Q4_0 if q == "Q4_0" else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def expected_q4_0(model) -> dict:
    """{gguf name: (packed, scales)} of every int4-b32 pack the export writes as Q4_0 (q/k permuted for llama)."""
    out = {}
    a = arch_of(model)
    for L, layer in enumerate(decoder_layers(model)):
        for base, mod, heads in sum(_block_linears(model, L, layer), []):
            packs = module_packs(mod)
            if packs is not None:
                p, s = packs["weight"]
                out[f"{base}.weight"] = (p, s) if heads is None else (permute_rows(p, heads), permute_rows(s, heads))
        packs = module_packs(experts_of(layer, a))
        for part in ("gate", "up", "down") if packs else ():
            out[f"blk.{L}.{a.gguf.names[part]}.weight"] = packs[part]
    packs = module_packs(model.lm_head)
    if packs:
        out[f"{a.gguf.names['lm_head']}.weight"] = packs["weight"]
    return out


def read_q4_0_decoded(path) -> dict:
    """{name: float32 numpy [..., N, K]} of every Q4_0 tensor in a GGUF file, decoded by the `gguf`
    package's own reference dequantiser (an implementation this repository did not write)."""
    import gguf
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_0:
            out[t.name] = gguf.quants.dequantize(np.asarray(t.data), gguf.GGMLQuantizationType.Q4_0)
    return out


# ---- Command line ------------------------------------------------------------------------------------------

def build_model(model: str, scheme: str | None, targets: str = "experts", *, calib_tokens: int = 16384,
                calib_len: int = 256, progress: bool = False):
    """(model fp32 on the CPU, tokenizer, short name): the source, or quantised by `quantize_model`
    (scheme "rtn" | "gptq"; W4A8, as llama.cpp's CPU path runs). GPTQ: the gate's draw#0 (seed 0) on the training
    split, calib_tokens in windows of calib_len (the gate's defaults for the small models only)."""
    from .gate import calibration_ids, load_model
    from .quantize import quantize_model
    m, tok, name = load_model(model, torch.float32, "cpu")
    if scheme is None:
        return m, tok, name
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    calib = calibration_ids(tok, calib_tokens, calib_len) if scheme == "gptq" else None
    m, _ = quantize_model(m, scheme, targets, "int8", calib_ids=calib, progress=progress)
    return m, tok, name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m int4lab.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="mixtral | olmoe | qwen3_moe | a checkpoint directory")
    ap.add_argument("--scheme", choices=SCHEMES, default=None, help="how the codes are chosen (default rtn)")
    ap.add_argument("--targets", choices=TARGETS, default=None, help="what is quantised (default experts)")
    ap.add_argument("--source", action="store_true",
                    help="write the unquantised model instead (reference; takes no --scheme / --targets)")
    ap.add_argument("--ftype", choices=FLOAT_TYPES, default="f32", help="type of the weights that are not packs")
    ap.add_argument("--calib-tokens", type=int, default=16384, help="GPTQ calibration tokens (train split)")
    ap.add_argument("--calib-len", type=int, default=256, help="calibration window (256, the small models' context)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    args = ap.parse_args(argv)
    from .files import check_out_path
    from .gate.cli import model_name_and_context
    from .gate.settings import check_settings
    try:                                              # refused before the model is built
        if args.source and (args.scheme or args.targets):
            raise ValueError("--source writes the unquantised model: drop --scheme / --targets, or drop --source")
        check_out_path(args.out, force=args.force)
        _, context = model_name_and_context(args.model)   # a tiny model name, or a directory with a usable config
        own = Path(args.model) / "tokenizer.json"          # a checkpoint's own vocabulary, checked before the build
        tok_dir = read_tokenizer(own.parent)[0].parent if own.is_file() else None
        check_settings(calib_tokens=args.calib_tokens, calib_len=args.calib_len,    # the gate's calibration rules
                       trained_context=None if args.source else context)
        scheme, targets = args.scheme or "rtn", args.targets or "experts"
        m, _, name = build_model(args.model, None if args.source else scheme, targets,
                                 calib_tokens=args.calib_tokens, calib_len=args.calib_len, progress=True)
        label = "source" if args.source else f"{scheme}-{targets}"
        path = write_gguf(m, args.out, name=f"{name}-{label}", ftype=args.ftype, force=args.force,
                          tokenizer_dir=tok_dir)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    nq = len(expected_q4_0(m))
    print(f"{path}: {path.stat().st_size / 2**20:.2f} MiB, {nq} Q4_0 tensors ({label})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
