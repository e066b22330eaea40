"""Triton kernels for int4-b32 decode; on a machine without CUDA they run in Triton's CPU interpreter.

Shape legend: E = experts, N = out features, K = in features, R = activation rows.

    quant_x_rows          x [R, K] -> int8 codes + float32 per-32 scales (bit-identical to the reference)
    gemv_int4_b32         routed W4A8 GEMV on int8 codes: exact int32 block dots with dp4a, split-K
                          finished in the same launch (gemv.py launches the gemv_dp4a.py kernel)
    int4_linear           dense layer, one launch: act="int8" (W4A8, x quantised inside the GEMV) or
                          act="bf16" (W4A16, weights decoded in registers: gemv_w4a16.py)
    reduce_partials       a split-K reduce as its own launch, fixed summation order (reduce.py)
    build_group_tiles     routing -> sorted order + tiles of rows per expert, one launch (capture-safe)
    gemm_int4_b32_grouped grouped W4A8 GEMV over those tiles, dp4a or tensor cores (capture-safe)
    moe_decode_step       a whole MoE FFN step: moe_decode_routed (2 launches, one token) or moe_decode_grouped
                          (each routed expert read once per tile of rows, a few tokens), chosen by token count
    w4a16_cutlass_gemv    W4A16 GEMV on the Paddle / TensorRT-LLM int4 layout (w4a16_cutlass.py)

Launch parameters come from `plan.py` (a table per GPU generation, no autotuning); shared epilogue pieces
(bf16 rounding, expert guard, the one-launch split-K finish) from `epilogue.py`.
"""
from .gemv import gemv_int4_b32, int4_linear
from .grouped import GroupTiles, build_group_tiles, gemm_int4_b32_grouped
from .moe import combine_rows, moe_decode_grouped, moe_decode_routed, moe_decode_step
from .plan import GemvPlan, GroupedPlan, gemv_plan
from .quant import quant_x_rows, swiglu_quant_rows
from .reduce import reduce_partials
from .w4a16_cutlass import w4a16_cutlass_gemv

__all__ = ["quant_x_rows", "swiglu_quant_rows", "gemv_int4_b32", "reduce_partials", "int4_linear",
           "GroupTiles", "build_group_tiles", "gemm_int4_b32_grouped", "combine_rows", "moe_decode_step",
           "moe_decode_grouped", "moe_decode_routed", "GemvPlan", "GroupedPlan", "gemv_plan", "w4a16_cutlass_gemv"]

