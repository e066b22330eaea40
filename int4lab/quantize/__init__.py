"""Quantise a transformers-5 MoE model onto int4-b32.

    layout.py      where each architecture keeps its pieces (read from its int4lab.archs record), `Scheme`
    modules.py     `Int4Linear`, `Int4Experts` (CPU reference decode or the Triton kernels)
    hessian.py     the one Hessian hook (GPTQ here, chapter 02 through `lab.chapters.calib`)
    driver.py      `quantize_model`: round-to-nearest, dithered round-to-nearest, sequential GPTQ
    dither.py      the lottery's dither: counter-based noise on the weights' device, the same bytes everywhere
    fused.py       `fuse_decode`: one-launch RMSNorm and router, q/k/v as one GEMV (a runtime form)
    fused_attention.py  `FusedAttention`: a static-cache decode step's attention in one launch (fuse_decode's)
    fused_layer.py `FusedDecoderLayer`: the residual add after attention and the next RMSNorm in one launch
    checkpoint.py  `save_quantized` / `load_quantized` (versioned safetensors)
"""
from .checkpoint import FORMAT_VERSION, load_quantized, read_metadata, save_quantized
from .driver import QuantReport, capture_layer0_inputs, dithered_pack, quantize_model
from .fused import FusedRMSNorm, FusedRouter, fuse_decode
from .fused_attention import FusedAttention
from .fused_layer import FusedDecoderLayer
from .hessian import hessian_hooks
from .layout import (ACTS, ATTN_PROJ, LAYOUT, SCHEMES, TARGETS, Scheme, decoder_layers, experts_of,
                     input_device, model_arch, moe_block)
from .modules import Int4Experts, Int4Linear, int4_matmul, int4_matmul_ref, kernels_on_cpu

__all__ = ["ACTS", "ATTN_PROJ", "FORMAT_VERSION", "LAYOUT", "SCHEMES", "TARGETS", "FusedAttention", "FusedDecoderLayer",
           "FusedRMSNorm", "FusedRouter", "Int4Experts", "Int4Linear", "fuse_decode",
           "QuantReport", "Scheme", "capture_layer0_inputs", "decoder_layers", "dithered_pack", "experts_of",
           "hessian_hooks", "input_device", "int4_matmul", "int4_matmul_ref", "kernels_on_cpu", "load_quantized",
           "model_arch",
           "moe_block", "quantize_model", "read_metadata", "save_quantized"]
