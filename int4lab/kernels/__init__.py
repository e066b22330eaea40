"""Triton kernels for int4-b32 decode; on a machine without CUDA they run in Triton's CPU interpreter.

Shape legend: E = experts, N = out features, K = in features, R = activation rows.

    quant_x_rows          x [R, K] -> int8 codes + float32 per-32 scales (bit-identical to the reference)
    gemv_int4_b32         routed W4A8 GEMV, exact int32 block dots on the tensor cores, optional split-K
    reduce_partials       the split-K reduce + bf16 cast, fixed summation order
    int4_linear           dense layer: act="int8" (W4A8) or act="bf16" (W4A16, weights decoded in registers)
    build_group_tiles     routing -> sorted order + M-tiles, on the device (capture-safe)
    gemm_int4_b32_grouped grouped W4A8 GEMM over those tiles (capture-safe)
    moe_decode_step / moe_decode_grouped   a whole MoE FFN step from these kernels
    w4a16_cutlass_gemv    engineer B's W4A16 GEMV on the CUTLASS-interleaved layout (loaded on first use)

Launch parameters come from `plan.py` (a table per GPU generation, no autotuning).
"""
from .gemv import gemv_int4_b32, int4_linear, reduce_partials
from .grouped import GroupTiles, build_group_tiles, gemm_int4_b32_grouped
from .moe import combine_rows, moe_decode_grouped, moe_decode_step
from .plan import GemvPlan, GroupedPlan, gemv_plan
from .quant import quant_x_rows, swiglu_quant_rows

__all__ = ["quant_x_rows", "swiglu_quant_rows", "gemv_int4_b32", "reduce_partials", "int4_linear",
           "GroupTiles", "build_group_tiles", "gemm_int4_b32_grouped", "combine_rows", "moe_decode_step",
           "moe_decode_grouped", "GemvPlan", "GroupedPlan", "gemv_plan", "w4a16_cutlass_gemv"]


def __getattr__(name):
    # B's launcher lives in its own file; importing it lazily keeps this package importable while that
    # file is being written, and an ImportError there surfaces at the first use, not hidden.
    if name == "w4a16_cutlass_gemv":
        from .w4a16_cutlass import w4a16_cutlass_gemv
        return w4a16_cutlass_gemv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
