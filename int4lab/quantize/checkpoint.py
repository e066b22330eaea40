"""Save / load a quantised model: packed bytes + fp16 scales + the high-precision rest in one safetensors
file, with a format version, the architecture, the scheme and the config in its metadata."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .driver import quantize_model
from .layout import Scheme, model_arch

FORMAT_VERSION = 1


def save_quantized(model, path) -> None:
    """Write model's state (packed uint8, fp16 scales, everything else as is) to a safetensors file.

    Metadata: format_version, arch, scheme (JSON of `Scheme`), config (JSON). Tensors are written from
    where they are (CPU tensors without a copy; GPU tensors through one host copy each); only a tensor
    sharing storage with one already taken (tied weights) is cloned, so the file loads without
    shared-memory surprises and a real-width model is never held twice on the host.
    """
    from safetensors.torch import save_file
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
            "scheme": json.dumps(asdict(sch)), "config": model.config.to_json_string()}
    save_file(state, str(path), metadata=meta)


def read_metadata(path) -> dict:
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_quantized(path, base_model):
    """Load a file written by `save_quantized` into base_model (an unquantised model of the same config).

    Refuses (ValueError) a file of another format_version or architecture, or whose tensor names or shapes
    differ from what the recorded scheme makes of base_model. Returns (model, Scheme).
    """
    from safetensors.torch import load_file
    if not Path(path).is_file():
        raise FileNotFoundError(f"quantised checkpoint {path} does not exist")
    meta = read_metadata(path)
    ver = meta.get("format_version")
    if ver != str(FORMAT_VERSION):
        raise ValueError(f"{path}: format_version {ver!r} is not supported (this int4lab reads {FORMAT_VERSION})")
    arch = model_arch(base_model)
    if meta.get("arch") != arch:
        raise ValueError(f"{path}: holds a {meta.get('arch')!r} model, base_model is {arch!r}")
    sch = Scheme(**json.loads(meta["scheme"]))
    # Build the quantised module structure (round-to-nearest placeholders of the right shapes), then overwrite.
    model, _ = quantize_model(base_model, "rtn", sch.targets, sch.act, lm_head=sch.lm_head, progress=False)
    model.int4_scheme = sch
    state = load_file(str(path), device="cpu")
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise ValueError(f"{path}: tensor names do not match the scheme {sch.name}: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(want[k].shape) or v.dtype != want[k].dtype:
            raise ValueError(f"{path}: tensor {k} has shape {tuple(v.shape)} {v.dtype}, the model expects "
                             f"{tuple(want[k].shape)} {want[k].dtype}")
    model.load_state_dict(state, strict=True)
    return model, sch
