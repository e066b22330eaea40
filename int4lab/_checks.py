"""Argument checks shared by every public function: fail early, name the argument and the rule."""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(name: str, t, dtypes=None, ndims=None) -> None:
    """Raise TypeError/ValueError unless `t` is a tensor with one of `dtypes` and one of `ndims` ranks."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_names(dtypes)}), got {str(t.dtype).replace('torch.', '')}")
    if ndims is not None and t.dim() not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name} must have rank {want}, got shape {tuple(t.shape)}")


def check_k(name: str, k: int, block: int = 32) -> None:
    if k <= 0 or k % block:
        raise ValueError(f"{name} must be a positive multiple of {block}, got {k}")


def check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf)")


def check_shape(name: str, t: torch.Tensor, shape) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
