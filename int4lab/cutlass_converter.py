"""Why the Paddle / TensorRT-LLM int4 layout is what it is: TensorRT-LLM's fast converter (a CUTLASS
extension from FasterTransformer, not part of NVIDIA/cutlass) emulated bit for bit, the
PR's tables recomputed from the layout's construction, and the interleave derived from the mma.m16n8k16 fragment.

Shape legend: K = in features, N = out features (Paddle's convention: the float weight is x [K, N]).

The layout itself (its three constructions, `weight_quantize`, the int4-b32 transcode) is `cutlass_layout.py`;
this module explains it and is what chapter 01b and tests/lib/test_cutlass_layout.py hold it to.
"""
from __future__ import annotations

import numpy as np
import torch

from ._checks import check_tensor
from .cutlass_layout import (BIAS, _unpack_bytes, interleave_codes, nibble_positions, pack_along_k,
                             paddle_permute, permute_kk)


# ---------------------------------------------------------------------------------- the fast converter
HALF_MAGIC = 0x6400          # fp16 1024.0: a nibble ORed into the low mantissa bits reads as 1024 + v
BOTTOM_MASK = 0x000F000F
TOP_MASK = 0x00F000F0
SUB_MAGIC = 0x6408           # fp16 1032.0 = 1024 + bias 8
ONE_SIXTEENTH = 0x2C00       # fp16 0.0625
NEG_72 = 0xD480              # fp16 -72.0 = -(1024 / 16 + 8)
LOP3_IMM = (0xF0 & 0xCC) | 0xAA   # lop3 truth table for (a & b) | c


def _lop3(a: np.ndarray, b: int, c: int, imm: int = LOP3_IMM) -> np.ndarray:
    """PTX lop3.b32 evaluated bit by bit from its 8-entry truth table (a -> 0xF0, b -> 0xCC, c -> 0xAA)."""
    a = a.astype(np.uint32)
    b = np.uint32(b)
    c = np.uint32(c)
    out = np.zeros_like(a)
    for idx in range(8):
        if imm >> idx & 1:
            ta = a if idx & 4 else ~a
            tb = b if idx & 2 else ~b
            tc = c if idx & 1 else ~c
            out |= ta & tb & tc
    return out


def _halves(w: np.ndarray) -> np.ndarray:
    """uint32 [...] -> float16 [..., 2] (low half first), a bit reinterpretation like a half2 register."""
    return np.ascontiguousarray(w.astype("<u4")).view("<f2").reshape(*w.shape, 2)


def fast_dequant(words, sub_magic: int = SUB_MAGIC, one_sixteenth: int = ONE_SIXTEENTH,
                 neg_bias: int = NEG_72) -> np.ndarray:
    """Bit-exact emulation of TensorRT-LLM's FastInterleavedAndBiasedNumericArrayConverter<half_t, uint4b_t, 8>
    (its cutlass_extensions, namespace cutlass; not part of NVIDIA/cutlass).

    words: uint32-valued array [...] (numpy, or a torch int32 tensor read as unsigned). Returns float16 [..., 8]:
    result[i] for i = 0..7, i.e. the converter's output array in order. Per word:
      h0 = lop3(w & 0x000F000F | 0x64006400),  h1 = lop3(w & 0x00F000F0 | 0x64006400), same on w >> 8 for h2, h3;
      h0, h2 -= {1032, 1032} (sub.f16x2);  h1, h3 = fma(h, {1/16, 1/16}, {-72, -72}) (fma.rn.f16x2, one rounding).
    The constants are parameters so the notebook can show what a wrong one does.
    """
    if isinstance(words, torch.Tensor):
        words = words.detach().cpu().numpy()
    w = np.asarray(words).astype(np.int64).astype(np.uint32)
    top = w >> np.uint32(8)
    magic = (HALF_MAGIC << 16) | HALF_MAGIC
    h = [_lop3(w, BOTTOM_MASK, magic), _lop3(w, TOP_MASK, magic),
         _lop3(top, BOTTOM_MASK, magic), _lop3(top, TOP_MASK, magic)]
    sub = np.array(sub_magic, dtype="<u2").view("<f2").astype(np.float64)
    mul = np.array(one_sixteenth, dtype="<u2").view("<f2").astype(np.float64)
    add = np.array(neg_bias, dtype="<u2").view("<f2").astype(np.float64)
    out = []
    for idx, hh in enumerate(h):
        v = _halves(hh).astype(np.float64)
        # float64 holds fp16 products and sums exactly, so one cast to float16 is the single fp16 rounding
        r = (v - sub) if idx % 2 == 0 else (v * mul + add)
        out.append(r.astype(np.float16))
    return np.stack(out, axis=-2).reshape(*w.shape, 8)


def converter_nibble_order() -> list[int]:
    """For result[i], the nibble of the 32-bit word it is read from (computed by probing `fast_dequant`)."""
    order = []
    for i in range(8):
        src = [p for p in range(8) if fast_dequant(np.uint32(1 << (4 * p)))[i] != fast_dequant(np.uint32(0))[i]]
        order.append(src[0])
    return order


def k_order_of_words() -> torch.Tensor:
    """int64 [64]: the k of the t-th half the converter emits, walking one column's 32-byte run (8 words) in order."""
    pos = nibble_positions(64, 4)[:, 0]                             # column 0, k = 0..63: nibble positions
    conv = converter_nibble_order()                                 # result i is read from nibble conv[i]
    slot = torch.tensor([conv.index(int(p)) for p in pos % 8])
    order = torch.empty(64, dtype=torch.int64)
    order[(pos // 8) * 8 + slot] = torch.arange(64)
    return order


# ------------------------------------------------------------------------------- tracing the PR's tables
def trace_labels(stage, K: int, N: int) -> torch.Tensor:
    """Run a nibble-moving `stage(codes [K, N]) -> bytes` on bit planes of the label k * N + n and read back,
    for every nibble of the output (low nibble first), the label that landed there: int64 [2 * bytes].
    Works before or after the +8 bias: the plane bit b is stored as code b - 8, i.e. nibble 8 + b or b."""
    labels = torch.arange(K * N, dtype=torch.int64).view(K, N)
    found = None
    for b in range(max(1, int(K * N - 1).bit_length())):
        codes = (((labels >> b) & 1) - BIAS).to(torch.int8)
        nib = _unpack_bytes(stage(codes).reshape(-1).view(torch.uint8)).to(torch.int64)
        found = (nib & 1) << b if found is None else found | ((nib & 1) << b)
    return found


def pr_tables() -> dict:
    """The PR's tables (the notebook and tests compare them with the PR's text). The layout tables are traced
    through this module's layout code; `int8_map` is Paddle's wint8 map, copied as given, and the three after it
    replay the PR's recipe on it (its end point, `int8_plus_half`, equals the traced `permute_kk`). Orders are k
    indices of one column (n = 0), 32 consecutive k = 4 words = 16 bytes."""
    K, N = 64, 8
    k_of = lambda lab: (lab // N).tolist()  # noqa: E731
    final = trace_labels(interleave_codes, K, N)[:32]                          # nibbles of bytes 0..15 (column 0)
    before_swap = trace_labels(lambda c: paddle_permute(pack_along_k(c), K), K, N)[:32]
    int8_map = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]           # Paddle's wint8 permute map
    regrouped = int8_map[0:4] + int8_map[8:12] + int8_map[4:8] + int8_map[12:16]
    mod8x2 = [v % 8 * 2 for v in regrouped]
    plus_half = [v + (i >= 8) for i, v in enumerate(mod8x2)]
    int8_index = [k // 2 for k in k_of(before_swap)[0::2]]
    return {
        "converter_output": k_order_of_words()[:32].tolist(),                  # PR: 0 1 8 9 16 17 24 25 ...
        "converter_nibble_order": converter_nibble_order(),                     # result i <- nibble [i]
        "word_holds": [converter_nibble_order().index(p) for p in range(8)],    # PR: 0 2 4 6 1 3 5 7 -> 0..7
        "pre_dequant": k_of(final),                                             # PR: 0 8 16 24 1 9 17 25 ...
        "before_swap": k_of(before_swap),                                       # PR: 0 1 16 17 8 9 24 25 ...
        "int8_index": int8_index,                                               # PR: 0 8 4 12 1 9 5 13 ...
        "permute_kk": [int8_index.index(v) for v in range(16)],                 # PR: 0 4 8 12 2 6 10 14 ...
        "permute_kk_formula": permute_kk(torch.arange(16)).tolist(),
        "int8_map": int8_map,
        "int8_regrouped": regrouped,                                            # PR: 0 2 4 6 1 3 5 7 8 10 ...
        "int8_mod8x2": mod8x2,                                                  # PR: 0 4 8 12 2 6 10 14 0 4 ...
        "int8_plus_half": plus_half,                                            # PR: = permute_kk
    }


# ------------------------------------------------------------------- where the interleave comes from
def mma_b_fragment_k(lane: int, i: int) -> tuple[int, int]:
    """(k, n) of element b_i (i = 0..3) that lane `lane` holds of mma.m16n8k16's fp16 B operand [16 (k), 8 (n)].

    The PTX ISA's fragment layout (section "Matrix Fragments for mma.m16n8k16 with floating point type"):
    groupID = lane >> 2, threadID_in_group = lane % 4; row (k) = 2 * threadID_in_group + (i & 1), plus 8 for
    i >= 2; col (n) = groupID. Each .f16x2 register holds (b0, b1) or (b2, b3): two consecutive k.
    """
    if not 0 <= lane < 32 or not 0 <= i < 4:
        raise ValueError(f"lane must be in [0, 32) and i in [0, 4), got lane={lane}, i={i}")
    t = lane % 4
    return 2 * t + (i & 1) + 8 * (i >= 2), lane >> 2


def ldsm_perm_from_fragment() -> tuple[int, ...]:
    """The 32-row map of `permute_B_rows_for_mixed_gemm`, derived from the MMA fragment instead of copied.

    One 32-bit word of int4 becomes 8 halves = 4 .f16x2 registers = the B fragments of two k16 MMAs (k 0..15
    and 16..31 of a 32-k slice). Lane t of a column (threadID_in_group t) needs, in register order, the k of
    `mma_b_fragment_k(t, 0..3)` for the first MMA, then the same + 16 for the second. ldmatrix hands each lane
    one contiguous 32-bit word, so those 8 k must sit contiguously, lane 0's first: row j of the permuted
    group is source row perm[j].
    """
    perm = []
    for t in range(4):                                   # threadID_in_group: which word of the 32-k slice
        for mma in range(2):                             # k 0..15, then k 16..31
            perm += [16 * mma + mma_b_fragment_k(t, i)[0] for i in range(4)]
    return tuple(perm)


def bias_by_xor(b: torch.Tensor) -> torch.Tensor:
    """uint8 bytes -> each nibble + 8 (mod 16): the same as b ^ 0x88 (adding 8 to a 4-bit value only flips its
    top bit; the carry out of bit 3 is dropped by the mod 16). Offset binary <-> two's complement per nibble."""
    check_tensor("b", b, (torch.uint8,))
    return b ^ 0x88
