"""Loading what the gate compares: a tiny trained model by name, or a transformers checkpoint directory."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..quantize import LAYOUT


_SIZE = re.compile(r"^\d+(\.\d+)?(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")


def parse_max_memory(items) -> dict | None:
    """accelerate's max_memory dict from ["0=20GiB", "cpu=100GiB", ...] (None or [] gives None).

    A key is a GPU index (0, 1, ...), "cpu" or "disk"; a size is a number with a unit (B, KB, MB, GB, TB,
    KiB, MiB, GiB, TiB). ValueError naming the malformed item otherwise, or for a key given twice.
    """
    if not items:
        return None
    if isinstance(items, str):
        items = items.split()
    out = {}
    for it in items:
        key, sep, size = str(it).partition("=")
        key, size = key.strip(), size.strip()
        if not sep or not key or not _SIZE.match(size):
            raise ValueError(f"max_memory item {it!r} must be DEVICE=SIZE, e.g. 0=20GiB or cpu=100GiB "
                             f"(DEVICE a GPU index, cpu or disk; SIZE a number with a unit B..TiB)")
        if key.isdigit():
            key = int(key)
        elif key not in ("cpu", "disk"):
            raise ValueError(f"max_memory item {it!r}: the device must be a GPU index, cpu or disk")
        if key in out:
            raise ValueError(f"max_memory names device {key!r} twice")
        out[key] = size
    return out


def check_max_memory(max_memory, device_map) -> None:
    """max_memory bounds accelerate's placement, so it needs a device_map (ValueError otherwise)."""
    if max_memory and not device_map:
        raise ValueError("max_memory needs device_map (e.g. --device-map auto): it bounds accelerate's placement")


def load_config(path, files: bool = False):
    """The transformers config of a checkpoint directory; ValueError naming --model when config.json is
    missing, not JSON, or of an architecture int4lab cannot quantise."""
    from transformers import AutoConfig
    path = Path(path)
    f = path / "config.json"
    if not f.is_file():
        raise ValueError(f"--model {str(path)!r} has no config.json: not a transformers checkpoint directory")
    try:
        json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--model {str(path)!r}: config.json is not valid JSON ({e})") from None
    try:
        cfg = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model {str(path)!r}: config.json is not a usable transformers config ({e})") from None
    if cfg.model_type not in LAYOUT:
        raise ValueError(f"unsupported architecture {cfg.model_type!r} in {path}: int4lab handles {tuple(LAYOUT)}")
    if files:                                  # a checkpoint directory: its weights and tokenizer too
        _check_files(path)
    return cfg


def _check_files(path: Path) -> None:
    """A checkpoint directory holds weights (every shard its index names) and a tokenizer: refused by name here,
    before any weight loads, rather than by transformers after the model did."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"--model {str(path)!r}: {index.name} is not a usable shard index ({e})") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ValueError(f"--model {str(path)!r}: weight shards named in {index.name} are missing: {missing[:5]}")
    elif not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ValueError(f"--model {str(path)!r} holds no weights (no *.safetensors or *.bin beside config.json)")
    from safetensors import SafetensorError, safe_open
    for f in sorted(path.glob("*.safetensors")):                   # headers only: a truncated file shows here
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except SafetensorError as e:
            raise ValueError(f"--model {str(path)!r}: a weight file is not readable safetensors (truncated or "
                             f"corrupt?): {f.name}: {e}") from None
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ValueError(f"--model {str(path)!r} holds no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")


def load_model(model: str, dtype=torch.float32, device: str = "cpu", device_map: str | None = None,
               max_memory: dict | None = None):
    """(model, tokenizer, short name) for a tiny arch name (int4lab.models.ARCHS) or a checkpoint directory.

    device_map (e.g. "auto") hands placement to accelerate, bounded per device by max_memory
    ({0: "20GiB", "cpu": "100GiB"}: what does not fit on the GPU stays on the host). FileNotFoundError for
    a path that does not exist; ValueError for a config.json that is missing, broken or of an architecture
    int4lab cannot quantise, a weight file that is not readable, or max_memory without device_map or with a
    tiny model name.
    """
    from ..models import ARCHS
    check_max_memory(max_memory, device_map)
    if max_memory and model in ARCHS:
        raise ValueError("max_memory applies to checkpoint directories, not the tiny models")
    if model in ARCHS:
        from ..models import load_tiny, load_tokenizer
        return load_tiny(model, dtype, device, experts_implementation="eager").eval(), load_tokenizer(), model
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {model!r} is neither a tiny model name {tuple(ARCHS)} nor an existing "
                                f"checkpoint directory")
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    load_config(path, files=True)
    kw = {"device_map": device_map} if device_map else {}
    if max_memory:
        kw["max_memory"] = max_memory
    try:
        m, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True, **kw)
    except SafetensorError as e:
        raise ValueError(f"--model {str(path)!r}: a weight file is not readable safetensors (truncated or "
                         f"corrupt?): {e}") from None
    except OSError as e:
        raise ValueError(f"--model {str(path)!r}: transformers cannot load its weights ({e})") from None
    except RuntimeError as e:                   # transformers' loading report: missing or misshapen tensors
        if "ignore_mismatched_sizes" not in str(e):
            raise
        raise ValueError(f"--model {str(path)!r}: the weights do not match config.json (a tensor missing or of "
                         "another shape than the config gives)") from None
    extra = sorted(info.get("unexpected_keys") or ())
    if extra:                                   # weights the config's model has no place for (layers beyond it?)
        raise ValueError(f"--model {str(path)!r}: the weights hold {len(extra)} tensor(s) the config's model does "
                         f"not have, e.g. {', '.join(extra[:5])}: weights and config.json disagree")
    if not device_map:
        m = m.to(device)
    return m.eval(), AutoTokenizer.from_pretrained(path), path.name
