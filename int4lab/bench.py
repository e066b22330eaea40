"""Batch-1 decode timing harness: our int4-b32 kernels beside their peers, one run, one receipt.

    python -m int4lab.bench                       # full run on a CUDA device -> data/receipts/decode_h200.json
    python -m int4lab.bench --quick               # two GEMV shapes + Qwen3's MoE layer (< 1 min), same code path
    python -m int4lab.bench --only int4_b32,bf16 --out /tmp/r.json
    python -m int4lab.bench --dry-run             # no timing: print the shapes and byte counts (works on CPU)

GemLite on the GPU image (no network there): build the pure-Python wheel here, carry `.whl` (git-ignored) with
the run, install it there before the harness:
    pip wheel --no-deps gemlite==0.6.0.post2 -w .whl                     # on a machine with PyPI
    pip install -q --no-deps --target /tmp/site .whl/gemlite-0.6.0.post2-py3-none-any.whl
    PYTHONPATH=$PWD:/tmp/site python -m int4lab.bench --out $OUT/decode_h200.json
Its declared dependencies (numpy, tqdm, triton>=3.6.0) are already on the GPU image.

Method (what one `us` means):
  * weights are rotated through `copies` distinct copies so that the bytes one cycle touches exceed 4x L2
    (`l2_bytes()`, 60 MB on the H200): every call reads its weights from HBM, as in a real decode step where
    each layer's weights were last touched a whole forward pass ago;
  * one CUDA graph is captured that makes the call once per copy, in sequence; a replay is timed with CUDA
    events and divided by `copies`; `us` is the median over `replays` (>= 20) replays after warm-up replays,
    `p10_us`/`p90_us` the spread;
  * `GBps` = bytes one call must move (weights + scales + activations in and out; our intermediates such as
    int8 activations and split-K partials are NOT counted: they are overhead, not necessity) / `us`;
    formulas in `gemv_bytes` / `moe_bytes`; GEMV rows count the prepared tensors' real sizes and keep the
    formula beside them (`bytes_formula`), so a layout that stores more than it should shows;
  * before a row is timed its first copy's output is compared with an fp32 reference of the same quantised
    weights; a kernel that fails the check, or an implementation that is missing, goes to `skipped` with the
    reason -- never a row.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = expert
intermediate; gate_up is [E, 2I, H] (gate rows first), down is [E, H, I].
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .paths import RECEIPTS

DEFAULT_OUT = RECEIPTS / "decode_h200.json"
DEFAULT_BUDGET_S = 210.0     # a whole run fits a 4-minute slot; what is left unstarted is listed as skipped

# ----------------------------------------------------------------------------------------------------------
# Models: decode shapes as data.
# Mixtral-8x7B: transformers 5.23 `MixtralConfig` defaults (checkpoint mistralai/Mixtral-8x7B-v0.1):
#   hidden 4096, intermediate 14336, 8 local experts, top-2, 32 heads, 8 kv heads; head_dim None -> 4096/32.
# OLMoE-1B-7B: `OlmoeConfig` defaults give hidden 2048, 64 experts, top-8, 16 heads, 16 kv heads, but
#   intermediate 2048; the released checkpoint's config.json sets intermediate_size 1024
#   (https://huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json), which the anchors' expert
#   shapes 2048x2048 (gate_up) and 2048x1024 (down) confirm (/work/shared/anchors/decode_h200_2026-12-02.json).
# Qwen3-30B-A3B: `Qwen3MoeConfig` defaults (checkpoint Qwen/Qwen3-30B-A3B-Base): hidden 2048, moe
#   intermediate 768, 128 experts, top-8, 32 heads, 4 kv heads; head_dim 128 is set explicitly in the
#   checkpoint's config.json (not hidden/heads = 64), as Megatron recipes state with --kv-channels 128
#   (zyzshishui/slime scripts/models/qwen3-30B-A3B.sh), hence q 4096x2048 and o 2048x4096.
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEModel:
    name: str
    hidden: int            # H
    intermediate: int      # I, one expert's
    n_experts: int         # E
    top_k: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    source: str


MODELS = {
    "mixtral": MoEModel("mixtral", 4096, 14336, 8, 2, 32, 8, 128, "Mixtral-8x7B (MixtralConfig defaults)"),
    "olmoe": MoEModel("olmoe", 2048, 1024, 64, 8, 16, 16, 128, "OLMoE-1B-7B-0924 (config.json)"),
    "qwen3": MoEModel("qwen3", 2048, 768, 128, 8, 32, 4, 128, "Qwen3-30B-A3B (Qwen3MoeConfig + head_dim 128)"),
}


@dataclass(frozen=True)
class Shape:
    """One batch-1 GEMV: y [1, N] = x [1, K] @ W[N, K].T."""
    model: str
    layer: str
    N: int
    K: int


def decode_shapes(m: MoEModel) -> list[Shape]:
    """Every distinct decode GEMV of one layer of `m`; projections of equal shape share one row ("q/o")."""
    H, I, D = m.hidden, m.intermediate, m.head_dim
    named = [("q", m.n_heads * D, H), ("k/v", m.n_kv_heads * D, H), ("o", H, m.n_heads * D),
             ("gate_up", 2 * I, H), ("down", H, I)]
    merged: dict[tuple[int, int], list[str]] = {}
    for name, n, k in named:
        merged.setdefault((n, k), []).append(name)
    return [Shape(m.name, "/".join(names), n, k) for (n, k), names in merged.items()]


# Shapes the anchors and targets name that are not a fused decode projection: Mixtral's gate or up alone
# (llama.cpp and the anchors run them separately) and 28672x8192 (132 MB of int4: no cache can hold it).
EXTRA_SHAPES = [Shape("mixtral", "gate|up", 14336, 4096), Shape("large", "28672x8192", 28672, 8192)]
QUICK_SHAPES = [Shape("mixtral", "gate|up", 14336, 4096), Shape("qwen3", "down", 2048, 768)]
GROUPED_TOKENS = (4, 8, 16, 32)


def all_shapes(quick: bool = False) -> list[Shape]:
    if quick:
        return list(QUICK_SHAPES)
    return [s for m in MODELS.values() for s in decode_shapes(m)] + EXTRA_SHAPES


# ----------------------------------------------------------------------------------------------------------
# Bytes one call must move (the numerator of GBps and of the floor us = bytes / copy bandwidth).
# ----------------------------------------------------------------------------------------------------------
GEMV_IMPLS = ("int4_b32", "w4a16_cutlass", "bf16", "tinygemm", "gemlite")
MOE_IMPLS = ("int4_b32_moe", "bf16_loop", "grouped_mm", "int4_b32_grouped")
IMPLS = GEMV_IMPLS + MOE_IMPLS

# weight-side bytes per weight element, for each GEMV implementation's storage
#   int4_b32:      4-bit code + fp16 scale per 32             = 0.5 + 2/32
#   tinygemm:      4-bit code + bf16 (scale, zero) per 32     = 0.5 + 4/32
#   gemlite:       4-bit code + bf16 scale + bf16 zero per 32 = 0.5 + 4/32
#   w4a16_cutlass: 4-bit code + one scale per output channel  (added per row below)
#   bf16:          2


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
    if impl == "w4a16_cutlass":
        return N * K // 2 + scale_itemsize * N + act
    raise ValueError(f"impl must be one of {GEMV_IMPLS} for gemv_bytes, got {impl!r}")


def expert_bytes(impl: str, m: MoEModel) -> int:
    """Weight-side bytes of one expert (gate_up [2I, H] + down [H, I]) in `impl`'s storage."""
    n_weights = 3 * m.intermediate * m.hidden
    if impl in ("int4_b32_moe", "int4_b32_grouped"):
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


# ----------------------------------------------------------------------------------------------------------
# Receipt schema
# ----------------------------------------------------------------------------------------------------------
ROW_KEYS = ("model", "layer", "N", "K", "E", "topk", "rows", "impl", "us", "GBps")
_INT_KEYS = ("N", "K", "E", "topk", "rows")


def validate_row(row: dict) -> None:
    """Raise ValueError unless `row` has every schema key with the right type and a sane value."""
    if not isinstance(row, dict):
        raise ValueError(f"row must be a dict, got {type(row).__name__}")
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"row is missing keys {missing}: {row}")
    if row["impl"] not in IMPLS:
        raise ValueError(f"row impl must be one of {IMPLS}, got {row['impl']!r}")
    for k in ("model", "layer"):
        if not isinstance(row[k], str) or not row[k]:
            raise ValueError(f"row {k} must be a non-empty string, got {row[k]!r}")
    for k in _INT_KEYS:
        if not isinstance(row[k], int) or isinstance(row[k], bool) or row[k] <= 0:
            raise ValueError(f"row {k} must be a positive int, got {row[k]!r}")
    for k in ("us", "GBps"):
        v = row[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"row {k} must be a positive finite number, got {v!r}")


def validate_receipt(rec: dict) -> None:
    """Raise ValueError unless `rec` is a decode receipt: provenance, copy bandwidth, valid rows, skipped list."""
    if not isinstance(rec, dict):
        raise ValueError(f"receipt must be a dict, got {type(rec).__name__}")
    for k in ("provenance", "rows", "skipped", "copy"):
        if k not in rec:
            raise ValueError(f"receipt is missing '{k}'")
    if not isinstance(rec["rows"], list):
        raise ValueError("receipt rows must be a list")
    for row in rec["rows"]:
        validate_row(row)
    for s in rec["skipped"]:
        if not isinstance(s, dict) or not s.get("reason"):
            raise ValueError(f"every skipped entry needs a non-empty 'reason', got {s!r}")
    gbps = rec["copy"].get("GBps") if isinstance(rec["copy"], dict) else None
    if not isinstance(gbps, (int, float)) or not gbps > 0:
        raise ValueError(f"receipt copy.GBps must be a positive number, got {gbps!r}")


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------
def l2_bytes() -> int:
    """The device's L2 size in bytes (60 MB on the H200 if the property is missing)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)


def copies_for(bytes_per_call: int, l2: int, factor: int = 4, cap: int = 1024) -> int:
    """How many weight copies make one rotation touch more than `factor` x L2 (at least 1, at most `cap`)."""
    return max(1, min(cap, factor * l2 // bytes_per_call + 1))


def time_calls(calls, replays: int = 20, warmup: int = 3) -> list[float]:
    """Capture one CUDA graph making every call in `calls` once, in order; return per-call us of each replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):          # eager warm-up on a side stream, as capture requires
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return out


def checked_timing(calls, ref, tol: float, replays: int, t0: float):
    """Check the first call against the reference (Skip when wrong), then time: (err, setup_s, summary)."""
    err = rel_err(calls[0](), ref)
    if not err <= tol:
        raise Skip(f"wrong result: max|y-ref|/max|ref| = {err:.3g} > {tol:.3g}")
    setup_s = time.time() - t0
    return err, setup_s, summarise(time_calls(calls, replays=replays))


def summarise(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=10)
    return {"us": statistics.median(samples), "p10_us": q[0], "p90_us": q[-1], "replays": len(samples)}


def copy_bandwidth(nbytes: int = 2 * 2**30, replays: int = 20) -> dict:
    """Device-to-device copy of `nbytes`: GBps counts bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    s = summarise(time_calls([lambda: dst.copy_(src)], replays=replays))
    del src, dst
    return {"bytes": 2 * nbytes, **s, "GBps": 2 * nbytes / (s["us"] * 1e3)}


# ----------------------------------------------------------------------------------------------------------
# Implementations. Each `prep_*` builds `copies` independent weight copies and returns
# (calls, y_of_first_call, weight_side_bytes); `reference` is fp32.
# ----------------------------------------------------------------------------------------------------------
class Skip(Exception):
    """An implementation that cannot run here; the message is the receipt's reason."""


def _kernels():
    try:
        from . import kernels
    except ImportError as e:
        raise Skip(f"int4lab.kernels does not import: {e}") from None
    return kernels


def _need(mod, name: str):
    fn = getattr(mod, name, None)
    if fn is None:
        raise Skip(f"{mod.__name__} has no {name} in this checkout")
    return fn


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max|y - ref| / max|ref| in fp32 (NaN counts as failure)."""
    d = (y.float() - ref.float()).abs().max()
    return float(d / ref.float().abs().max().clamp_min(1e-30)) if torch.isfinite(d) else float("inf")


def _weights(N, K, gen, E=None):
    shape = (N, K) if E is None else (E, N, K)
    return (torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32) * 0.02).to(torch.bfloat16)


def prep_gemv(impl: str, N: int, K: int, W: torch.Tensor, x: torch.Tensor, copies: int):
    """calls (one per weight copy), reference y [1, N] fp32, weight-side bytes, tolerance."""
    import int4lab as il
    from .format import unpack_codes
    if impl == "bf16":
        ws = [W.clone() for _ in range(copies)]
        return [lambda w=w: torch.matmul(x, w.t()) for w in ws], x.float() @ W.float().t(), W.nbytes, 2 ** -7
    packed, scales = il.pack_int4_b32(W)
    wq = il.dequant_int4_ref(packed, scales, N, K)
    if impl == "int4_b32":
        k = _kernels()
        int4_linear = _need(k, "int4_linear")
        xq, xs = il.quant_x_rows_ref(x)
        ref = (xq.float().reshape(1, K // 32, 32) * xs.unsqueeze(-1)).reshape(1, K) @ wq.t()
        ps = [(packed.clone(), scales.clone()) for _ in range(copies)]
        return ([lambda p=p, s=s: int4_linear(x, p, s) for p, s in ps], ref,
                packed.nbytes + scales.nbytes, 2 ** -7)
    ref = x.float() @ wq.t()
    nib = (unpack_codes(packed).to(torch.int16) + 8).to(torch.uint8)          # [N, K] in 0..15
    if impl == "tinygemm":
        if not hasattr(torch, "_weight_int4pack_mm"):
            raise Skip(f"torch {torch.__version__} has no _weight_int4pack_mm")
        if N % 8 or K % 128:
            raise Skip(f"tinygemm needs N % 8 == 0 and K % 128 == 0 here, got {N}x{K}")
        # CUDA packing (pytorch test/test_linalg.py `_group_quantize_tensor`): even k in the HIGH nibble;
        # decode w = (q - 8) * scale + zero with [K/32, N, 2] bf16 (scale, zero); zero = 0 is symmetric.
        u8 = (nib[:, 0::2] << 4) | nib[:, 1::2]
        wp = torch._convert_weight_to_int4pack(u8.contiguous(), 8)
        sz = torch.stack([scales.to(torch.bfloat16), torch.zeros_like(scales, dtype=torch.bfloat16)], -1)
        sz = sz.transpose(0, 1).contiguous()                                    # [K/32, N, 2]
        cs = [(wp.clone(), sz.clone()) for _ in range(copies)]
        return ([lambda w=w, z=z: torch._weight_int4pack_mm(x, w, 32, z) for w, z in cs], ref,
                wp.nbytes + sz.nbytes, 2 ** -6)
    if impl == "gemlite":
        try:
            from gemlite.helper import A16W4_HQQ_INT
        except ImportError as e:
            raise Skip(f"gemlite not importable ({e}); install the carried wheel: pip install --no-deps "
                       "--target /tmp/site .whl/gemlite-0.6.0.post2-py3-none-any.whl; PYTHONPATH=/tmp/site") from None
        # HQQ convention W ~ (W_q - zero) * scale with W_q the nibble 0..15: zero 8 gives the same grid.
        s16 = scales.to(torch.bfloat16)
        mods = [A16W4_HQQ_INT(device="cuda", dtype=torch.bfloat16).from_weights(
            W_q=nib, scales=s16, zeros=torch.full_like(s16, 8.0)) for _ in range(copies)]
        m0 = mods[0]
        wbytes = sum(t.nbytes for t in (m0.W_q, m0.scales, m0.zeros) if isinstance(t, torch.Tensor))
        # A looser gate, for a known cause: where bf16 atomics exist (Hopper) GemLite's batch-1 GEMV sums its
        # split-K partials with tl.atomic_add straight into the bf16 output (gemlite 0.6.0.post2,
        # gemlite/triton_kernels/gemv_revsplitK_kernels.py, `native_atomic`), so every partial is rounded to
        # bf16: 1e-2 to 4e-2 of max|y| on the H200 (receipt of 2026-12-02, 13:14 UTC). A wrong layout gives ~1.
        return [lambda m=m: m(x) for m in mods], ref, wbytes, 2 ** -4
    if impl == "w4a16_cutlass":
        try:
            from .cutlass_layout import weight_dequantize, weight_quantize
            from .kernels.w4a16_cutlass import w4a16_cutlass_gemv
        except ImportError as e:
            raise Skip(f"w4a16_cutlass not importable: {e}") from None
        # Paddle's layout takes [K, N] and quantises per output channel itself (its own codes, not int4-b32's).
        q, s = weight_quantize(W.t().contiguous(), algo="weight_only_int4", arch=80)
        ref = x.float() @ weight_dequantize(q, s, algo="weight_only_int4", arch=80).float()
        cs = [(q.clone(), s.clone()) for _ in range(copies)]
        return ([lambda q=q, s=s: w4a16_cutlass_gemv(x, q, s) for q, s in cs], ref, q.nbytes + s.nbytes, 2 ** -6)
    raise ValueError(f"impl must be one of {GEMV_IMPLS}, got {impl!r}")


def bench_gemv(shape: Shape, impls, *, replays: int, l2: int, gen) -> tuple[list[dict], list[dict]]:
    rows, skipped = [], []
    N, K = shape.N, shape.K
    W = _weights(N, K, gen)
    x = torch.randn(1, K, generator=gen, device=gen.device).to(torch.bfloat16)
    for impl in impls:
        where = {"model": shape.model, "layer": shape.layer, "N": N, "K": K, "impl": impl}
        try:
            wbytes_guess = gemv_bytes(impl, N, K) - 2 * (K + N)
            copies = copies_for(wbytes_guess, l2)
            t0 = time.time()
            calls, ref, wbytes, tol = prep_gemv(impl, N, K, W, x, copies)
            if copies_for(wbytes, l2) > copies:              # the layout stores less than guessed: rotate more
                copies = copies_for(wbytes, l2)
                calls, ref, wbytes, tol = prep_gemv(impl, N, K, W, x, copies)
            # GBps uses the bytes the prepared tensors really hold; the formula is recorded beside it
            nbytes = wbytes + 2 * (K + N)
            per_channel = (wbytes - N * K // 2) // N if impl == "w4a16_cutlass" else 2
            formula = gemv_bytes(impl, N, K, scale_itemsize=per_channel)
            err, setup_s, s = checked_timing(calls, ref, tol, replays, t0)
        except Skip as e:
            skipped.append({**where, "reason": str(e)})
            continue
        except Exception as e:  # a peer or kernel crashing is a result to record, not a reason to stop the run
            skipped.append({**where, "reason": f"{type(e).__name__}: {e}"[:500]})
            continue
        finally:
            calls = ref = None
            torch.cuda.empty_cache()
        rows.append({"model": shape.model, "layer": shape.layer, "N": N, "K": K, "E": 1, "topk": 1, "rows": 1,
                     "impl": impl, "us": s["us"], "GBps": nbytes / (s["us"] * 1e3), "bytes": nbytes,
                     "bytes_formula": formula, "p10_us": s["p10_us"], "p90_us": s["p90_us"],
                     "replays": s["replays"], "copies": copies, "rel_err": err, "setup_s": setup_s})
        print(f"  {shape.model:8s} {shape.layer:22s} {N:6d}x{K:<6d} {impl:14s} {s['us']:8.2f} us "
              f"{rows[-1]['GBps']:7.0f} GB/s  (x{copies} copies, err {err:.1e})", flush=True)
    return rows, skipped


# ---- MoE layer: one or a few tokens, top-k routing ----------------------------------------------------------
def routing(m: MoEModel, rows: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Random distinct top-k expert ids int32 [R, top_k] and softmax weights fp32 [R, top_k]."""
    logits = torch.randn(rows, m.n_experts, generator=gen, device=gen.device)
    w, ids = torch.topk(torch.softmax(logits, -1), m.top_k, dim=-1)
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


def moe_reference(x, ids, wts, gu, dn) -> torch.Tensor:
    """fp32 MoE layer: y[r] = sum_j wts[r, j] * down_e(silu(gate_e x) * up_e x), e = ids[r, j]."""
    I = dn.shape[-1]
    y = torch.zeros(x.shape[0], dn.shape[1], device=x.device)
    for r in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[r, j])
            h = gu[e].float() @ x[r].float()
            a = torch.nn.functional.silu(h[:I]) * h[I:]
            y[r] += float(wts[r, j]) * (dn[e].float() @ a)
    return y


def grouped_mm_unavailable(device) -> str | None:
    """Why torch._grouped_mm cannot run on `device` (None when it can): the op must exist; CUDA bf16 needs sm_90+."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        cap = torch.cuda.get_device_capability(device)
        return f"torch._grouped_mm bf16 needs sm_90+, this device is sm_{cap[0]}{cap[1]}"
    return None


def _bf16_loop(x, ids, wts, gu, dn):
    """One matmul per routed expert projection (rows gathered on the host's known routing), as a serving loop."""
    I = dn.shape[-1]
    y = torch.zeros(x.shape[0], dn.shape[1], device=x.device, dtype=torch.float32)
    plan = {}
    for r, row in enumerate(ids.tolist()):
        for j, e in enumerate(row):
            plan.setdefault(e, []).append((r, j))
    plan = [(e, torch.tensor([r for r, _ in p], device=x.device), torch.tensor([j for _, j in p], device=x.device))
            for e, p in sorted(plan.items())]

    def call():
        y.zero_()
        for e, r, j in plan:
            h = torch.matmul(x[r], gu[e].t())
            a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            y.index_add_(0, r, torch.matmul(a, dn[e].t()).float() * wts[r, j].unsqueeze(-1))
        return y
    return call


def _grouped_mm(x, ids, wts, gu, dn):
    """torch._grouped_mm over all E experts (empty groups for unrouted ones), rows sorted by expert."""
    E, I = gu.shape[0], dn.shape[-1]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    offs = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
    tok = order // ids.shape[1]
    w_sorted = wts.reshape(-1)[order].unsqueeze(-1)
    y = torch.zeros(x.shape[0], dn.shape[1], device=x.device, dtype=torch.float32)

    def call():
        xs = x[tok]
        h = torch._grouped_mm(xs, gu.transpose(-2, -1), offs=offs)
        a = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]).contiguous()
        o = torch._grouped_mm(a, dn.transpose(-2, -1), offs=offs)
        y.zero_()
        y.index_add_(0, tok, o.float() * w_sorted)
        return y
    return call


def prep_moe(impl: str, m: MoEModel, rows: int, gen, copies: int):
    """calls, fp32 reference [R, H], weight-side bytes per call, tolerance, n_active."""
    import int4lab as il
    H, I, E = m.hidden, m.intermediate, m.n_experts
    x = torch.randn(rows, H, generator=gen, device=gen.device).to(torch.bfloat16)
    ids, wts = routing(m, rows, gen)
    n_active = int(torch.unique(ids).numel())
    gu, dn = _weights(2 * I, H, gen, E), _weights(H, I, gen, E)
    if impl in ("bf16_loop", "grouped_mm"):
        if impl == "grouped_mm":
            why = grouped_mm_unavailable(x.device)
            if why:
                raise Skip(why)
        ref = moe_reference(x, ids, wts, gu, dn)
        make = _bf16_loop if impl == "bf16_loop" else _grouped_mm
        cs = [(gu, dn)] + [(gu.clone(), dn.clone()) for _ in range(copies - 1)]
        return [make(x, ids, wts, g, d) for g, d in cs], ref, n_active * expert_bytes(impl, m), 2 ** -6, n_active
    k = _kernels()
    pgu, sgu = il.pack_int4_b32(gu)
    pdn, sdn = il.pack_int4_b32(dn)
    ref = moe_reference(x, ids, wts, il.dequant_int4_ref(pgu, sgu, 2 * I, H), il.dequant_int4_ref(pdn, sdn, H, I))
    fn = _need(k, "moe_decode_step" if impl == "int4_b32_moe" else "moe_decode_grouped")
    cs = [(pgu, sgu, pdn, sdn)] + [tuple(t.clone() for t in (pgu, sgu, pdn, sdn)) for _ in range(copies - 1)]
    calls = [lambda c=c: fn(x, ids, wts, *c) for c in cs]
    # activations are int8-quantised twice (x and the SwiGLU output): a looser check than the GEMV's
    return calls, ref, n_active * expert_bytes(impl, m), 2 ** -5, n_active


def bench_moe(m: MoEModel, impl: str, rows: int, *, replays: int, l2: int, gen) -> tuple[list[dict], list[dict]]:
    where = {"model": m.name, "layer": "moe", "rows": rows, "impl": impl}
    try:
        active_guess = min(m.n_experts, m.top_k * rows) * expert_bytes(impl, m)
        copies = copies_for(active_guess, l2)
        t0 = time.time()
        calls, ref, wbytes, tol, n_active = prep_moe(impl, m, rows, gen, copies)
        err, setup_s, s = checked_timing(calls, ref, tol, replays, t0)
    except Skip as e:
        return [], [{**where, "reason": str(e)}]
    except Exception as e:  # recorded, not swallowed: the receipt says what broke
        return [], [{**where, "reason": f"{type(e).__name__}: {e}"[:500]}]
    finally:
        calls = ref = None
        torch.cuda.empty_cache()
    nbytes = moe_bytes(impl, m, rows, n_active)
    assert nbytes == wbytes + 4 * rows * m.hidden
    row = {"model": m.name, "layer": "moe", "N": m.intermediate, "K": m.hidden, "E": m.n_experts,
           "topk": m.top_k, "rows": rows, "impl": impl, "us": s["us"], "GBps": nbytes / (s["us"] * 1e3),
           "bytes": nbytes, "n_active": n_active, "p10_us": s["p10_us"], "p90_us": s["p90_us"],
           "replays": s["replays"], "copies": copies, "rel_err": err, "setup_s": setup_s}
    print(f"  {m.name:8s} moe R={rows:<3d} {impl:18s} {s['us']:8.2f} us {row['GBps']:7.0f} GB/s "
          f"(x{copies} copies, {n_active} experts, err {err:.1e})", flush=True)
    return [row], []


# ----------------------------------------------------------------------------------------------------------
def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


@dataclass(frozen=True)
class Work:
    """One scheduled measurement: a GEMV shape (all its impls) or one MoE (model, impl, tokens)."""
    shape: Shape | None = None
    impls: tuple[str, ...] = ()
    model: str | None = None
    rows: int = 1

    def label(self) -> str:
        if self.shape is not None:
            return f"gemv {self.shape.model} {self.shape.layer} {self.shape.N}x{self.shape.K}"
        return f"moe {self.model} {self.impls[0]} R={self.rows}"


TARGET_SHAPES = ((14336, 4096), (4096, 14336), (28672, 8192))


def schedule(quick: bool = False, only=None) -> list[Work]:
    """Measurements in priority order, so a run cut short by its time budget keeps the most important ones:
    the targets' GEMV shapes, then one-token MoE layers, then the remaining shapes, then grouped tokens."""
    only = set(only) if only else set(IMPLS)
    gemv = tuple(i for i in GEMV_IMPLS if i in only)
    shapes = all_shapes(quick)
    first = sorted((s for s in shapes if (s.N, s.K) in TARGET_SHAPES), key=lambda s: TARGET_SHAPES.index((s.N, s.K)))
    rest = [s for s in shapes if (s.N, s.K) not in TARGET_SHAPES]
    models = ["qwen3"] if quick else ["qwen3", "olmoe", "mixtral"]
    one = [Work(model=m, impls=(i,), rows=1) for m in models for i in ("int4_b32_moe", "bf16_loop", "grouped_mm")
           if i in only]
    few = [Work(model=m, impls=(i,), rows=T) for T in ((8,) if quick else GROUPED_TOKENS) for m in models
           for i in ("int4_b32_grouped", "int4_b32_moe", "grouped_mm", "bf16_loop") if i in only]
    return ([Work(shape=s, impls=gemv) for s in first] * bool(gemv) + one
            + [Work(shape=s, impls=gemv) for s in rest] * bool(gemv) + few)


def run(*, quick: bool = False, only=None, replays: int | None = None, seed: int = 0,
        budget_s: float | None = None, checkpoint=None) -> dict:
    """Time the schedule on the current CUDA device; returns the receipt payload (without provenance).

    Work not started within `budget_s` seconds goes to `skipped` with that reason; `checkpoint(payload)`, if
    given, is called after every measurement (main uses it to keep a partial receipt on disk).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("int4lab.bench times kernels on a CUDA device; none is available here")
    only = set(only) if only else set(IMPLS)
    bad = only - set(IMPLS)
    if bad:
        raise ValueError(f"--only must name impls from {IMPLS}, got {sorted(bad)}")
    replays = replays or 20
    if replays < 20:
        raise ValueError(f"replays must be >= 20 (medians of at least 20 replays), got {replays}")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = _generator(seed)
    l2 = l2_bytes()
    t0 = time.time()
    copy = copy_bandwidth(replays=replays)
    print(f"device copy: {copy['GBps']:.0f} GB/s (read + write), L2 {l2 / 2**20:.0f} MiB", flush=True)
    payload = {"method": {"timing": "CUDA graph of one call per weight copy, replay time / copies, median",
                          "replays": replays, "rotation": "copies until the bytes of one cycle exceed 4x L2",
                          "l2_bytes": l2, "seed": seed, "quick": quick, "budget_s": budget_s,
                          "env": {k: v for k, v in os.environ.items() if k.startswith("INT4LAB_")},
                          "complete": False},
               "models": {k: asdict(v) for k, v in MODELS.items()},
               "copy": copy, "rows": [], "skipped": []}
    for work in schedule(quick, only):
        if budget_s is not None and time.time() - t0 > budget_s:
            payload["skipped"] += [{"what": work.label(), "impl": i, "reason": f"time budget {budget_s:g} s spent"}
                                   for i in work.impls]
            continue
        if work.shape is not None:
            r, s = bench_gemv(work.shape, work.impls, replays=replays, l2=l2, gen=gen)
        else:
            r, s = bench_moe(MODELS[work.model], work.impls[0], work.rows, replays=replays, l2=l2, gen=gen)
        payload["rows"] += r
        payload["skipped"] += s
        payload["method"]["wall_s"] = time.time() - t0
        if checkpoint is not None:
            checkpoint(payload)
    for s in payload["skipped"]:
        print(f"  skipped {s}", flush=True)
    payload["method"]["wall_s"] = time.time() - t0
    payload["method"]["complete"] = True
    return payload


def dry_run(quick: bool = False) -> list[dict]:
    """Shapes and byte counts without timing (runs anywhere): one dict per (shape, impl)."""
    out = []
    for s in all_shapes(quick):
        for impl in GEMV_IMPLS:
            out.append({"model": s.model, "layer": s.layer, "N": s.N, "K": s.K, "impl": impl,
                        "bytes": gemv_bytes(impl, s.N, s.K)})
    for m in MODELS.values():
        for impl in ("int4_b32_moe", "bf16_loop"):
            out.append({"model": m.name, "layer": "moe", "N": m.intermediate, "K": m.hidden, "impl": impl,
                        "bytes": moe_bytes(impl, m, 1, m.top_k)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="two GEMV shapes and Qwen3's MoE layer at 1 and 8 tokens: the same code path, < 1 min")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"receipt path (default {DEFAULT_OUT})")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--replays", type=int, default=20, help="timed graph replays per row; us = their median")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="start no new measurement after this many seconds; the rest is recorded as skipped "
                         f"(default {DEFAULT_BUDGET_S:g}; 0 = no limit)")
    ap.add_argument("--dry-run", action="store_true", help="print shapes and bytes per call; time nothing")
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    if args.dry_run:
        for d in dry_run(args.quick):
            print(f"{d['model']:8s} {d['layer']:22s} {d['N']:6d}x{d['K']:<6d} {d['impl']:14s} {d['bytes']:>12d} B")
        return 0
    if not torch.cuda.is_available():
        print("int4lab.bench: no CUDA device here; timing needs one (use --dry-run to list shapes and bytes)",
              file=sys.stderr)
        return 2
    from .receipts import write_receipt
    cmd = ("python -m int4lab.bench " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    # after every measurement the receipt on disk is rewritten (method.complete false until the end), so a run
    # killed from outside still leaves what it measured
    payload = run(quick=args.quick, only=only, replays=args.replays, budget_s=args.budget_s or None,
                  checkpoint=lambda p: write_receipt(args.out, p, command=cmd))
    validate_receipt({"provenance": {}, **payload})
    path = write_receipt(args.out, payload, command=cmd)
    print(f"wrote {path} ({len(payload['rows'])} rows, {len(payload['skipped'])} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
