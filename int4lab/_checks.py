"""Argument checks shared by every public function: fail early, name the argument and the rule.

One home for every check: tensors (dtype, rank, shape, K % 32), int4-b32 packs, and what the kernel
launchers check before a launch (device, contiguity, expert-id range, preallocated outputs).

What is checked where in the launchers:
  * dtypes, ranks, shapes, K % 32, devices, contiguity: always (host metadata only, no device sync).
  * expert ids in [0, E): eagerly, by reading the ids back (one device sync on CUDA). While a CUDA graph
    is being captured a read-back is illegal, so the check is skipped; the kernels then guard on the
    device instead: a row whose id is outside [0, E) reads no expert memory and comes out as NaN. The
    quantised modules' hot path (kernels/ops.py) skips it too (`ids_unread`): a sync per MoE call would
    stall eager decoding, and the guard gives the same NaN rows.
  * activations small enough for float32 sums: in `int4_linear` only (`kernels/gemv.check_x_range`), eagerly,
    by reading back a reduction of x and one of the scales (two device syncs on CUDA); skipped under capture and
    inside `ids_unread()`, and the dense hot path (kernels/ops.py) does not call it.
"""
from __future__ import annotations

import contextlib
import os

import torch

BLOCK = 32          # int4-b32's scale block along K (format.py re-exports it)

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


def check_positive_int(name: str, v, why: str = "") -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be a positive int{why}, got {v!r}")


def check_module(name: str, model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} must be a transformers MoE model (a torch.nn.Module), got {type(model).__name__}")


def check_finite(name: str, t: torch.Tensor) -> None:
    if t.is_meta:
        raise ValueError(f"{name} must hold data: it is on the meta device (shapes only), got device meta")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf)")


def check_shape(name: str, t: torch.Tensor, shape) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def check_dims(N, K) -> None:
    """N a positive int, K a positive int multiple of 32."""
    if not isinstance(N, int) or isinstance(N, bool) or N <= 0:
        raise ValueError(f"N must be a positive int, got {N!r}")
    if not isinstance(K, int) or isinstance(K, bool):
        raise ValueError(f"K must be a positive int multiple of {BLOCK}, got {K!r}")
    check_k("K", K, BLOCK)


def check_packed(packed, scales, N: int, K: int, *, names=("packed", "scales")) -> None:
    """Shape/dtype contract of an int4-b32 pack: uint8 [..., N, K/2] with float16 [..., N, K/32]."""
    pn, sn = names
    check_tensor(pn, packed, (torch.uint8,), (2, 3))
    check_tensor(sn, scales, (torch.float16,), (2, 3))
    check_dims(N, K)
    if tuple(packed.shape[-2:]) != (N, K // 2):
        raise ValueError(f"{pn} must have trailing shape (N, K/2) = ({N}, {K // 2}), got {tuple(packed.shape)}")
    if tuple(scales.shape[-2:]) != (N, K // BLOCK):
        raise ValueError(f"{sn} must have trailing shape (N, K/32) = ({N}, {K // BLOCK}), got {tuple(scales.shape)}")
    if packed.shape[:-2] != scales.shape[:-2]:
        raise ValueError(f"{pn} and {sn} must have the same leading (expert) dims, "
                         f"got {tuple(packed.shape[:-2])} and {tuple(scales.shape[:-2])}")


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


_ID_VALUES = [True]     # False inside `ids_unread()`


@contextlib.contextmanager
def ids_unread():
    """Inside this block check_ids checks the dtype only: the callers that validate once per argument signature
    (kernels/ops.py, the modules' hot path) never read ids back, as under capture (module doc)."""
    _ID_VALUES.append(False)
    try:
        yield
    finally:
        _ID_VALUES.pop()


def check_ids(name: str, ids: torch.Tensor, E: int) -> None:
    """ids integer, all in [0, E); the value check is skipped during CUDA-graph capture and inside
    `ids_unread()` (module doc)."""
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must have dtype int32 or int64, got {str(ids.dtype).replace('torch.', '')}")
    if not _ID_VALUES[-1] or capturing() or ids.numel() == 0:
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


def check_rows_and_weight(x, weight, shape_rule: str) -> None:
    """x float [R, K] with a dense last dimension; weight (its type and rank checked by the caller) of x's
    dtype, contiguous, its last dimension K (shape_rule names the expected shape in the message, e.g.
    "(E, H)"); both on one device."""
    check_tensor("x", x, FLOAT_DTYPES, (2,))
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    if weight.shape[-1] != x.shape[1]:
        raise ValueError(f"weight must have shape {shape_rule} with its last dimension {x.shape[1]} (x's), got "
                         f"{tuple(weight.shape)}")
    if x.shape[1] and x.stride(1) != 1:
        raise ValueError(f"x must have a contiguous last dimension, got strides {x.stride()}")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    check_devices(x=x, weight=weight)
