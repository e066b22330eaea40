"""Every implementation beside its OWN read floor: how close each peer comes to what its bytes allow.

A row's own floor is the read-floor curve of the same run at the row's bytes (`bytes`: its weights, scales and
activations): the floor kernel (lab/bench/floor.py) was timed at every int4-b32 byte count of the run (and at one
word: the launch); between two measured counts the curve is linear (below the smallest int4-b32 count, toward
the one-word point), above the largest it keeps the largest's rate. So a bf16 row is judged against reading 2 bytes
per weight, Marlin against 0.52, Q4_K against 0.56. A ratio near 1 means that peer takes about as long as the run's
read-only kernel over its bytes: close to the read bandwidth where that floor is mostly streaming; where it is mostly
not explained by streaming (small byte counts), only about as long as that read kernel, whose launch shape there (16 KB
per program, lab/bench/floor.py) was not shown to be the fastest: no bound. The format's size is the rest of the story.

    python -m lab.bench.peer_table data/receipts/decode_h100.json      # print both tables

Shape legend: N = out features, K = in features; MoE rows carry N = I (expert width), K = H (hidden).
"""
from __future__ import annotations

import bisect
import sys

from lab.bench.ggml_peer import GATE_UP_LAUNCHES
from lab.bench.schema import OURS_MOE

# The rotated llama.cpp columns and the ‡ legend repeat ggml_peer's fixed timer label (rotation, ggml's CUDA graphs),
# not a record of the run: the receipt does not say whether ggml's CUDA graphs were on. RESULTS.md and chapter 05
# print these tables through lab/report/targets.py's `peer_labels`, which names those columns and that legend by
# what the receipt records.
GEMV_COLUMNS = (("int4_b32", "int4_b32 (ours)"), ("marlin", "Marlin W4A16 g128"),
                ("llamacpp_q4_0", "llama.cpp CUDA Q4_0 (test-backend-ops, eager)†"),
                ("llamacpp_q4_K", "llama.cpp CUDA Q4_K (test-backend-ops, eager)†"),
                ("llamacpp_q4_0_rot", "llama.cpp CUDA Q4_0 (rotated, CUDA graph)‡"),
                ("llamacpp_q4_K_rot", "llama.cpp CUDA Q4_K (rotated, CUDA graph)‡"),
                ("tinygemm", "tinygemm int4 g32"), ("gemlite", "GemLite A16W4 g32"),
                ("w4a16_cutlass", "w4a16_cutlass (ours, per-channel)"), ("bf16", "bf16 cuBLAS"))
MOE_COLUMNS = (("llamacpp_q4_0_moe", "llama.cpp CUDA Q4_0 (test-backend-ops, eager)†"),
               ("llamacpp_q4_K_moe", "llama.cpp CUDA Q4_K (test-backend-ops, eager)†"),
               ("llamacpp_q4_0_rot_moe", "llama.cpp CUDA Q4_0 (rotated, CUDA graph)‡"),
               ("llamacpp_q4_K_rot_moe", "llama.cpp CUDA Q4_K (rotated, CUDA graph)‡"),
               ("bf16_loop", "bf16 loop"), ("grouped_mm", "grouped_mm (bf16)"))
DAGGER = ("† ggml's own timer (test-backend-ops perf): an eager stream over the same weights, no rotation, so a "
          "shape whose weights fit in L2 may be read partly from cache. ‡ ggml's library in a harness that fills its "
          "own weight copies (not the bench's weights) and rotates them past 4× L2 (given the bench's L2 figure), with "
          "ggml's CUDA graphs, median of 20 samples of ≥ 16 calls. Both are host wall clock, so they may hold "
          "host-side cost that the other rows' CUDA-event timing excludes{pct}. Both: "
          "activations f32 (quantised to int8 blocks inside each call, as llama.cpp does); MoE: gate_up + down, "
          "where gate_up is twice one timed [I, H] MUL_MAT_ID (gate and up are separate expert tensors in "
          "llama.cpp; one of them was timed) and down is one timed [H, I] MUL_MAT_ID (no SwiGLU or combine).")


def floor_curve(rec) -> list[tuple[int, float]]:
    """(bytes, µs) points of the run's read floors, sorted by bytes (the one-word launch included)."""
    pts = {f["bytes"]: f["us"] for f in rec.get("floor") or []}
    if "launch" in rec:
        pts.setdefault(rec["launch"]["bytes"], rec["launch"]["us"])
    return sorted(pts.items())


def floor_at(curve, nbytes: int) -> float | None:
    """The read floor at `nbytes` on `curve`: linear between measured points, the largest point's rate above it,
    the smallest point's time below it; None without points."""
    if not curve:
        return None
    xs = [b for b, _ in curve]
    i = bisect.bisect_left(xs, nbytes)
    if i < len(xs) and xs[i] == nbytes:
        return curve[i][1]
    if i == 0:
        return curve[0][1]
    if i == len(xs):
        b, us = curve[-1]
        return us * nbytes / b
    (b0, u0), (b1, u1) = curve[i - 1], curve[i]
    return u0 + (u1 - u0) * (nbytes - b0) / (b1 - b0)


def own_floor(rec, row: dict, curve=None) -> float | None:
    """The row's own read floor: the run's curve at its bytes; without a curve, the row's int4-b32 floor scaled
    by bytes (None when the row has neither)."""
    if "bytes" not in row:
        return None
    curve = floor_curve(rec) if curve is None else curve
    if curve:
        return floor_at(curve, row["bytes"])
    if "floor_us" in row:
        return row["floor_us"] * row["bytes"] / row["floor_bytes"]
    return None


def cell(rec, row, curve=None) -> str:
    """'µs (× own floor)' for one row, '–' for none."""
    if row is None:
        return "–"
    fl = own_floor(rec, row, curve)
    return f"{row['us']:.1f}" + ("" if fl is None else f" ({row['us'] / fl:.2f}×)")


def _line(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _pick(rec, impl, **where):
    return next((r for r in rec["rows"] if r["impl"] == impl and all(r.get(k) == v for k, v in where.items())), None)


def gemv_table(rec) -> str:
    """Per GEMV shape: the int4-b32 read floor and each timed implementation's 'µs (× its own floor)'."""
    curve = floor_curve(rec)
    impls = {r["impl"] for r in rec["rows"]}
    cols = [(i, name) for i, name in GEMV_COLUMNS if i in impls]
    head = ["model", "layer", "N×K", "int4-b32 read floor"] + [name for _, name in cols]
    lines = [_line(head), "|" + "---|" * len(head)]
    seen = []
    for r in rec["rows"]:
        key = (r["model"], r["layer"], r["N"], r["K"])
        if r["layer"] == "moe" or key in seen:
            continue
        seen.append(key)
        w = dict(zip(("model", "layer", "N", "K"), key))
        fl = next((x["floor_us"] for x in rec["rows"] if "floor_us" in x and all(x[k] == v for k, v in w.items())),
                  None)
        lines.append(_line([key[0], key[1], f"{key[2]}×{key[3]}", "–" if fl is None else f"{fl:.1f}"]
                           + [cell(rec, _pick(rec, i, **w), curve) for i, _ in cols]))
    return "\n".join(lines)


def bf16_floor_us(rec, model: str, rows: int, curve=None) -> float | None:
    """The read floor of the MoE layer's bf16 bytes (its routed experts at 2 bytes a weight, as the receipt's
    bf16 rows count them): what any bf16 MoE could at best reach on this card in this run."""
    row = _pick(rec, "bf16_loop", model=model, layer="moe", rows=rows) or \
        _pick(rec, "grouped_mm", model=model, layer="moe", rows=rows)
    return None if row is None else own_floor(rec, row, curve)


def moe_table(rec) -> str:
    """Per (model, tokens): experts read, the int4-b32 and bf16 read floors, our best and each peer's
    'µs (× its own floor)'."""
    curve = floor_curve(rec)
    impls = {r["impl"] for r in rec["rows"]}
    cols = [(i, name) for i, name in MOE_COLUMNS if i in impls]
    head = ["model", "tokens", "experts read", "int4-b32 read floor", "bf16 at its read floor", "best int4-b32 (ours)"] \
        + [name for _, name in cols]
    lines = [_line(head), "|" + "---|" * len(head)]
    keys = []
    for r in rec["rows"]:
        if r["layer"] == "moe" and (r["model"], r["rows"]) not in keys:
            keys.append((r["model"], r["rows"]))
    models = [m for m, _ in keys]
    for model, R in sorted(keys, key=lambda k: (models.index(k[0]), k[1])):
        w = {"model": model, "layer": "moe", "rows": R}
        ours = [r for i in OURS_MOE if (r := _pick(rec, i, **w)) is not None]
        best = min(ours, key=lambda r: r["us"]) if ours else None
        ref = best or next((r for r in rec["rows"] if all(r.get(k) == v for k, v in w.items())), None)
        fl, bf = ref.get("floor_us") if ref else None, bf16_floor_us(rec, model, R, curve)
        lines.append(_line([model, R, ref.get("n_active", "–") if ref else "–", "–" if fl is None else f"{fl:.1f}",
                            "–" if bf is None else f"{bf:.1f}", cell(rec, best, curve)]
                           + [cell(rec, _pick(rec, i, **w), curve) for i, _ in cols]))
    return "\n".join(lines)


def overlap(a: dict, b: dict) -> bool:
    """True when two rows' p10-p90 spans touch (a row without percentiles, ggml's eager rows and MoE sums, is the
    point at its median, so for it only the other row's span is checked): a difference inside them is not a lead
    this run can vouch for."""
    lo_a, hi_a = a.get("p10_us", a["us"]), a.get("p90_us", a["us"])
    lo_b, hi_b = b.get("p10_us", b["us"]), b.get("p90_us", b["us"])
    return lo_a <= hi_b and lo_b <= hi_a


# Our rows and the torch/Marlin peers are timed by CUDA events around graph replays (lab/bench/timing.py); ggml's
# rows (llamacpp_*) by host wall clock around many calls, so their time may hold host-side cost ours excludes. An
# ASSUMPTION, not a measurement: ggml's host cost per call is under HOST_TIMER_MIN_US, so on an op whose time is at
# least that the host runs ahead of the GPU and only a share of the final synchronize stays in the time; a ratio
# within HOST_MARGIN of 1 is still not decided (that share and the ggml rows' run-to-run spread are unmeasured; the
# rotated rows' p10/p90 is one run's sample spread, the eager rows and MoE sums record none).
HOST_TIMED = "llamacpp"
HOST_TIMER_MIN_US = 10.0
HOST_MARGIN = 0.05


def host_timed(row: dict) -> bool:
    """True for a row timed by host wall clock (ggml's harnesses), not by CUDA events like ours."""
    return row["impl"].startswith(HOST_TIMED)


def timed_ops_us(row: dict) -> list[float]:
    """The µs of each op that was timed on its own behind a row: a MoE row's `parts_us`, its gate_up divided back
    into the one [I, H] op timed (ggml_peer counts it GATE_UP_LAUNCHES times, for gate and up), else the row."""
    parts = row.get("parts_us") or {}
    if not parts:
        return [row["us"]]
    return [us / GATE_UP_LAUNCHES if name == "gate_up" else us for name, us in parts.items()]


def decided(ours: dict, peer: dict) -> bool:
    """Whether this receipt decides which of two rows is faster: their p10-p90 spans do not touch (`overlap`), and for
    a host-timed peer every separately timed op (`timed_ops_us`) takes ≥ HOST_TIMER_MIN_US and the ratio is off 1 by
    more than HOST_MARGIN (the timers differ: see HOST_TIMER_MIN_US)."""
    if overlap(ours, peer):
        return False
    if not host_timed(peer):
        return True
    return min(timed_ops_us(peer)) >= HOST_TIMER_MIN_US and abs(peer["us"] / ours["us"] - 1) > HOST_MARGIN


def _lead(rec, ours: dict, peers: list[dict], bf16: dict | None, curve) -> dict:
    """Ours against every peer row: `vs` {impl: peer µs / ours µs} (> 1: ours faster), `own` {impl: µs / its own
    floor} (ours included), the strongest (fastest) peer, `lead` = its µs / ours, `inside` = the two rows' p10-p90
    spans overlap (`overlap`), `undecided` = the peers whose comparison with ours this receipt does not decide
    (`decided`), `same_timer` / `same_lead` = the fastest peer timed by CUDA events like ours and its µs / ours, and
    `over_bf16_floor` = bf16's own read floor / ours (None without a bf16 row)."""
    best = min(peers, key=lambda r: r["us"])
    same = min((r for r in peers if not host_timed(r)), key=lambda r: r["us"], default=None)
    own = {r["impl"]: r["us"] / fl for r in [ours] + peers if (fl := own_floor(rec, r, curve))}
    bf = own_floor(rec, bf16, curve) if bf16 else None
    return {"ours": ours, "vs": {r["impl"]: r["us"] / ours["us"] for r in peers}, "own": own,
            "strongest": best["impl"], "lead": best["us"] / ours["us"], "inside": overlap(ours, best),
            "undecided": sorted(r["impl"] for r in peers if not decided(ours, r)),
            "same_timer": same and same["impl"], "same_lead": same and same["us"] / ours["us"],
            "over_bf16_floor": None if bf is None else bf / ours["us"]}


def gemv_leads(rec) -> list[dict]:
    """Per batch-1 GEMV shape with an int4_b32 row: (model, layer, N, K) and `_lead` against every other row of
    that shape (bf16's own floor: the bf16 cuBLAS row's bytes on this run's curve)."""
    curve, out = floor_curve(rec), []
    for r in rec["rows"]:
        if r["impl"] != "int4_b32" or r["layer"] == "moe":
            continue
        w = {k: r[k] for k in ("model", "layer", "N", "K")}
        peers = [x for x in rec["rows"] if x is not r and x["layer"] != "moe" and all(x[k] == v for k, v in w.items())]
        if peers:
            out.append({**w, **_lead(rec, r, peers, _pick(rec, "bf16", **w), curve)})
    return out


def moe_leads(rec, rows: int = 1) -> list[dict]:
    """Per model, the MoE layer at `rows` tokens: our faster path against every peer row (the bf16 loop,
    grouped_mm, llama.cpp's MUL_MAT_ID sums), with bf16's own floor = `bf16_floor_us`."""
    curve, out = floor_curve(rec), []
    for model in dict.fromkeys(r["model"] for r in rec["rows"] if r["layer"] == "moe" and r["rows"] == rows):
        here = [r for r in rec["rows"] if r["layer"] == "moe" and r["model"] == model and r["rows"] == rows]
        ours = [r for r in here if r["impl"] in OURS_MOE]
        peers = [r for r in here if r["impl"] not in OURS_MOE]
        if ours and peers:
            lead = _lead(rec, min(ours, key=lambda r: r["us"]), peers, None, curve)
            bf = bf16_floor_us(rec, model, rows, curve)
            lead["over_bf16_floor"] = None if bf is None else bf / lead["ours"]["us"]
            out.append({"model": model, "rows": rows, **lead})
    return out


def render(rec) -> str:
    """Both tables with their legend (a markdown block for RESULTS.md)."""
    note = ("Each cell: µs per call and, in brackets, that time over the implementation's OWN read floor: the "
            "read-only kernel's time curve of this run at the bytes that implementation moves (weights, scales, "
            "activations; the floor was timed at the run's int4-b32 byte counts and over one word (the receipt's "
            "`launch` row, 4 bytes); linear between those points, so below the smallest int4-b32 count it runs "
            "toward the one-word point, and at the largest count's rate above it).")
    parts = ["**Peers at their own read floors: batch-1 GEMV, µs**\n\n" + note + "\n\n" + gemv_table(rec),
             "**Peers at their own read floors: MoE layer, µs** (bf16 at its read floor: the routed experts' bf16 "
             "bytes at this run's read-floor curve)\n\n" + moe_table(rec)]
    if any(r["impl"].startswith("llamacpp") for r in rec["rows"]):
        src = (rec.get("llamacpp") or {}).get("source", "")
        spread = any("p10_us" in r for r in rec["rows"] if r["impl"].startswith("llamacpp"))
        pct = ("; they record percentiles only where the rotating harness printed them" if spread else
               "; this receipt's llama.cpp rows record no percentiles")
        parts.append(DAGGER.format(pct=pct) + (f" Source: {src}." if src else ""))
    return "\n\n".join(parts)


if __name__ == "__main__":
    import json
    if len(sys.argv) != 2:
        sys.exit("usage: python -m lab.bench.peer_table RECEIPT.json")
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))
