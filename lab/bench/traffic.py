"""Bytes one call must move: the numerator of GBps and the byte count the read floor is measured over.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = one
expert's intermediate width; an expert is gate_up [2I, H] + down [H, I].

Weight-side bytes per weight element, for each implementation's storage:
  int4_b32:      4-bit code + fp16 scale per 32             = 0.5 + 2/32
  tinygemm:      4-bit code + bf16 (scale, zero) per 32     = 0.5 + 4/32
  gemlite:       4-bit code + bf16 scale + bf16 zero per 32 = 0.5 + 4/32
  w4a16_cutlass: 4-bit code + one scale per output channel  (added per row below)
  marlin:        4-bit code + fp16 scale per 128            = 0.5 + 2/128
  bf16:          2
Activations (x in, y out) are bf16. Our intermediates (int8 activations, split-K partials) are NOT
counted: they are overhead, not necessity.
"""
from __future__ import annotations

from int4lab.shapes import MoEModel
from lab.bench.schema import GEMV_IMPLS, MOE_IMPLS, OURS_MOE


def gemv_bytes(impl: str, N: int, K: int, R: int = 1, scale_itemsize: int = 2) -> int:
    """Bytes one [R, K] x [N, K]^T call must read and write: weights + scales + x (bf16) + y (bf16).

    `scale_itemsize` is the per-channel scale's size for w4a16_cutlass (`weight_quantize` returns the scale in
    the weight's dtype: bf16 here).
    """
    act = 2 * R * K + 2 * R * N
    if impl == "bf16":
        return 2 * N * K + act
    if impl == "int4_b32":
        return N * K // 2 + 2 * (N * K // 32) + act
    if impl in ("tinygemm", "gemlite"):
        return N * K // 2 + 4 * (N * K // 32) + act
    if impl == "marlin":
        return N * K // 2 + 2 * (N * K // 128) + act
    if impl == "w4a16_cutlass":
        return N * K // 2 + scale_itemsize * N + act
    raise ValueError(f"impl must be one of {GEMV_IMPLS} for gemv_bytes, got {impl!r}")


def expert_bytes(impl: str, m: MoEModel) -> int:
    """Weight-side bytes of one expert (gate_up [2I, H] + down [H, I]) in `impl`'s storage."""
    n_weights = 3 * m.intermediate * m.hidden
    if impl in OURS_MOE:
        return n_weights // 2 + 2 * (n_weights // 32)
    if impl in ("bf16_loop", "grouped_mm"):
        return 2 * n_weights
    raise ValueError(f"impl must be one of {MOE_IMPLS} for expert_bytes, got {impl!r}")


def moe_bytes(impl: str, m: MoEModel, rows: int, n_active: int) -> int:
    """Bytes one MoE layer call must move: the `n_active` routed experts' weights + x [R, H] and y [R, H] in bf16.

    The router's ids/weights (a few bytes) and the [R*top_k, 2I] intermediate are not counted.
    """
    if not 1 <= n_active <= m.n_experts:
        raise ValueError(f"n_active must be in [1, {m.n_experts}] for {m.name}, got {n_active}")
    return n_active * expert_bytes(impl, m) + 2 * 2 * rows * m.hidden


def gemv_floor_bytes(N: int, K: int) -> int:
    """The bytes a GEMV row's read floor reads: int4-b32's (the format every row is judged in)."""
    return gemv_bytes("int4_b32", N, K)


def moe_floor_bytes(m: MoEModel, rows: int, n_active: int) -> int:
    """The bytes a MoE row's read floor reads: the unique routed experts in int4-b32, plus x and y."""
    return moe_bytes("int4_b32_moe", m, rows, n_active)
