"""When the int4 modules take the prefill path, and its forwards (the numerics: int4lab/kernels/prefill.py).

Shape legend: R = rows (tokens), H = hidden size, E = experts, k = experts per token.

A module whose kernels are on (CUDA tensors, or `kernels_on_cpu`) sends a call through the prefill path
when every weight it decodes serves, on average, at least `prefill_min_rows` rows: R for an Int4Linear,
R * k / E for an Int4Experts (the mean routed rows per expert). The module attribute defaults to
PREFILL_MIN_ROWS; `prefill_rows(model, n)` changes it for a block (0: always, None: never).

Off by default in the modules (PREFILL_MIN_ROWS = None): a decode step or a GPTQ calibration forward runs the
decode kernels. The gate turns it on for scoring its arms (`int4lab.gate.score.SCORE_PREFILL_ROWS`, 512: the rows
sweep's suggestion on an H100, `--prefill-rows` to change it). A paired run of `python -m lab.bench.prefill` (the
prefill path, the decode path and bf16 in alternating rounds of one process) measures it against bf16's tokens/s,
the 0.8x it is held to; `with prefill_rows(model, 512):` turns the path on for any other block.

Why a count of rows per weight: the prefill path pays ~4.6 bytes of memory traffic per weight per call
(decode 0.5625 read + 2 written, the GEMM's 2 read back) where a decode kernel reads 0.5625 once; the
tensor cores pay that back through the rows each decoded weight serves, so the break-even is a count of
rows per weight, the same for a dense layer and for one expert. Decode steps have 1-16 tokens: at most 16
rows per dense weight, and for experts 16 * k / E rows (2 for OLMoE's 8 of 64), below 64; a scoring batch
of 16 x 256 tokens has 4096 rows per dense weight and 512 per OLMoE expert (256 per Qwen3 expert, 128 of 8).
Where between those the crossover lies is measured: `python -m lab.bench.prefill --sweep` times both paths per
row count on the GPU, and its receipt's suggestion (512 on an H100) is the threshold the gate uses.
"""
from __future__ import annotations

import contextlib

import torch

PREFILL_MIN_ROWS = None        # off by default in the modules (module doc); the gate's scoring uses 512


def prefill_linear(mod, x: torch.Tensor) -> torch.Tensor:
    """Int4Linear.forward through `prefill_matmul`: [..., K] -> [..., N] in x's dtype, + bias as the module adds it."""
    from ..kernels.prefill import prefill_matmul
    x2 = x.reshape(-1, mod.in_features)
    y = prefill_matmul(x2, mod.packed, mod.scales, mod.act).to(x.dtype)
    if mod.bias is not None:
        y = y + mod.bias
    return y.reshape(*x.shape[:-1], mod.out_features)


def prefill_experts(mod, hidden_states, top_k_index, top_k_weights, grouped: bool | None = None):
    """Int4Experts.forward through `prefill_moe`: hidden [R, H], top_k_index [R, k], top_k_weights [R, k]
    -> [R, H] in hidden's dtype (the block's bf16 output). SwiGLU fused when the module's act_fn computes
    SiLU (`mod.swiglu`), else act_fn(gate) * up in float32."""
    from ..kernels.prefill import prefill_moe
    y = prefill_moe(hidden_states, top_k_index, top_k_weights, mod.gate_up_packed, mod.gate_up_scales,
                    mod.down_packed, mod.down_scales, mod.act, None if mod.swiglu else mod.act_fn, grouped)
    # an id outside [0, E) makes its token's row NaN, as the decode kernels' guard does (no read-back)
    bad = ((top_k_index < 0) | (top_k_index >= mod.num_experts)).any(-1, keepdim=True)
    return torch.where(bad, torch.nan, y).to(hidden_states.dtype)


@contextlib.contextmanager
def prefill_rows(model: torch.nn.Module, min_rows: int):
    """Inside this block the int4 modules of `model` take the prefill path from `min_rows` rows per weight
    (module doc); their previous setting is restored on exit."""
    from .modules import _Int4Module
    if min_rows is not None and (not isinstance(min_rows, int) or isinstance(min_rows, bool) or min_rows < 0):
        raise ValueError(f"min_rows must be a non-negative int or None (never), got {min_rows!r}")
    mods = [m for m in model.modules() if isinstance(m, _Int4Module)]
    missing = object()
    old = [m.__dict__.get("prefill_min_rows", missing) for m in mods]
    for m in mods:
        m.prefill_min_rows = min_rows
    try:
        yield model
    finally:
        for m, o in zip(mods, old):
            if o is missing:
                del m.prefill_min_rows          # back to the class default
            else:
                m.prefill_min_rows = o
