"""The bench's shapes as data: the published MoE configurations the bench and the sweep time, and the decode
GEMVs of their layers. The one table that the bench, the sweep and the report read.

Shape legend: E = experts, N = out features, K = in features, H = hidden, I = one expert's intermediate
width, D = head dim. A decode GEMV is y [1, N] = x [1, K] @ W[N, K].T; an expert is gate_up [2I, H]
(gate rows first) and down [H, I].

Published configurations (the citations are what the numbers were read from):
  Mixtral-8x7B: transformers 5.23 `MixtralConfig` defaults (checkpoint mistralai/Mixtral-8x7B-v0.1):
    hidden 4096, intermediate 14336, 8 local experts, top-2, 32 heads, 8 kv heads; head_dim None -> 4096/32.
  OLMoE-1B-7B: `OlmoeConfig` defaults give hidden 2048, 64 experts, top-8, 16 heads, 16 kv heads, but
    intermediate 2048; the released checkpoint's config.json sets intermediate_size 1024
    (https://huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json), which the recorded H200 peer
    shapes 2048x2048 (gate_up) and 2048x1024 (down) confirm (data/receipts/anchors/decode_h200_2026-12-02.json).
  Qwen3-30B-A3B: `Qwen3MoeConfig` defaults (checkpoint Qwen/Qwen3-30B-A3B-Base): hidden 2048, moe
    intermediate 768, 128 experts, top-8, 32 heads, 4 kv heads; head_dim 128 is set explicitly in the
    checkpoint's config.json (not hidden/heads = 64), as Megatron recipes state with --kv-channels 128
    (zyzshishui/slime scripts/models/qwen3-30B-A3B.sh), hence q 4096x2048 and o 2048x4096.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEModel:
    """One MoE decoder layer's sizes."""
    name: str
    hidden: int            # H
    intermediate: int      # I, one expert's
    n_experts: int         # E
    top_k: int
    n_heads: int
    n_kv_heads: int
    head_dim: int          # D
    source: str


MODELS = {
    "mixtral": MoEModel("mixtral", 4096, 14336, 8, 2, 32, 8, 128, "Mixtral-8x7B (MixtralConfig defaults)"),
    "olmoe": MoEModel("olmoe", 2048, 1024, 64, 8, 16, 16, 128, "OLMoE-1B-7B-0924 (config.json)"),
    "qwen3": MoEModel("qwen3", 2048, 768, 128, 8, 32, 4, 128, "Qwen3-30B-A3B (Qwen3MoeConfig + head_dim 128)"),
}


@dataclass(frozen=True)
class Shape:
    """One batch-1 GEMV: y [1, N] = x [1, K] @ W[N, K].T."""
    model: str
    layer: str
    N: int
    K: int


def decode_shapes(m: MoEModel) -> list[Shape]:
    """Every distinct decode GEMV of one layer of `m`; projections of equal shape share one row ("q/o")."""
    H, I, D = m.hidden, m.intermediate, m.head_dim
    named = [("q", m.n_heads * D, H), ("k/v", m.n_kv_heads * D, H), ("o", H, m.n_heads * D),
             ("gate_up", 2 * I, H), ("down", H, I)]
    merged: dict[tuple[int, int], list[str]] = {}
    for name, n, k in named:
        merged.setdefault((n, k), []).append(name)
    return [Shape(m.name, "/".join(names), n, k) for (n, k), names in merged.items()]


# Shapes the recorded peers and the targets name that are not a fused decode projection: Mixtral's gate or
# up alone (llama.cpp runs them separately) and 28672x8192 (132 MB of int4: no cache can hold it).
EXTRA_SHAPES = [Shape("mixtral", "gate|up", 14336, 4096), Shape("large", "28672x8192", 28672, 8192)]
QUICK_SHAPES = [Shape("mixtral", "gate|up", 14336, 4096), Shape("qwen3", "down", 2048, 768)]
# The shapes the speed targets name first: a run cut short by its time budget still has them.
TARGET_SHAPES = ((14336, 4096), (4096, 14336), (28672, 8192))


def all_shapes(quick: bool = False) -> list[Shape]:
    """Every decode GEMV of the published models plus the extras (or the two quick shapes)."""
    if quick:
        return list(QUICK_SHAPES)
    return [s for m in MODELS.values() for s in decode_shapes(m)] + EXTRA_SHAPES


def by_priority(shapes: list[Shape]) -> list[Shape]:
    """`shapes` with the target shapes first (in TARGET_SHAPES order), the rest in their given order."""
    first = sorted((s for s in shapes if (s.N, s.K) in TARGET_SHAPES), key=lambda s: TARGET_SHAPES.index((s.N, s.K)))
    return first + [s for s in shapes if (s.N, s.K) not in TARGET_SHAPES]
