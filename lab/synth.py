"""Synthetic checkpoints with the published configurations: the real-checkpoint path without a model hub.

    python -m lab.synth --arch mixtral --layers 2 --out /tmp/mixtral-2l            # real width
    python -m lab.synth --arch qwen3_moe --layers 2 --width tiny --out /tmp/q     # CPU tests

Writes what a hub download of the model holds, truncated to N decoder layers: config.json and
generation_config.json, the weights by `save_pretrained` as sharded safetensors
(model-0000i-of-0000n.safetensors plus model.safetensors.index.json, transformers 5's on-disk per-expert
key layout), and a tokenizer. The weights are random, normal(0, initializer_range) as transformers
initialises them (norms 1), so a perplexity on them means nothing: what a run on them measures is the
pipeline — loading, quantising, memory, time.

The tokenizer is this repository's 4096-token BPE (`int4lab.models.load_tokenizer`), not the model's own:
its ids are a subset of every published vocabulary (32000 / 50304 / 151936 / 151936), so every id it emits has an
embedding row. The config keeps the published special-token ids.

`--width real` (default) uses the published configuration; `--width tiny` the same structure (expert
count, top-k, head layout, routing options) at tiny dimensions, for tests on a CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from int4lab.archs import ARCHS as RECORDS

# The published configurations, as the keys of each model's config.json on the Hugging Face hub: the `published`
# field of each `int4lab.archs` record (where its citations are). Only the fields that shape the model or its
# routing are kept; num_hidden_layers is the full depth.
PUBLISHED = {name: dict(a.published.config) for name, a in RECORDS.items()}
ARCHS = tuple(PUBLISHED)
WIDTHS = ("real", "tiny")
FULL_LAYERS = {a: c["num_hidden_layers"] for a, c in PUBLISHED.items()}

# Tiny width: the published structure (experts, top-k, kv grouping, explicit head_dim) at CPU size.
# Every expert matrix keeps K a multiple of 32 (int4-b32 blocks); 4096 = this repository's tokenizer.
TINY = {"hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128,
        "num_attention_heads": 4, "vocab_size": 4096, "max_position_embeddings": 512}


def _check(arch, layers, width) -> None:
    if arch not in PUBLISHED:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= FULL_LAYERS[arch]:
        raise ValueError(f"layers must be an int in [1, {FULL_LAYERS[arch]}] for {arch} (its published depth), "
                         f"got {layers!r}")
    if width not in WIDTHS:
        raise ValueError(f"width must be one of {WIDTHS}, got {width!r}")


def config_fields(arch: str, layers: int, width: str = "real") -> dict:
    """The config.json fields of the synthetic checkpoint: PUBLISHED[arch] with num_hidden_layers = layers
    (and, at tiny width, the TINY dimensions with the published head grouping kept)."""
    _check(arch, layers, width)
    f = dict(PUBLISHED[arch], num_hidden_layers=layers)
    if width == "tiny":
        heads = TINY["num_attention_heads"]
        group = f["num_attention_heads"] // f["num_key_value_heads"]         # keep GQA's ratio where it fits
        f.update({k: v for k, v in TINY.items() if k in f})
        f["num_key_value_heads"] = max(1, heads // group)
        if "head_dim" in f:
            f["head_dim"] = 32                  # explicit and != hidden / heads, as in Qwen3-30B-A3B
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if f.get(k) is not None:
                f[k] = 1 if k == "eos_token_id" else 0   # the tiny vocabulary's <|bos|> / <|eos|>
        if "max_window_layers" in f:
            f["max_window_layers"] = layers
    return f


def synth_config(arch: str, layers: int, width: str = "real"):
    """A transformers config (MixtralConfig / OlmoeConfig / Qwen3MoeConfig / Qwen2MoeConfig) from `config_fields`."""
    from transformers import AutoConfig
    f = config_fields(arch, layers, width)
    mt = f.pop("model_type")
    # transformers 5 keeps rope settings in rope_parameters; config.json's rope_theta maps there.
    f["rope_parameters"] = {"rope_type": "default", "rope_theta": f.pop("rope_theta")}
    f["output_router_logits"] = False
    return AutoConfig.for_model(mt, **f)


def _init_(model, std: float) -> None:
    """Weights normal(0, std) in the parameters' own dtype and device (no float32 copy of the model);
    norm weights 1. The router is a plain weight too: normal, as transformers initialises it."""
    g = torch.Generator(device=next(model.parameters()).device)
    g.manual_seed(int(torch.initial_seed()) % 2 ** 63)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.split(".")[-2] or name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()                                   # biases (none in these three), kept at 0
            else:
                p.normal_(0.0, std, generator=g)


def write_checkpoint(arch: str, layers: int, out, width: str = "real", seed: int = 0,
                     max_shard_size: str | int = "2GB", dtype: torch.dtype = torch.bfloat16,
                     device: str | None = None) -> dict:
    """Write the synthetic checkpoint into out (created; must be empty or absent); returns a summary:
    {"arch", "layers", "width", "params", "bytes", "shards", "build_s", "save_s", "config": fields}.

    device: where the weights are drawn (default cuda when available): bf16 on the device, written from
    there, so no host copy of the whole model exists at once beyond one shard.
    """
    _check(arch, layers, width)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    from int4lab.files import check_dir_path
    out = check_dir_path(out, flag="out")            # a directory or a new path, writable, before anything is built
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"out {str(out)!r} exists and is not empty: choose a fresh directory")
    check_shard_size(max_shard_size)
    from transformers import AutoModelForCausalLM

    from int4lab.gate.settings import check_device
    from int4lab.models import load_tokenizer
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    cfg = synth_config(arch, layers, width)
    torch.manual_seed(seed)
    t0 = time.time()
    # Built on the meta device, then allocated on `device` in `dtype`: transformers' own init would run
    # first on the host in float32 otherwise.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model = model.to_empty(device=device)
    _init_(model, cfg.initializer_range)
    _reset_buffers(model)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    build_s = time.time() - t0
    t0 = time.time()
    with _staged_dir(out) as tmp:
        model.save_pretrained(tmp, max_shard_size=max_shard_size)
        load_tokenizer().save_pretrained(tmp)
    save_s = time.time() - t0
    shards = sorted(p.name for p in out.glob("model*.safetensors"))
    summary = {"arch": arch, "layers": layers, "full_layers": FULL_LAYERS[arch], "width": width, "seed": seed,
               "dtype": str(dtype).replace("torch.", ""), "params": sum(p.numel() for p in model.parameters()),
               "bytes": sum((out / s).stat().st_size for s in shards), "shards": shards,
               "build_s": build_s, "save_s": save_s, "config": config_fields(arch, layers, width)}
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return summary


def check_shard_size(size) -> int:
    """Bytes of `size` (an int, or "2GB", "500MB", "1GiB", ... as save_pretrained reads it); ValueError naming
    --max-shard-size unless it is a positive size."""
    from transformers.utils.hub import convert_file_size_to_int
    try:
        n = convert_file_size_to_int(size)
    except (ValueError, TypeError):
        n = None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"--max-shard-size: max_shard_size must be a positive size such as 2GB, 500MB or "
                         f"1GiB, got {size!r}")
    return n


@contextlib.contextmanager
def _staged_dir(out: Path):
    """Yield a fresh directory beside `out` to write the checkpoint into; on success its files get the umask's
    mode (safetensors writes 0600) and it is renamed onto `out` (absent or empty), so `out` never holds half
    a checkpoint. On any exception, an interrupt included, the staged directory is removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.rglob("*"):
            os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        os.replace(tmp, out)                    # onto an empty directory or a fresh name: one rename
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _reset_buffers(model) -> None:
    """Recompute the non-persistent buffers `to_empty` left uninitialised (the rotary inverse frequencies):
    a fresh rotary module on the host holds them, copied onto the model's device."""
    for m in model.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "config"):
            dev = m.inv_freq.device
            fresh = type(m)(m.config)
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(m, name, buf.to(dev))
            m.attention_scaling = fresh.attention_scaling


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.synth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, choices=ARCHS)
    ap.add_argument("--layers", type=int, required=True, help="decoder layers kept (the published depth at most)")
    ap.add_argument("--out", required=True, help="checkpoint directory (created; must be empty)")
    ap.add_argument("--width", choices=WIDTHS, default="real")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-size", default="2GB", help="save_pretrained's shard size, e.g. 2GB or 1MB")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--device", default=None, help="where weights are drawn (default cuda when available)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        s = write_checkpoint(args.arch, args.layers, args.out, args.width, args.seed, args.max_shard_size,
                             getattr(torch, args.dtype), args.device)
    except (ValueError, TypeError) as e:
        print(f"error: {str(e).replace('out ', '--out ', 1) if str(e).startswith('out ') else e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in s.items() if k != "config"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
