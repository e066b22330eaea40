"""Where the trained tiny models (data/models/<arch>/, bf16 safetensors) and their tokenizer live; loading."""
from __future__ import annotations

from pathlib import Path

import torch

from ..locations import DATA
from .configs import check_arch

MODELS_DIR = DATA / "models"
TOKENIZER_DIR = DATA / "tokenizer"


def model_dir(arch: str, root=None) -> Path:
    """data/models/<arch>/ (or <root>/<arch>/)."""
    check_arch(arch)
    return (Path(root) if root is not None else MODELS_DIR) / arch


def load_tiny(arch: str, dtype: torch.dtype = torch.float32, device="cpu", root=None,
              experts_implementation: str | None = None):
    """The trained model for `arch` in eval mode, weights cast from the stored bf16 to `dtype`.

    experts_implementation is passed to transformers ("eager", "grouped_mm", ...; None = its default).
    """
    from transformers import AutoModelForCausalLM

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    path = model_dir(arch, root)
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (config.json + model.safetensors): train one with "
                                f"`python -m lab.train --arch {arch} --out DIR` and load it with root=DIR "
                                f"(without --out it goes to runs/models/)")
    kwargs = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    return model.to(device).eval()
