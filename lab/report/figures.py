"""Chapter 05's figures from a decode receipt (matplotlib imported only here)."""
from __future__ import annotations

from lab.bench.shapes import MODELS
from .decode import _floor, _row, gemv_shapes, moe_series


# ---- figures (matplotlib imported only here) ------------------------------------------------------------
GEMV_COLORS = {"int4_b32": "tab:red", "w4a16_cutlass": "tab:orange", "bf16": "tab:gray", "tinygemm": "tab:blue",
               "gemlite": "tab:green", "marlin": "tab:cyan", "llamacpp_q4_0": "tab:olive", "llamacpp_q4_0_rot": "tab:pink",
               "llamacpp_q4_K": "darkgoldenrod", "llamacpp_q4_K_rot": "mediumvioletred"}
MOE_COLORS = {"int4_b32_moe": "tab:red", "int4_b32_grouped": "tab:purple", "bf16_loop": "tab:gray",
              "grouped_mm": "tab:brown"}


GEMV_LABELS = {"int4_b32": "int4_b32 (ours, W4A8, plan table)",
               "w4a16_cutlass": "w4a16_cutlass (ours, W4A16, untuned)",
               "bf16": "bf16 cuBLAS (16-bit weights)",
               "tinygemm": "tinygemm (torch, W4A16)",
               "gemlite": "GemLite (W4A16)",
               "marlin": "Marlin (W4A16 g128, patched build)",
               "llamacpp_q4_0": "llama.cpp Q4_0 (eager, host clock)",
               "llamacpp_q4_0_rot": "llama.cpp Q4_0 (rotated, host clock)",
               "llamacpp_q4_K": "llama.cpp Q4_K (eager, host clock)",
               "llamacpp_q4_K_rot": "llama.cpp Q4_K (rotated, host clock)"}


def floor_fixed_share(rec) -> dict[int, float]:
    """{bytes: share} per read floor of the receipt: the part of the floor's time that streaming its bytes at the
    fastest floor's rate does not explain, 1 - (bytes / fastest bytes-per-µs) / µs ("fixed" for short: what that part
    consists of was not measured, and at small sizes it depends on the read kernel's launch shape, so it is not shown
    to be a cost every kernel pays). Near 1 the floor is a measured kernel, not a bandwidth bound."""
    floors = rec.get("floor") or []
    if not floors:
        return {}
    rate = max(f["bytes"] / f["us"] for f in floors)
    return {f["bytes"]: 1.0 - (f["bytes"] / rate) / f["us"] for f in floors}


def plot_time_over_floor(rec, ax=None, fixed_share: float = 0.5):
    """Time per call over the read floor of int4-b32's bytes, per GEMV shape (x) and every implementation timed on it
    (markers, GEMV_COLORS' order first); the line at 1 is that floor, which belongs to int4-b32's bytes only (bf16
    moves 16/4.5 as many bytes). Shapes whose floor is more than `fixed_share` not explained by streaming
    (`floor_fixed_share`) are shaded: there the floor is a measured kernel, not a bound. Shapes without a floor are left
    out."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(12, 4.5))[1]
    shapes = []
    for model, layer, N, K in gemv_shapes(rec):
        fl = _row(rec, "int4_b32", model=model, layer=layer, N=N, K=K)
        if fl and "floor_us" in fl:
            shapes.append((model, layer, N, K, fl))
    share = floor_fixed_share(rec)
    timed = {r["impl"] for r in rec["rows"] if r["layer"] != "moe"}
    impls = [i for i in GEMV_COLORS if i in timed] + sorted(timed - set(GEMV_COLORS))    # every GEMV row's impl
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for i, (model, layer, N, K, fl) in enumerate(shapes):
            r = _row(rec, impl, model=model, layer=layer, N=N, K=K)
            if r:
                xs.append(i + (j - (len(impls) - 1) / 2) * width)
                ys.append(r["us"] / fl["floor_us"])
        ax.plot(xs, ys, "o", ms=5, label=GEMV_LABELS.get(impl, impl), color=GEMV_COLORS.get(impl))
    shaded = False
    for i, (model, layer, N, K, fl) in enumerate(shapes):
        if share.get(fl["floor_bytes"], 0.0) > fixed_share:
            ax.axvspan(i - 0.5, i + 0.5, color="0.9", zorder=0,
                       label=None if shaded else f"floor > {fixed_share:.0%} not streaming: a measured kernel, not a bound")
            shaded = True
    ax.axhline(1.0, color="k", lw=1.2, label="read floor of int4-b32's bytes (= 1)")
    ax.set_yscale("log")
    ax.set_xlim(-0.5, len(shapes) - 0.5)
    ax.set_xticks(range(len(shapes)), [f"{m} {l}\n{N}×{K}" for m, l, N, K, _ in shapes], rotation=60, ha="right",
                  fontsize=8)
    ax.set_ylabel("µs per call / read floor of int4-b32 bytes")
    top = max([1.0] + [float(y) for line in ax.lines for y in line.get_ydata()])
    ticks = [t for t in (1, 1.25, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32) if t <= top * 1.2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_title(f"Batch-1 GEMV on {rec['provenance'].get('device')}: time over the int4-b32 read floor")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def plot_moe(rec, rows: int = 1, ax=None):
    """µs per MoE layer call (gate_up, SwiGLU, down, combine) for `rows` tokens, per model and implementation,
    with the read floor of the routed int4-b32 bytes as a dashed tick (where the receipt has one)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    moe = [r for r in rec["rows"] if r["layer"] == "moe" and r["rows"] == rows]
    models = [m for m in MODELS if any(r["model"] == m for r in moe)]
    impls = [i for i in MOE_COLORS if any(r["impl"] == i for r in moe)]
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        pts = [(i + (j - (len(impls) - 1) / 2) * width, r["us"]) for i, m in enumerate(models)
               for r in moe if r["model"] == m and r["impl"] == impl]
        if pts:
            ax.bar(*zip(*pts), width, label=impl, color=MOE_COLORS[impl])
    for i, m in enumerate(models):
        fl = _floor([r for r in moe if r["model"] == m])
        if fl is not None:
            ax.plot([i - 0.45, i + 0.45], [fl] * 2, "k--", lw=1)
    ax.set_xticks(range(len(models)), models)
    ax.set_yscale("log")
    ax.set_ylabel("µs per layer call (log)")
    ax.set_title(f"MoE layer, {rows} token(s); dashed: read floor of the routed int4 bytes", fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    return ax


def plot_moe_tokens(rec, model: str, ax=None):
    """µs per MoE layer call versus tokens (log-log) for every implementation the receipt timed on `model`,
    with the read floor of the unique routed experts' int4-b32 bytes as a black dashed line."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(5, 4))[1]
    series = moe_series(rec, model)
    for impl, color in MOE_COLORS.items():
        if impl in series:
            ax.plot(list(series[impl]), list(series[impl].values()), "o-", color=color, label=impl, ms=4)
    if "floor" in series:
        ax.plot(list(series["floor"]), list(series["floor"].values()), "k--", label="read floor (unique experts)")
    ax.set_xscale("log", base=2)
    tokens = sorted({T for s in series.values() for T in s})
    ax.set_xticks(tokens, [str(T) for T in tokens])
    ax.set_yscale("log")
    ax.set_xlabel("tokens per step")
    ax.set_ylabel("µs per layer call (log)")
    ax.set_title(model)
    ax.legend(fontsize=7)
    return ax


