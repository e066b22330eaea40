"""Checks every launcher runs before a launch: device, contiguity, expert-id range (sync-free under capture).

What is checked where:
  * dtypes, ranks, shapes, K % 32, devices, contiguity: always (host metadata only, no device sync).
  * expert ids in [0, E): eagerly, by reading the ids back (one device sync on CUDA). While a CUDA graph
    is being captured a read-back is illegal, so the check is skipped; the kernels then guard on the
    device instead: a row whose id is outside [0, E) reads no expert memory and comes out as NaN.
"""
from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_devices(**tensors) -> torch.device:
    """All tensors on one device; a CUDA device unless Triton runs in its CPU interpreter."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    dev = items[0][1].device
    for name, t in items[1:]:
        if t.device != dev:
            raise ValueError(f"{name} must be on the same device as {items[0][0]} ({dev}), got {t.device}")
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"{items[0][0]} must be on a CUDA device (or set TRITON_INTERPRET=1), got {dev}")
    if dev.type == "cuda" and interpreting():
        raise ValueError(f"{items[0][0]} is on {dev} but TRITON_INTERPRET=1 runs kernels on the CPU")
    return dev


def check_contiguous(**tensors) -> None:
    for name, t in tensors.items():
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def check_rows_contiguous(name: str, t: torch.Tensor) -> None:
    """The last dim must be dense; rows may be strided (a stride-0 expand of one token is allowed)."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def check_ids(name: str, ids: torch.Tensor, E: int) -> None:
    """ids integer, all in [0, E); the value check is skipped during CUDA-graph capture (module doc)."""
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must have dtype int32 or int64, got {str(ids.dtype).replace('torch.', '')}")
    if capturing() or ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= E:
        raise ValueError(f"{name} must lie in [0, E) = [0, {E}), got values in [{lo}, {hi}]")


def check_out(name: str, out, shape, dtype, device) -> torch.Tensor:
    """Allocate when None, else check a caller's preallocated buffer (needed under capture)."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {str(dtype).replace('torch.', '')}, "
                        f"got {str(out.dtype).replace('torch.', '')}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.device != torch.device(device):
        raise ValueError(f"{name} must be on {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return out
