"""Loading what the gate compares: a tiny trained model by name, or a transformers checkpoint directory."""
from __future__ import annotations

from pathlib import Path

import torch

from ..quantize import LAYOUT


def load_model(model: str, dtype=torch.float32, device: str = "cpu", device_map: str | None = None):
    """(model, tokenizer, short name) for a tiny arch name (int4lab.models.ARCHS) or a checkpoint directory.

    FileNotFoundError for a path that does not exist; ValueError for an architecture int4lab cannot quantise.
    """
    from ..models import ARCHS
    if model in ARCHS:
        from ..models import load_tiny, load_tokenizer
        return load_tiny(model, dtype, device, experts_implementation="eager").eval(), load_tokenizer(), model
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {model!r} is neither a tiny model name {tuple(ARCHS)} nor an existing "
                                f"checkpoint directory")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    cfg = AutoConfig.from_pretrained(path)
    if cfg.model_type not in LAYOUT:
        raise ValueError(f"unsupported architecture {cfg.model_type!r} in {path}: int4lab handles {tuple(LAYOUT)}")
    kw = {"device_map": device_map} if device_map else {}
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    if not device_map:
        m = m.to(device)
    return m.eval(), AutoTokenizer.from_pretrained(path), path.name
