"""Save / load a quantised model: packed bytes + fp16 scales + the high-precision rest in one safetensors
file, with a format version, the architecture, the scheme, the config, the model's shape (experts, top-k,
widths) and a sha256 per tensor in its metadata.

Format versions: 1 had no checksums and no stored shape (a flipped byte or a top-2 file in a top-8 model
loaded silently); 2 adds both. A version-1 file is refused with a message (re-save it).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

from .driver import check_unquantised, quantize_model
from .modules import restored_on_failure
from .layout import Scheme, model_arch

FORMAT_VERSION = 2
SHAPE_FIELDS = ("arch", "layers", "experts", "top_k", "hidden", "intermediate", "vocab")


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a CPU tensor's bytes (row-major, its own dtype)."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(b.numpy().data).hexdigest()


def model_shape(model) -> dict:
    """What a quantised file must agree with: architecture, decoder layers, experts, top-k, H, I, vocabulary."""
    from ..models import expert_shapes
    cfg = model.config
    ex = expert_shapes(cfg)
    return {"arch": model_arch(model), "layers": cfg.num_hidden_layers, "experts": ex["experts"],
            "top_k": ex["top_k"], "hidden": ex["hidden"], "intermediate": ex["intermediate"],
            "vocab": cfg.vocab_size}


def save_quantized(model, path) -> None:
    """Write model's state (packed uint8, fp16 scales, everything else as is) to a safetensors file.

    Metadata: format_version, arch, scheme (JSON of `Scheme`), config (JSON), shape (JSON of `model_shape`),
    sha256 (JSON {tensor: hex digest}). Tensors are written from where they are (CPU tensors without a copy;
    GPU tensors through one host copy each); only a tensor sharing storage with one already taken (tied
    weights) is cloned, so the file loads without shared-memory surprises and a real-width model is never
    held twice on the host. The file is written beside `path` and renamed onto it (never a partial file
    under the final name).
    """
    from safetensors.torch import save_file
    from ..files import atomic_path
    sch = getattr(model, "int4_scheme", None)
    if sch is None:
        raise ValueError("model is not quantised (no int4_scheme attribute): call quantize_model first")
    state, seen = {}, set()
    for k, v in model.state_dict().items():
        if v.device.type == "meta":
            raise ValueError(f"tensor {k} is on the meta device (offloaded by accelerate): quantise the model "
                             f"first (quantize_model puts offloaded layers on their execution device)")
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        state[k] = t
    meta = {"format_version": str(FORMAT_VERSION), "arch": model_arch(model),
            "scheme": json.dumps(asdict(sch)), "config": model.config.to_json_string(),
            "shape": json.dumps(model_shape(model)),
            "sha256": json.dumps({k: tensor_sha256(t) for k, t in state.items()})}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata=meta)


def read_metadata(path) -> dict:
    """The file's metadata; ValueError when it is not a readable safetensors file (truncated, corrupt)."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None


def _json_field(path, meta: dict, key: str):
    try:
        return json.loads(meta[key])
    except (KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: metadata field {key!r} is missing or not JSON ({e}): the file is corrupt") from None


# safetensors' dtype names (the header's "dtype" field) of the dtypes a quantised state holds
_ST_DTYPES = {torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
              torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
              torch.bool: "BOOL"}


def read_header(path) -> dict:
    """{tensor name: (shape tuple, safetensors dtype name)} from the file's header alone (no tensor is read);
    ValueError when it is not a readable safetensors file."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None


def load_quantized(path, base_model):
    """Load a file written by `save_quantized` into base_model (an unquantised model of the same config).

    Refuses (ValueError, naming what differs) a file that is not readable safetensors, of another
    format_version, whose architecture, layers, experts, top-k, widths or vocabulary differ from
    base_model's, whose tensor names, shapes or dtypes (read from the header, before any tensor) differ from
    what the recorded scheme makes of base_model, or a tensor whose bytes fail its sha256; and a base_model
    that is already quantised. A refused load leaves base_model as it was (its modules are put back).
    Returns (model, Scheme); the model is base_model, converted in place.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"quantised checkpoint {path} does not exist")
    check_unquantised("base_model", base_model)
    meta = read_metadata(path)
    ver = meta.get("format_version")
    if ver != str(FORMAT_VERSION):
        why = (": it predates the per-tensor sha256 and the stored model shape; re-save it with save_quantized"
               if ver == "1" else "")
        raise ValueError(f"{path}: format_version {ver!r} is not supported (this int4lab reads "
                         f"{FORMAT_VERSION}){why}")
    stored, ours = _json_field(path, meta, "shape"), model_shape(base_model)
    for k in SHAPE_FIELDS:
        if stored.get(k) != ours[k]:
            raise ValueError(f"{path}: holds a model with {k} = {stored.get(k)!r}, base_model has {k} = {ours[k]!r}")
    sums = _json_field(path, meta, "sha256")
    try:
        sch = Scheme(**_json_field(path, meta, "scheme"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: metadata field 'scheme' is not a scheme ({e}): the file is corrupt") from None
    header = read_header(path)
    if set(header) != set(sums):
        raise ValueError(f"{path}: the header's tensors differ from the metadata's sha256 list: unlisted "
                         f"{sorted(set(header) - set(sums))[:5]}, absent {sorted(set(sums) - set(header))[:5]}")
    # The quantised module structure (round-to-nearest placeholders of the right shapes) is built in place; a
    # refusal from here on puts every replaced module back.
    with restored_on_failure(base_model):
        model, _ = quantize_model(base_model, "rtn", sch.targets, sch.act, lm_head=sch.lm_head, progress=False)
        _load_checked(path, model, header, sums, sch)
    model.int4_scheme = sch
    return model, sch


def _load_checked(path, model, header: dict, sums: dict, sch: Scheme) -> None:
    """Names, shapes and dtypes from the header against model's state (before any tensor is read), then each
    tensor read and checked against its sha256, then loaded (strict)."""
    from safetensors import SafetensorError, safe_open
    want = model.state_dict()
    missing, extra = sorted(set(want) - set(header)), sorted(set(header) - set(want))
    if missing or extra:
        raise ValueError(f"{path}: tensor names do not match the scheme {sch.name}: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    for k, (shape, dt) in header.items():
        if shape != tuple(want[k].shape) or dt != _ST_DTYPES.get(want[k].dtype):
            raise ValueError(f"{path}: tensor {k} is declared {shape} {dt}, the model expects "
                             f"{tuple(want[k].shape)} {_ST_DTYPES.get(want[k].dtype)}")
    state = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            for k in header:
                v = f.get_tensor(k)
                got = tensor_sha256(v)
                if sums[k] != got:
                    raise ValueError(f"{path}: tensor {k} fails its sha256 check (stored {str(sums[k])[:16]}, "
                                     f"read {got[:16]}): the file is corrupt")
                state[k] = v
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from None
    model.load_state_dict(state, strict=True)
