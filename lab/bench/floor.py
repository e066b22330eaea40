"""The read floor: the time one kernel that only reads a row's bytes takes, timed like the row itself.

A decode GEMV reads its weights once and writes a few KB, so its roofline is not a copy (which writes as
much as it reads) but a kernel that reads the same bytes and nothing else. `read_xor_kernel` is that
kernel: each program xors `ITERS` blocks of `BLOCK` int32 words into one word and stores it (one word per
program is all it writes; the xor keeps the loads from being optimised away). `read_floor` searches a few
BLOCK x ITERS x num_warps launch configurations over copies of the buffer rotated past 4 x L2 with the
bench's timer (`timing.time_calls`) and keeps the best median: the floor a row's `us` is divided by.

The recorded H200 floor (data/receipts/anchors/stream_floor_h200_2026-12-02.json) used the same method:
a plain read-and-xor loop, best of six configurations, graph over rotated copies; an empty kernel in a
graph costs 0.6 us there. Every configuration reads 16 KB per program, so a small floor (under about 2 MB on an
H100's 132 SMs) runs fewer programs than the GPU has SMs; whether more, smaller programs read those bytes faster was
not measured, so a small floor is this kernel's time, not a bound.

This is a benchmark tool, not a runtime kernel: it lives beside the bench, not in `int4lab/kernels/`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.bench import timing

# (BLOCK int32 words per step, ITERS steps per program, num_warps): the recorded floor's winners
# (B512_I8_w4, B1024_I4_w4, B2048_I2_w4) and the same bytes per program with twice the warps.
FLOOR_CONFIGS = ((512, 8, 4), (1024, 4, 4), (2048, 2, 4), (1024, 4, 8), (2048, 2, 8), (4096, 1, 8))


@triton.jit
def read_xor_kernel(
    # Pointers
    words_ptr,              # int32 [n_words]: the buffer's whole words
    tail_ptr,               # uint8 [n_tail]: its last n_tail (0..3) bytes
    out_ptr,                # int32 [programs]: one word per program
    # Dimensions
    n_words, n_tail,
    # Meta-parameters
    BLOCK: tl.constexpr, ITERS: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """Program p reads words [p * BLOCK * ITERS, (p + 1) * BLOCK * ITERS) and stores their xor at out[p];
    program 0 also folds in the tail bytes (little-endian, as a zero-padded last word would hold them)."""
    pid = tl.program_id(0)
    base = pid * (BLOCK * ITERS)
    offs = base + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    if base + BLOCK * ITERS <= n_words:
        # a whole chunk: no mask, so the compiler can emit 16-byte loads (a mask on an n_words that is not a
        # multiple of 4 would split them into 4-byte loads and make the floor too easy to beat)
        for i in tl.static_range(ITERS):
            acc = acc ^ tl.load(words_ptr + offs + i * BLOCK)
    else:
        # the last, partial chunk
        for i in tl.static_range(ITERS):
            idx = offs + i * BLOCK
            acc = acc ^ tl.load(words_ptr + idx, mask=idx < n_words, other=0)
    word = tl.xor_sum(acc, axis=0)
    if HAS_TAIL:
        t = tl.arange(0, 4)
        b = tl.load(tail_ptr + t, mask=(t < n_tail) & (pid == 0), other=0).to(tl.int32)
        word = word ^ tl.xor_sum(b << (8 * t), axis=0)
    tl.store(out_ptr + pid, word)


def _check(buf: torch.Tensor, block: int, iters: int, num_warps: int) -> None:
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
        raise TypeError(f"buf must be a 1-D uint8 tensor, got {getattr(buf, 'dtype', type(buf).__name__)} "
                        f"with {getattr(buf, 'dim', lambda: '?')()} dims")
    if buf.numel() == 0 or not buf.is_contiguous():
        raise ValueError(f"buf must be non-empty and contiguous, got {buf.numel()} bytes, "
                         f"contiguous={buf.is_contiguous()}")
    if buf.data_ptr() % 4:
        raise ValueError("buf must start on a 4-byte boundary (its whole words are read as int32)")
    if buf.numel() >= 2**33:
        raise ValueError(f"buf must hold fewer than 2**33 bytes (int32 word offsets), got {buf.numel()}")
    if block < 4 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 4, got {block}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {num_warps}")


def read_xor_call(buf: torch.Tensor, block: int, iters: int, num_warps: int):
    """A zero-argument callable that reads every byte of `buf` once and returns int32 [programs], the
    per-program xors (their xor is the xor of `buf` as little-endian words, zero-padded to a whole word)."""
    _check(buf, block, iters, num_warps)
    n_words, n_tail = buf.numel() // 4, buf.numel() % 4
    # under 4 bytes there are no whole words: a one-word dummy keeps the pointer's type (never read: n_words = 0)
    words = buf[: 4 * n_words].view(torch.int32) if n_words else torch.zeros(1, dtype=torch.int32, device=buf.device)
    tail = buf[4 * n_words:] if n_tail else buf
    programs = max(1, triton.cdiv(n_words, block * iters))
    out = torch.empty(programs, dtype=torch.int32, device=buf.device)

    def call():
        read_xor_kernel[(programs,)](words, tail, out, n_words, n_tail, BLOCK=block, ITERS=iters,
                                     HAS_TAIL=n_tail > 0, num_warps=num_warps)
        return out
    return call


def xor_words(buf: torch.Tensor, block: int = 512, iters: int = 8, num_warps: int = 4) -> int:
    """The kernel's answer reduced on the host: xor of `buf` as int32 words (tests compare it with numpy)."""
    word = 0
    for w in read_xor_call(buf, block, iters, num_warps)().tolist():
        word ^= w
    return word


def label(cfg) -> str:
    block, iters, warps = cfg
    return f"B{block}_I{iters}_w{warps}"


def read_floor(nbytes: int, *, l2: int, replays: int = 20, configs=FLOOR_CONFIGS, device="cuda") -> dict:
    """Time the read-only kernel over `nbytes`, copies rotated past 4 x L2, for each launch configuration;
    return the best: {"bytes", "us", "p10_us", "p90_us", "replays", "copies", "cfg", "configs": {cfg: us}}."""
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    copies = timing.copies_for(nbytes, l2)
    stride = -(-nbytes // 256) * 256                       # every copy starts 256-byte aligned
    pool = torch.empty(copies, stride, dtype=torch.uint8, device=device)
    bufs = [pool[i, :nbytes] for i in range(copies)]
    tried, best = {}, None
    for cfg in configs:
        s = timing.summarise(timing.time_calls([read_xor_call(b, *cfg) for b in bufs], replays=replays))
        tried[label(cfg)] = s["us"]
        if best is None or s["us"] < best[1]["us"]:
            best = (cfg, s)
    del pool, bufs
    return {"bytes": nbytes, **best[1], "copies": copies, "cfg": label(best[0]), "configs": tried}
