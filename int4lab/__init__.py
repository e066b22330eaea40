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

import importlib as _importlib  # noqa: E402

# Names resolved on first use (PEP 562): `import int4lab.kernels` loads the kernels and what they import, not the
# quantiser, the gate or transformers, so a process imports (and a receipt's code hash covers) only what it uses.
_EXPORTS = {
    ".format": ("BLOCK", "dequant_int4_ref", "pack_codes", "pack_int4_b32", "quant_x_rows_ref", "unpack_codes"),
    ".cutlass_layout": ("weight_dequantize", "weight_quantize"),          # the Paddle / TRT-LLM int4 layout
    ".clip": ("rtn_clip_pack_int4_b32",),
    ".gptq": ("HessianAccumulator", "gptq_pack_int4_b32"),
    ".kernels": ("build_group_tiles", "gemm_int4_b32_grouped", "gemv_int4_b32", "int4_linear", "moe_decode_grouped",
                 "moe_decode_step", "quant_x_rows", "reduce_partials"),
    ".quantize": ("Int4Experts", "Int4Linear", "load_quantized", "quantize_model", "save_quantized"),
}
_HOME = {name: mod for mod, names in _EXPORTS.items() for name in names}
_SUBMODULES = ("models", "kernels", "quantize", "gate", "format", "gptq", "clip", "q4_0", "cutlass_layout",
               "cutlass_converter", "export", "corpus", "files", "archs")
__all__ = sorted(_HOME) + list(_SUBMODULES)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _HOME:
        value = getattr(_importlib.import_module(_HOME[name], __name__), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module("." + name, __name__)
    else:
        raise AttributeError(f"module 'int4lab' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
