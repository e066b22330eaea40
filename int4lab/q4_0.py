"""int4-b32 <-> llama.cpp / GGUF `Q4_0`: the same grid, another nibble order, inline scales; a lossless transcode.

Shape legend: N = rows (out features), K = in features (K % 32 == 0), B = K / 32 blocks per row.

A Q4_0 block (ggml's `block_q4_0`, 18 bytes) holds one fp16 scale `d` and 16 bytes `qs` of 32 codes:
    qs[j] = q[j] | q[j + 16] << 4         (element j in the low nibble, element j + 16 in the high one)
    w[j]  = (q[j] - 8) * d
int4-b32 holds the same codes q = code + 8 and the same fp16 scale, with byte p = q[2p] | q[2p + 1] << 4,
and keeps its scales in a separate tensor rather than at the head of each block. So a transcode moves
nibbles and interleaves the scale bits, unchanged, into the blocks: no value is re-quantised, and the decoded
weights are bit-identical (`dequant_int4_ref` of the pack == ggml's Q4_0 decode of the blocks).
"""
from __future__ import annotations

import torch

from .format import BLOCK, check_packed, unpack_codes

Q4_0_BLOCK_BYTES = 2 + BLOCK // 2       # fp16 d, then 16 bytes of nibbles


def int4_b32_to_q4_0(packed: torch.Tensor, scales: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """int4-b32 (uint8 [..., N, K/2], float16 [..., N, K/32]) -> Q4_0 blocks uint8 [..., N, B * 18].

    Row n's bytes are its B blocks in order, each `d` (fp16, little-endian) then `qs` (16 bytes): the
    byte layout ggml stores for a Q4_0 tensor of shape [N, K] (ne0 = K).
    """
    check_packed(packed, scales, N, K)
    lead = packed.shape[:-2]
    nib = (unpack_codes(packed.cpu()).to(torch.int16) + 8).to(torch.uint8)        # [..., N, K]
    nib = nib.reshape(*lead, N, K // BLOCK, BLOCK)
    qs = nib[..., :BLOCK // 2] | (nib[..., BLOCK // 2:] << 4)                    # [..., N, B, 16]
    d = scales.cpu().contiguous().view(torch.uint8).reshape(*lead, N, K // BLOCK, 2)
    return torch.cat((d, qs), dim=-1).reshape(*lead, N, (K // BLOCK) * Q4_0_BLOCK_BYTES).contiguous()


def q4_0_to_int4_b32(blocks: torch.Tensor, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `int4_b32_to_q4_0`: uint8 [..., N, B * 18] -> (uint8 [..., N, K/2], float16 [..., N, K/32])."""
    if not isinstance(blocks, torch.Tensor) or blocks.dtype != torch.uint8:
        raise TypeError("blocks must be a uint8 torch.Tensor of Q4_0 blocks")
    if K <= 0 or K % BLOCK:
        raise ValueError(f"K must be a positive multiple of {BLOCK}, got {K}")
    if blocks.dim() < 2 or tuple(blocks.shape[-2:]) != (N, (K // BLOCK) * Q4_0_BLOCK_BYTES):
        raise ValueError(f"blocks must have trailing shape (N, K/32 * 18) = ({N}, {(K // BLOCK) * 18}), "
                         f"got {tuple(blocks.shape)}")
    lead = blocks.shape[:-2]
    b = blocks.cpu().contiguous().reshape(*lead, N, K // BLOCK, Q4_0_BLOCK_BYTES)
    scales = b[..., :2].contiguous().view(torch.float16).reshape(*lead, N, K // BLOCK)
    qs = b[..., 2:]
    nib = torch.cat((qs & 0xF, qs >> 4), dim=-1).reshape(*lead, N, K)           # element order j, j + 16
    packed = nib[..., 0::2] | (nib[..., 1::2] << 4)
    return packed.contiguous(), scales.contiguous()
