"""int4lab: 4-bit weight formats for Mixture-of-Experts decoding, taught, proven and measured.

    import int4lab as il
    packed, scales = il.pack_int4_b32(w)          # w [N, K] or [E, N, K]

Without a CUDA device, importing int4lab turns on Triton's interpreter (TRITON_INTERPRET=1) before
any kernel is defined, so the same kernels run (slowly) on the CPU. Set TRITON_INTERPRET yourself to
override; it must be set before triton is first imported.
"""
import os as _os

if "TRITON_INTERPRET" not in _os.environ:
    import torch as _torch
    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"

from .format import (BLOCK, dequant_int4_ref, pack_codes, pack_int4_b32, quant_x_rows_ref,  # noqa: E402
                     unpack_codes)
from .cutlass_layout import weight_dequantize, weight_quantize  # noqa: E402  (Paddle / TRT-LLM int4 layout)
from .clip import rtn_clip_pack_int4_b32  # noqa: E402
from .gptq import HessianAccumulator, gptq_pack_int4_b32  # noqa: E402
from .kernels import (build_group_tiles, gemm_int4_b32_grouped, gemv_int4_b32, int4_linear,  # noqa: E402
                      moe_decode_grouped, moe_decode_step, quant_x_rows, reduce_partials)
from .quantize import Int4Experts, Int4Linear, load_quantized, quantize_model, save_quantized  # noqa: E402
from . import models  # noqa: E402,F401  (il.models.load_tiny, il.models.load_tokenizer; texts: int4lab.corpus)

__version__ = "0.1.0"
