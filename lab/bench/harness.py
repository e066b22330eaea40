"""The bench's schedule and rows: which measurements run in which order, each checked against an fp32
reference before it is timed, each row stamped with the read floor of its int4-b32 bytes.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = one
expert's intermediate width (MoE rows carry N = I, K = H).

A row that fails its check, or an implementation that is missing or crashes, goes to `skipped` with the
reason -- never a row. Work not started within the time budget is listed in `skipped` too.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import torch

from .shapes import MODELS, TARGET_SHAPES, MoEModel, Shape, all_shapes, by_priority
from lab.bench import floor
from lab.bench import peers
from lab.bench import timing
from lab.bench.schema import GEMV_IMPLS, IMPLS
from lab.bench.traffic import expert_bytes, gemv_bytes, gemv_floor_bytes, moe_bytes, moe_floor_bytes

MOE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
QUICK_TOKENS = (1, 8)
# One token has no rows to group: the grouped GEMM is timed from two tokens on.
ONE_TOKEN_IMPLS = ("int4_b32_moe", "bf16_loop", "grouped_mm")
MANY_TOKEN_IMPLS = ("int4_b32_grouped", "int4_b32_moe", "grouped_mm", "bf16_loop")


def checked_timing(calls, ref, tol: float, replays: int, t0: float):
    """Check the first call against the reference (Skip when wrong), then time: (err, setup_s, summary)."""
    err = peers.rel_err(calls[0](), ref)
    if not err <= tol:
        raise peers.Skip(f"wrong result: max|y-ref|/max|ref| = {err:.3g} > {tol:.3g}")
    setup_s = time.time() - t0
    return err, setup_s, timing.summarise(timing.time_calls(calls, replays=replays))


def _reason(e: Exception) -> str:
    return str(e) if isinstance(e, peers.Skip) else f"{type(e).__name__}: {e}"[:500]


def _with_floor(row: dict, fl: dict | None) -> dict:
    if fl is not None:
        row.update(floor_us=fl["us"], floor_bytes=fl["bytes"])
    return row


def bench_gemv(shape: Shape, impls, *, replays: int, l2: int, gen, floor_of=None) -> tuple[list[dict], list[dict]]:
    """Time every impl on one GEMV shape; `floor_of(nbytes)` gives the read floor the rows are stamped with."""
    rows, skipped = [], []
    N, K = shape.N, shape.K
    W = peers.weights(N, K, gen)
    x = torch.randn(1, K, generator=gen, device=gen.device).to(torch.bfloat16)
    fl = floor_of(gemv_floor_bytes(N, K)) if floor_of else None
    for impl in impls:
        where = {"model": shape.model, "layer": shape.layer, "N": N, "K": K, "impl": impl}
        calls = ref = None
        try:
            copies = timing.copies_for(gemv_bytes(impl, N, K) - 2 * (K + N), l2)
            t0 = time.time()
            calls, ref, wbytes, tol = peers.prep_gemv(impl, W, x, copies)
            if timing.copies_for(wbytes, l2) > copies:              # the layout stores less than guessed: rotate more
                copies = timing.copies_for(wbytes, l2)
                calls, ref, wbytes, tol = peers.prep_gemv(impl, W, x, copies)
            # GBps uses the bytes the prepared tensors really hold; the formula is recorded beside it
            nbytes = wbytes + 2 * (K + N)
            per_channel = (wbytes - N * K // 2) // N if impl == "w4a16_cutlass" else 2
            formula = gemv_bytes(impl, N, K, scale_itemsize=per_channel)
            err, setup_s, s = checked_timing(calls, ref, tol, replays, t0)
        except Exception as e:  # a peer or kernel crashing is a result to record, not a reason to stop the run
            skipped.append({**where, "reason": _reason(e)})
            continue
        finally:
            calls = ref = None
            torch.cuda.empty_cache()
        rows.append(_with_floor({"model": shape.model, "layer": shape.layer, "N": N, "K": K, "E": 1, "topk": 1,
                                 "rows": 1, "impl": impl, "us": s["us"], "GBps": nbytes / (s["us"] * 1e3),
                                 "bytes": nbytes, "bytes_formula": formula, "p10_us": s["p10_us"],
                                 "p90_us": s["p90_us"], "replays": s["replays"], "late": s["late"], "copies": copies,
                                 "rel_err": err, "setup_s": setup_s}, fl))
        print(f"  {shape.model:8s} {shape.layer:22s} {N:6d}x{K:<6d} {impl:14s} {s['us']:8.2f} us "
              f"{rows[-1]['GBps']:7.0f} GB/s  (x{copies} copies, err {err:.1e})", flush=True)
    return rows, skipped


def bench_moe(m: MoEModel, impl: str, rows: int, *, replays: int, l2: int, gen, seed: int = 0,
              floor_of=None) -> tuple[list[dict], list[dict]]:
    """Time one MoE layer implementation on `rows` tokens routed by `peers.routing(m, rows, seed)`."""
    where = {"model": m.name, "layer": "moe", "rows": rows, "impl": impl}
    inp = calls = ref = None
    try:
        inp = peers.moe_inputs(m, rows, gen, seed)
        active = peers.n_active(inp.ids)
        copies = timing.copies_for(active * expert_bytes(impl, m), l2)
        t0 = time.time()
        calls, ref, wbytes, tol = peers.prep_moe(impl, m, inp, copies)
        err, setup_s, s = checked_timing(calls, ref, tol, replays, t0)
        fl = floor_of(moe_floor_bytes(m, rows, active)) if floor_of else None
    except Exception as e:  # recorded, not swallowed: the receipt says what broke
        return [], [{**where, "reason": _reason(e)}]
    finally:
        inp = calls = ref = None
        torch.cuda.empty_cache()
    nbytes = moe_bytes(impl, m, rows, active)
    assert nbytes == wbytes + 4 * rows * m.hidden
    row = {"model": m.name, "layer": "moe", "N": m.intermediate, "K": m.hidden, "E": m.n_experts,
           "topk": m.top_k, "rows": rows, "impl": impl, "us": s["us"], "GBps": nbytes / (s["us"] * 1e3),
           "bytes": nbytes, "n_active": active, "p10_us": s["p10_us"], "p90_us": s["p90_us"],
           "replays": s["replays"], "late": s["late"], "copies": copies, "rel_err": err, "setup_s": setup_s}
    print(f"  {m.name:8s} moe R={rows:<3d} {impl:18s} {s['us']:8.2f} us {row['GBps']:7.0f} GB/s "
          f"(x{copies} copies, {active} experts, err {err:.1e})", flush=True)
    return [_with_floor(row, fl)], []


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


def schedule(quick: bool = False, only=None) -> list[Work]:
    """Measurements in priority order, so a run cut short by its time budget keeps the most important ones:
    the targets' GEMV shapes, then one-token MoE layers, then the remaining shapes, then more tokens."""
    only = set(only) if only else set(IMPLS)
    gemv = tuple(i for i in GEMV_IMPLS if i in only)
    shapes = by_priority(all_shapes(quick))
    n_first = sum((s.N, s.K) in TARGET_SHAPES for s in shapes)
    models = ["qwen3"] if quick else ["qwen3", "olmoe", "mixtral"]
    tokens = QUICK_TOKENS if quick else MOE_TOKENS
    one = [Work(model=m, impls=(i,), rows=1) for m in models for i in ONE_TOKEN_IMPLS if i in only]
    many = [Work(model=m, impls=(i,), rows=T) for T in tokens if T > 1 for m in models
            for i in MANY_TOKEN_IMPLS if i in only]
    dense = [Work(shape=s, impls=gemv) for s in shapes] if gemv else []
    return dense[:n_first] + one + dense[n_first:] + many


def run(*, quick: bool = False, only=None, replays: int | None = None, seed: int = 0,
        budget_s: float | None = None, checkpoint=None) -> dict:
    """Time the schedule on the current CUDA device; returns the receipt payload (without provenance).

    Every row gets the read floor of its int4-b32 bytes (`floor.read_floor`, measured once per byte count in
    this run). Work not started within `budget_s` seconds goes to `skipped` with that reason;
    `checkpoint(payload)`, if given, is called after every measurement (main uses it to keep a partial receipt
    on disk).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("lab.bench times kernels on a CUDA device; none is available here")
    only = set(only) if only else set(IMPLS)
    bad = only - set(IMPLS)
    if bad:
        raise ValueError(f"--only must name impls from {IMPLS}, got {sorted(bad)}")
    replays = replays or 20
    if replays < 20:
        raise ValueError(f"replays must be >= 20 (medians of at least 20 replays), got {replays}")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = _generator(seed)
    l2 = timing.l2_bytes()
    t0 = time.time()
    copy = timing.copy_bandwidth(replays=replays)
    print(f"device copy: {copy['GBps']:.0f} GB/s (read + write), L2 {l2 / 2**20:.0f} MiB", flush=True)
    payload = {"method": {"timing": "CUDA graph of one call per weight copy; a sample is back-to-back replays "
                                    "making >= min_calls calls, its time / calls, queued behind a GPU busy-wait of "
                                    "prefill_cycles, after warmup_ms of replays; median of `replays` samples",
                          "min_calls": timing.MIN_CALLS, "prefill_cycles": timing.PREFILL_CYCLES,
                          "warmup_ms": timing.WARMUP_MS,
                          "replays": replays,
                          "rotation": "copies until the bytes of one cycle exceed 4x L2",
                          "floor": "read-only Triton kernel over the row's int4-b32 bytes (MoE: unique routed "
                                   "experts), best of " + ", ".join(map(floor.label, floor.FLOOR_CONFIGS)) +
                                   ", same timer",
                          "l2_bytes": l2, "seed": seed, "quick": quick, "budget_s": budget_s,
                          "env": {k: v for k, v in os.environ.items() if k.startswith("INT4LAB_")},
                          "complete": False},
               "models": {k: asdict(v) for k, v in MODELS.items()},
               "copy": copy, "floor": [], "rows": [], "skipped": []}
    try:   # what one launch costs in a graph: the floor kernel over a single word (small rows' floors are mostly this)
        payload["launch"] = floor.read_floor(4, l2=l2, replays=replays, configs=floor.FLOOR_CONFIGS[:1])
        print(f"  one launch in a graph: {payload['launch']['us']:.2f} us", flush=True)
    except Exception as e:
        payload["skipped"].append({"what": "launch cost (read floor of 4 B)", "impl": "floor", "reason": _reason(e)})
    floors: dict[int, dict | None] = {}

    def floor_of(nbytes: int) -> dict | None:
        if nbytes not in floors:
            try:
                floors[nbytes] = floor.read_floor(nbytes, l2=l2, replays=replays)
                payload["floor"].append(floors[nbytes])
                print(f"  read floor {nbytes:>11d} B {floors[nbytes]['us']:8.2f} us ({floors[nbytes]['cfg']})",
                      flush=True)
            except Exception as e:  # a floor that cannot run leaves the rows without one, and says why
                floors[nbytes] = None
                payload["skipped"].append({"what": f"read floor {nbytes} B", "impl": "floor", "reason": _reason(e)})
        return floors[nbytes]

    for work in schedule(quick, only):
        if budget_s is not None and time.time() - t0 > budget_s:
            payload["skipped"] += [{"what": work.label(), "impl": i, "reason": f"time budget {budget_s:g} s spent"}
                                   for i in work.impls]
            continue
        if work.shape is not None:
            r, s = bench_gemv(work.shape, work.impls, replays=replays, l2=l2, gen=gen, floor_of=floor_of)
        else:
            r, s = bench_moe(MODELS[work.model], work.impls[0], work.rows, replays=replays, l2=l2, gen=gen,
                             seed=seed, floor_of=floor_of)
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


def dry_run(quick: bool = False, seed: int = 0) -> list[dict]:
    """Shapes and byte counts without timing (runs anywhere): one dict per (shape, impl) and per read floor.
    MoE rows use the run's routing (`peers.routing`, CPU-drawn), so their expert counts are the run's."""
    out = []
    for s in by_priority(all_shapes(quick)):
        base = {"model": s.model, "layer": s.layer, "N": s.N, "K": s.K, "rows": 1}
        out += [{**base, "impl": impl, "bytes": gemv_bytes(impl, s.N, s.K)} for impl in GEMV_IMPLS]
        out.append({**base, "impl": "floor", "bytes": gemv_floor_bytes(s.N, s.K)})
    for name in (["qwen3"] if quick else MODELS):
        m = MODELS[name]
        for T in QUICK_TOKENS if quick else MOE_TOKENS:
            active = peers.n_active(peers.routing(m, T, seed)[0])
            base = {"model": m.name, "layer": "moe", "N": m.intermediate, "K": m.hidden, "rows": T,
                    "n_active": active}
            out += [{**base, "impl": impl, "bytes": moe_bytes(impl, m, T, active)}
                    for impl in (ONE_TOKEN_IMPLS if T == 1 else MANY_TOKEN_IMPLS)]
            out.append({**base, "impl": "floor", "bytes": moe_floor_bytes(m, T, active)})
    return out
