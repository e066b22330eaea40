"""The bench's shapes as data: the published MoE configurations the bench and the sweep time, and the decode
GEMVs of their layers. The one table that the bench, the sweep and the report read.

Shape legend: E = experts, N = out features, K = in features, H = hidden, I = one expert's intermediate
width, D = head dim. A decode GEMV is y [1, N] = x [1, K] @ W[N, K].T; an expert is gate_up [2I, H]
(gate rows first) and down [H, I].

The sizes are the architecture records' published configurations (int4lab/archs: each record cites the
config.json or config class it was read from); the bench names them mixtral, olmoe and qwen3.
"""
from __future__ import annotations

from dataclasses import dataclass

from int4lab.archs import bench_models


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


def _bench_model(name: str, arch) -> MoEModel:
    z = arch.published_sizes()
    return MoEModel(name, z["hidden"], z["intermediate"], z["experts"], z["top_k"], z["heads"], z["kv_heads"],
                    z["head_dim"], arch.published.label)


MODELS = {name: _bench_model(name, a) for name, a in bench_models().items()}


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
