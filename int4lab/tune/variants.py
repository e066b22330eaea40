"""Kernel variants for the probes: a kernel module's source rewritten by exact text substitutions and loaded
as a module of its own, so a probe times the tree's kernel and its variants side by side in one process.

    src = variants.sub(Path("int4lab/kernels/grouped_mma.py").read_text(), old, new)   # old must match once
    kern = variants.load(src, "gmma_mine").grouped_mma_kernel

The loaded module lives in a temporary directory but is named int4lab.kernels._<name>, so its relative imports
(`from .epilogue import ...`) resolve to the tree's modules. Used by scripts/probe_v24_cuts.py, probe_unpack.py and
scripts/probe_tma.py; the library itself never loads a variant.
"""
from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path


def sub(src: str, old: str, new: str) -> str:
    """src with `old` replaced by `new`; AssertionError unless `old` occurs exactly once (a variant built on a
    changed kernel must fail loudly, not time the tree twice)."""
    assert src.count(old) == 1, (old, src.count(old))
    return src.replace(old, new)


def load(src: str, name: str):
    """The module made of `src`, named int4lab.kernels._<name>."""
    d = Path(tempfile.mkdtemp())
    (d / f"{name}.py").write_text(src)
    spec = importlib.util.spec_from_file_location(f"int4lab.kernels._{name}", d / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compiled(kern) -> list[dict]:
    """What the run-time compiler made of each specialisation of a launched kernel (a wrapper's `.kern` is
    followed): registers, spills, shared bytes, warps, stages. Never raises: a probe keeps its timings."""
    import torch
    kern = getattr(kern, "kern", kern)
    out = []
    try:
        for key, c in kern.device_caches[torch.cuda.current_device()][0].items():
            c._init_handles()
            out.append({"regs": c.n_regs, "spills": c.n_spills, "shared": c.metadata.shared,
                        "num_warps": c.metadata.num_warps, "num_stages": c.metadata.num_stages,
                        "key": str(key)[:300]})
    except Exception as e:
        out.append({"error": repr(e)})
    return out


def grouped_case():
    """The probes' interpreter case for a grouped kernel: awkward on purpose (N = 80 not a multiple of 32 or 64,
    K = 384 = 3 steps of 128, 11 rows, expert 1 with no rows). Returns E, packed [E, N, K/2] uint8, scales
    [E, N, K/32] fp16, xq [L, K] int8, xs [L, K/32] float32, ids [L] int32; seed it before calling."""
    import torch
    E, N, K, L = 4, 80, 384, 11
    packed = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8)
    scales = (torch.rand(E, N, K // 32) * 0.01 + 0.001).half()
    xq = torch.randint(-127, 128, (L, K), dtype=torch.int8)
    xs = torch.rand(L, K // 32) * 0.02
    ids = torch.tensor([0, 2, 2, 0, 3, 2, 2, 2, 0, 2, 2], dtype=torch.int32)
    return E, packed, scales, xq, xs, ids
