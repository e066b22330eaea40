"""Marlin (IST-DASLab, W4A16: fp16 activations, 4-bit weights, fp16 scale per 128 inputs) as a GEMV peer.

Marlin's source is not part of this repository. Where it has been fetched and built outside it, two paths
say where: `INT4LAB_MARLIN_LIB`, a shared library exporting

    int int4lab_marlin_mul(A, B, C, s, m, n, k, workspace, groupsize, dev, stream, thread_k, thread_n, sms, max_par)

(a C entry point over Marlin's `marlin_cuda`, same arguments, returning its error code or the launch's CUDA
error), and `INT4LAB_PEERS_DIR` (default `.peers/` at the repository root), whose `marlin/__init__.py` is
Marlin's own Python module: its `Layer.pack` lays the weights out (the torch extension that module imports is
not needed for packing and is stood in for while it loads). Without either, the peer is skipped with the reason.

The weights are our random bf16 weights quantised symmetrically per 128 inputs (scale = max|w| / 7, codes in
-8..7, as Marlin stores code + 8); the reference is fp32 x (rounded to fp16, what Marlin reads) times those
dequantised weights.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import types
from functools import lru_cache
from pathlib import Path

import torch

from int4lab.paths import ROOT

GROUP = 128
MAX_PAR = 16          # Marlin's default: the lock workspace holds n / 128 * MAX_PAR ints


class MarlinMissing(Exception):
    """Marlin's library or packer is not available here; the message says which and where it was looked for."""


def peers_dir() -> Path:
    return Path(os.environ.get("INT4LAB_PEERS_DIR") or ROOT / ".peers")


@lru_cache(maxsize=1)
def library():
    """The built Marlin entry point (ctypes function), or MarlinMissing."""
    path = os.environ.get("INT4LAB_MARLIN_LIB", "")
    if not path or not Path(path).is_file():
        raise MarlinMissing(f"Marlin's shared library not found (INT4LAB_MARLIN_LIB={path!r}); it is built outside "
                            "the repository from Marlin's source")
    fn = ctypes.CDLL(path).int4lab_marlin_mul
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, p, p, p, i, i, i, p, i, i, p, i, i, i, i]
    fn.restype = i
    return fn


@lru_cache(maxsize=1)
def packer():
    """Marlin's own `Layer` class (its weight layout), loaded from the fetched source, or MarlinMissing."""
    src = peers_dir() / "marlin" / "__init__.py"
    if not src.is_file():
        raise MarlinMissing(f"Marlin's Python module not found at {src}")
    stub = "marlin_cuda" not in sys.modules
    if stub:   # the module imports its torch extension at the top; packing never calls it
        sys.modules["marlin_cuda"] = types.ModuleType("marlin_cuda")
    try:
        spec = importlib.util.spec_from_file_location("marlin_fetched", src)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if stub:
            del sys.modules["marlin_cuda"]
    return mod.Layer


def quantise_g128(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (codes int8 [N, K] in -8..7, scales fp16 [N, K / 128]): symmetric, scale = max|w| / 7 per
    128 inputs (a zero block gets scale 1). W ~ codes * scales repeated over each group."""
    N, K = W.shape
    if K % GROUP:
        raise ValueError(f"K must be a multiple of {GROUP} for Marlin's groups, got {K}")
    g = W.float().reshape(N, K // GROUP, GROUP)
    s = (g.abs().amax(-1) / 7).to(torch.float16)
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.round(g / s.float().unsqueeze(-1)).clamp(-8, 7).to(torch.int8)
    return q.reshape(N, K), s


def dequant_g128(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] = codes * their group's scale (exact in fp32)."""
    N, K = q.shape
    return (q.float().reshape(N, K // GROUP, GROUP) * s.float().unsqueeze(-1)).reshape(N, K)


def pack(W: torch.Tensor):
    """(B int32 [K/16, 2N], s fp16 [K/128, N]) in Marlin's layout on W's device, and the fp32 dequantised weights
    [N, K] they hold. Marlin's `Layer.pack` rounds w / s again: w = codes * s in fp16 gives the codes back."""
    N, K = W.shape
    if N % 256 or K % 128:
        raise MarlinMissing(f"Marlin needs N % 256 == 0 and K % 128 == 0, got {N}x{K}")
    q, s = quantise_g128(W)
    wq = dequant_g128(q, s)
    layer = packer()(K, N, groupsize=GROUP)
    lin = torch.nn.Linear(K, N, bias=False, device=W.device, dtype=torch.float16)
    lin.weight.data = wq.to(torch.float16)
    layer.pack(lin, s.to(W.device))                    # its scales argument is [N, K / 128]: ours as they are
    return layer.B.to(W.device), layer.s.to(W.device), wq


def mul_call(x16: torch.Tensor, B: torch.Tensor, s: torch.Tensor, N: int):
    """A zero-argument callable: y fp16 [1, N] = x16 [1, K] @ W.T through Marlin, on the current stream (so a
    CUDA graph captures it); a nonzero return of Marlin's entry point raises RuntimeError."""
    fn = library()
    K = x16.shape[-1]
    y = torch.empty(1, N, dtype=torch.float16, device=x16.device)
    workspace = torch.zeros(N // 128 * MAX_PAR, dtype=torch.int32, device=x16.device)
    dev = x16.device.index if x16.device.index is not None else torch.cuda.current_device()

    def call():
        err = fn(x16.data_ptr(), B.data_ptr(), y.data_ptr(), s.data_ptr(), 1, N, K, workspace.data_ptr(), GROUP,
                 dev, torch.cuda.current_stream().cuda_stream, -1, -1, -1, MAX_PAR)
        if err:
            raise RuntimeError(f"Marlin returned {err} on {N}x{K} (1: shape, 2: no kernel for it, else a CUDA error)")
        return y
    return call
