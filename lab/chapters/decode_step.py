"""Chapter 07: what int4 buys in a decode step. Reads the decode-step receipt (lab.decode_step) and shapes it for
the chapter: which receipt, per-layer tables, the stacked bars against the floor, the eager ratios (the
targets are in decode_targets.py).

A receipt data/receipts/decode_step_<card>.json (measured on a GPU) is read when present; without one the chapter
runs the benchmark itself on the CPU at tiny width into a temporary folder (a stand-in: no graphs, no floors, no
breakdown; every number then describes the CPU and the tiny models, and the chapter says so).
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from lab.paths import RECEIPTS

ARCH_LABEL = {"olmoe": "OLMoE-1B-7B", "qwen3_moe": "Qwen3-30B-A3B", "mixtral": "Mixtral-8x7B"}
ORDER = ("olmoe", "qwen3_moe", "mixtral")
# "unattributed": kernels the profile could not map to a module by name (on int4: the Triton GEMVs, norm, router)
SEGMENTS = ("attn_proj", "experts", "router", "attention", "norm", "glue", "unattributed", "gaps")
# (state, run, experts impl or None for "the best"): the bars of one model, left to right
BARS = (("int4", "eager"), ("int4", "graphed"), ("int4_fused", "graphed"), ("int4_fused2", "eager"),
        ("int4_fused2", "graphed"), ("int4_fused2", "compiled"), ("bf16", "eager"), ("bf16", "graphed"),
        ("bf16", "compiled"))


def load(quick: bool) -> tuple[dict, Path, bool]:
    """(receipt, its path, stand-in?): the GPU receipt in data/receipts/ when there is one, else a CPU run at tiny width."""
    found = sorted(RECEIPTS.glob("decode_step_*.json"))
    if found:
        rec = json.loads(found[0].read_text())
        if rec.get("complete") is False:
            raise ValueError(f"{found[0]} holds a run that did not finish ({rec.get('interrupted', 'no reason')}): "
                             f"rerun python -m lab.decode_step, or move the receipt out of data/receipts/")
        return rec, found[0], False
    from lab.decode_step import cli
    out = Path(tempfile.mkdtemp(prefix="decode_step_")) / "decode_step_cpu.json"
    # eager runs only (a CPU has no graphs); four layers against one, so the slope is several layers of CPU time
    args = ["--width", "tiny", "--layers", "1", "4", "--contexts", "64", "--batches", "1", "2", "--runs", "eager",
            "--impls", "batched_mm", "grouped_mm", "--prompt", "4", "--greedy-steps", "3" if quick else "8",
            "--eager-steps", "4", "--eager-warmup", "1", "--eager-samples", "3", "--out", str(out)]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        rc = cli.main(args)
    if rc != 0:
        raise RuntimeError(f"the CPU stand-in run of lab.decode_step failed:\n{log.getvalue()[-3000:]}")
    return json.loads(out.read_text()), out, True


def first_case(arch_rec: dict) -> tuple[int, int]:
    rows = arch_rec["rows"]
    b = min(r["batch"] for r in rows)
    c = min(r["context"] for r in rows if r["batch"] == b)
    return b, c


def best_row(arch_rec: dict, state: str, run: str, batch: int, context: int):
    """The fastest row (smallest per layer) of (state, run, batch, context) over the experts implementations. An
    eager row whose slope's sample range reaches zero (`slope_range`), or whose two-depth line fails (`line_fails`),
    is no candidate while another's is decided, nor is one whose slope lies wholly below its own graphed layer
    (`below_graphed`): such a slope, even a negative one, cannot show an implementation faster. None where the
    receipt has no row."""
    rows = [r for r in arch_rec["rows"] if (r["state"], r["run"], r["batch"], r["context"]) == (state, run, batch, context)
            and "per_layer_us" in r]
    if run == "eager":
        rows = [r for r in rows if r.get("samples_us") and slope_range(r)[0] > 0 and not line_fails(r)
                and below_graphed(arch_rec, r) is None] or rows
    return min(rows, key=lambda r: r["per_layer_us"]) if rows else None


def layer_table(rec: dict) -> list[dict]:
    """One row per (arch, state, run) at batch 1 of the first context: per layer, fixed, tokens/s at full depth."""
    out = []
    for arch in [a for a in ORDER if a in rec["archs"]]:
        a = rec["archs"][arch]
        if not a.get("rows"):
            continue
        b, c = first_case(a)
        for state, run in BARS:
            r = best_row(a, state, run, b, c)
            if r:
                out.append({"arch": arch, "state": state, "run": run, "impl": r["impl"], "batch": b, "context": c,
                            "per_layer_us": r["per_layer_us"], "fixed_us": r["fixed_us"],
                            "tokens_per_s": r["tokens_per_s"], "formula": r["formula"], "row": r})
    return out


def breakdown(arch_rec: dict, state: str) -> dict | None:
    """The per-layer breakdown (us per category) of `state`'s graphed step, when the receipt holds one."""
    for bd in arch_rec.get("breakdown", []):
        if bd["state"] == state and "per_layer_us" in bd:
            return bd["per_layer_us"]
    return None


def our_kernels(arch_rec: dict, state: str) -> dict | None:
    """Per layer (the eager profile at 2 layers minus 1 layer), each kernel the profile left "unattributed" (our
    Triton launches: the profiler records no CPU launch for them), by name, with the module its device-side range
    shows: the range record that follows it directly, else the last one before it. {"name @ module": [count, us]}."""
    bd = next((x for x in arch_rec.get("breakdown", []) if x["state"] == state and "per_layer_us" in x), None)
    if bd is None:
        return None
    per = {}
    for depth, sign in (("2", 1), ("1", -1)):
        ks, last = bd["depths"][depth]["eager_kernels"], "?"
        for i, (name, cat, us) in enumerate(ks):
            if name.startswith("cat:"):
                last = name[4:]
                continue
            if cat != "unattributed":
                continue
            nxt = ks[i + 1][0] if i + 1 < len(ks) else ""
            key = f"{name} @ {nxt[4:] if nxt.startswith('cat:') else last}"
            cnt_us = per.setdefault(key, [0, 0.0])
            cnt_us[0] += sign
            cnt_us[1] += sign * us
    return {k: v for k, v in per.items() if v[0]}      # a count of 0: the fixed part's kernel, moved by noise


def plot_bars(rec: dict, axes) -> None:
    """Per model: a bar per (state, run), stacked by breakdown category where the receipt has one (graphed
    steps), one block otherwise; the floor of each state's bytes as a dashed line. One legend for all panels goes
    below them (inside an axis it covered the tall bars' values): save with bbox_inches="tight"."""
    import matplotlib.pyplot as plt
    colours = dict(zip(SEGMENTS + ("step",), plt.cm.tab10.colors))
    archs = [a for a in ORDER if a in rec["archs"] and rec["archs"][a].get("rows")]
    for ax, arch in zip(axes, archs):
        a = rec["archs"][arch]
        b, c = first_case(a)
        labels, tops = [], []
        for i, (state, run) in enumerate(BARS):
            r = best_row(a, state, run, b, c)
            if r is None:
                continue
            if not decided(r) or below_graphed(a, r) is not None:      # an eager slope or fixed part its samples
                # cannot tell from zero (or below it), or a slope below its own graphed layer: not one layer's cost
                labels.append((i, f"{state.replace('int4_', '')}\n{run}\n(undecided)"))
                continue
            labels.append((i, f"{state.replace('int4_', '')}\n{run}"))
            bd = breakdown(a, state) if run == "graphed" else None
            if bd:
                ours = our_kernels(a, state) or {}
                segs = [(k, v[1]) for k, v in ours.items()] + [
                    (seg, bd.get(seg, 0.0) - (sum(v[1] for v in ours.values()) if seg == "unattributed" else 0.0))
                    for seg in SEGMENTS]
                bottom = 0.0
                for seg, v in segs:
                    v = max(0.0, v)
                    if v > 0.5:
                        if seg not in colours:            # our kernels: a palette apart from the categories'
                            colours[seg] = plt.cm.Dark2.colors[sum(k not in SEGMENTS + ("step",) for k in colours) % 8]
                        ax.bar(i, v, bottom=bottom, color=colours[seg],
                               label=seg if seg not in ax.get_legend_handles_labels()[1] else None)
                    bottom += v
                ax.plot([i - 0.4, i + 0.4], [r["per_layer_us"]] * 2, color="k", lw=1.5,
                        label="per layer, step(2) − step(1)" if "per layer, step(2) − step(1)" not in
                        ax.get_legend_handles_labels()[1] else None)
            else:
                ax.bar(i, r["per_layer_us"], color=colours["step"], alpha=0.5, label="step (no breakdown)" if not
                       any(lbl == "step (no breakdown)" for lbl in ax.get_legend_handles_labels()[1]) else None)
            tops.append((i, run, r["per_layer_us"]))
        floors = []
        for state, style in (("int4", "--"), ("bf16", ":")):
            fl = a.get("floors", {}).get(f"{state} B{b} C{c}", {})
            if fl.get("us"):
                floors.append(fl["us"])
                ax.axhline(fl["us"], color="k", ls=style, lw=1, label=f"{state} read floor")
        # at batch 1 eager steps are host-bound and several times taller: the axis fits the graphed and compiled bars, and an
        # eager bar past it carries its value
        top = 1.3 * max([v for _, run, v in tops if run != "eager"] + floors + [1e-9])
        if any(v > top for _, _, v in tops):
            ax.set_ylim(0, top)
            for i, _, v in tops:
                if v > top:
                    ax.text(i, 0.97 * top, f"{v:,.0f} µs", ha="center", va="top", fontsize=7, rotation=90)
        ax.set_xticks([i for i, _ in labels], [t for _, t in labels], fontsize=7)
        ax.set_title(f"{ARCH_LABEL[arch]}  (batch {b}, context {c})", fontsize=9)
        ax.set_ylabel("µs per layer")
    hs = {lbl: h for ax in axes[::-1] for h, lbl in zip(*ax.get_legend_handles_labels())}  # one legend, below
    axes[0].figure.legend(hs.values(), hs.keys(), loc="upper center", bbox_to_anchor=(0.5, 0), ncol=6, fontsize=7)


def case_table(arch_rec: dict) -> list[dict]:
    """Per (batch, context): the summary's graphed-over-floor and int4-over-the-best-bf16 ratios. The summary's eager
    fields are left out: `bf16_eager_*` is the eager bf16 row with the smallest extrapolated step and
    `*_eager_over_best_bf16_eager` divides by the lowest eager bf16 per layer, neither checking that the slope's
    sample range lies above zero (a negative or near-zero bf16 layer, and ratios from it); `*_eager_over_default_*`
    divides by the default experts implementation's. `eager_ratio` gives the eager ratios with the range their
    samples allow, its fastest eager bf16 among slopes whose range lies above zero. The best bf16 is graphed or
    compiled where the receipt compiled bf16 (batch 1, first context), graphed only elsewhere."""
    out = []
    for key, s in arch_rec.get("summary", {}).items():
        out.append({"case": key, **{k: v for k, v in s.items() if not isinstance(v, dict) and "eager" not in k},
                    "best_bf16": s.get("best_bf16", {}).get("impl")})
    return out


def _row(a: dict, state, impl, run, b, c):
    return next((r for r in a["rows"] if (r["state"], r["impl"], r["run"], r["batch"], r["context"]) ==
                 (state, impl, run, b, c) and "per_layer_us" in r), None)


def spread(row) -> float:
    """A row's per-layer uncertainty relative to its per-layer time: (range of the 2-layer step's samples + range of
    the 1-layer step's) / per layer. per layer = step(2) - step(1) moves by at most that much within the samples."""
    if not row or not row.get("samples_us"):
        return float("inf")
    return sum(max(v) - min(v) for v in row["samples_us"].values()) / abs(row["per_layer_us"])


def _depths(row) -> tuple[int, int, list, list]:
    lo, hi = sorted(row["samples_us"], key=int)[0], sorted(row["samples_us"], key=int)[-1]
    return int(lo), int(hi), row["samples_us"][lo], row["samples_us"][hi]


def slope_range(row) -> tuple[float, float]:
    """(lowest, highest) per layer the samples allow: (min step(hi) - max step(lo)) / (hi - lo) to
    (max step(hi) - min step(lo)) / (hi - lo), hi and lo the two depths (2 and 1 on a GPU receipt)."""
    lo, hi, s1, s2 = _depths(row)
    return (min(s2) - max(s1)) / (hi - lo), (max(s2) - min(s1)) / (hi - lo)


def step_range(row) -> tuple[float, float]:
    """(lowest, highest) step at the published depth L the samples allow: step(lo) + (L - lo) x per layer, with
    step(lo) and per layer taken at opposite ends of their samples (the pairing `slope_range` uses): the range of the
    extrapolated step itself, not the per-layer spread (`spread`), which the step's fixed part, carrying no per-layer spread, narrows."""
    lo, hi, s1, s2 = _depths(row)
    k = (row["full_layers"] - lo) / (hi - lo)       # step(L) = (1 - k) step(lo) + k step(hi), k >= 1
    return (1 - k) * max(s1) + k * min(s2), (1 - k) * min(s1) + k * max(s2)


def fixed_range(row) -> tuple[float, float]:
    """(lowest, highest) fixed cost the samples allow: fixed = step(lo) - lo x per layer (2 step(1) - step(2))."""
    lo, _, s1, _ = _depths(row)
    (pl, ph) = slope_range(row)
    return min(s1) - lo * ph, max(s1) - lo * pl


def decided(row) -> bool:
    """An eager row's slope and fixed cost are usable only where neither's sample range reaches zero: a fixed range
    reaching zero leaves the two-depth line unchecked, and one entirely below zero (`line_fails`) contradicts it."""
    return row["run"] != "eager" or min(slope_range(row)[0], fixed_range(row)[0]) > 0


def line_fails(row) -> bool:
    """Whether an eager row's samples put its fixed part entirely below zero: every step(hi) sample is more than
    hi / lo times every step(lo) sample, so fixed + layers x per layer does not describe the row, and its slope is
    not one layer's cost."""
    return row["run"] == "eager" and fixed_range(row)[1] <= 0


def below_graphed(arch_rec: dict, row) -> float | None:
    """The graphed per layer of an eager row's configuration (same state, experts impl, batch and context) where the
    eager slope's whole sample range lies below it, else None. Graphing removes the host's launches, not the device's
    work, and an eager step is timed between synchronisations, so at depth an eager layer costs at least its graphed
    one: a slope below it is the host time the second layer added while the step was host-bound, not one layer's
    cost, and the two-depth line falls below its kernels' time on the GPU as layers are added."""
    if row["run"] != "eager" or not row.get("samples_us"):
        return None
    g = _row(arch_rec, row["state"], row["impl"], "graphed", row["batch"], row["context"])
    return g["per_layer_us"] if g and slope_range(row)[1] < g["per_layer_us"] else None


def comparable(arch_rec: dict, row) -> bool:
    """Whether an eager row's slope can be set against another's (`contradicted`): its sample range lies above
    zero, its two-depth line does not fail (`line_fails`) and it does not lie wholly below its own graphed layer
    (`below_graphed`)."""
    return (row["run"] == "eager" and bool(row.get("samples_us")) and slope_range(row)[0] > 0 and not line_fails(row)
            and below_graphed(arch_rec, row) is None)


def contradicted(arch_rec: dict, row) -> list[tuple[int, int, float, float]]:
    """The eager rows of `row`'s configuration (same state and experts implementation) at other cases that
    contradict its slope, as [(batch, context, lowest, highest slope)]: a layer's host work shrinks neither with the
    context nor with the batch and its device work grows with both, so an eager slope should not lie wholly below
    that of a case no larger in batch and context, nor wholly above that of a case no smaller. Each depth's samples
    are taken back to back, so drift between the two depths' sample blocks is not in a slope's range, and such a
    pair says that at least one of the two slopes is not the layer's cost. Only `comparable` rows are set side by
    side; empty where `row` is not one."""
    if not comparable(arch_rec, row):
        return []
    lo, hi = slope_range(row)
    out = []
    for o in arch_rec["rows"]:
        if ((o["state"], o["impl"]) != (row["state"], row["impl"]) or (o["batch"], o["context"]) ==
                (row["batch"], row["context"]) or not comparable(arch_rec, o)):
            continue
        ol, oh = slope_range(o)
        if ((o["batch"] <= row["batch"] and o["context"] <= row["context"] and ol > hi)
                or (o["batch"] >= row["batch"] and o["context"] >= row["context"] and oh < lo)):
            out.append((o["batch"], o["context"], ol, oh))
    return out


def _fails_text(row) -> str:
    lo, hi, s1, s2 = _depths(row)
    return (f"fixed entirely below zero: the {hi}-layer step's samples ({min(s2):,.0f}–{max(s2):,.0f} us) are "
            f"all more than {hi / lo:g}× the {lo}-layer step's ({min(s1):,.0f}–{max(s1):,.0f} us), so the "
            f"two-depth line fails for this row and its per layer is no layer's cost")


def span_text(lo: float, hi: float, unit: str = "µs") -> str:
    """A sample range in words where it reaches below zero: no time is negative, so such a range decides nothing
    and its numbers are not shown as times."""
    if hi <= 0:
        return "entirely below zero"
    return f"from below zero to {hi:,.0f} {unit}" if lo <= 0 else f"{lo:,.0f} to {hi:,.0f} {unit}"


def row_text(row) -> str:
    """per layer, fixed and tokens/s of a row; for an eager row each with the range its samples allow, and
    'undecided (spread …)' where that range reaches zero (tokens/s then too: it needs both); a fixed range entirely
    below zero is said to contradict the two-depth line (`line_fails`)."""
    if row["run"] != "eager":
        return (f"per layer {row['per_layer_us']:8.1f} us  fixed {row['fixed_us']:8.1f} us  "
                f"{row['tokens_per_s']:8.1f} tokens/s")
    parts = []
    for name, (lo, hi), v in (("per layer", slope_range(row), row["per_layer_us"]),
                              ("fixed", fixed_range(row), row["fixed_us"])):
        parts.append(f"{name} {v:,.0f} us ({lo:,.0f}–{hi:,.0f})" if lo > 0 else _fails_text(row)
                     if name == "fixed" and hi <= 0 else f"{name} undecided (spread {span_text(lo, hi, 'us')})")
    parts.append(f"{row['tokens_per_s']:.1f} tokens/s" if decided(row) else "tokens/s undecided")
    return "  ".join(parts)


def eager_ratio(a: dict, state: str, b: int, c: int, other: str = "bf16", fastest: bool = False) -> dict:
    """Eager per layer of `state` over eager `other` (bf16: its default experts impl, or with fastest=True the one
    fastest eager at (b, c) among those whose slope's sample range lies above zero, whose two-depth line does not
    fail and whose slope is not wholly below its own graphed layer, `best_row`; "impl" names the denominator's):
    value, the range its samples allow, and decided = False unless both rows are `decided` (each slope's and each
    fixed part's sample range above zero), both slopes positive, and neither slope wholly below its
    own graphed layer (`below_graphed`). Undecided, "range" holds the two slopes' ranges, "fixed" each row's (state,
    lowest, highest) fixed part and "graphed" each row below its graphed layer as (name, lowest, highest slope,
    graphed per layer), for `eager_text`. Decided, "contradicted" lists each slope of the two that another eager row
    of its configuration contradicts (`contradicted`) as (name, lowest, highest slope, (batch, context, that row's
    lowest, highest slope)): such a ratio is no conclusion, even for this run."""
    pick = lambda st: (best_row(a, st, "eager", b, c) if st == "bf16" and fastest else      # noqa: E731
                       _row(a, st, a.get("default_experts_impl") if st == "bf16" else None, "eager", b, c))
    num, den = pick(state), pick(other)
    if not num or not den:
        return {"value": None, "range": None, "decided": False, "impl": None}
    (nl, nh), (dl, dh) = slope_range(num), slope_range(den)
    below = [(" ".join(str(x) for x in (st, r["impl"]) if x), *slope_range(r), g)
             for st, r in ((state, num), (other, den)) if (g := below_graphed(a, r)) is not None]
    ok = min(nl, dl, num["per_layer_us"], den["per_layer_us"]) > 0 and decided(num) and decided(den) and not below
    against = [(" ".join(str(x) for x in (st, r["impl"]) if x), *slope_range(r), c)
               for st, r in ((state, num), (other, den)) for c in contradicted(a, r)] if ok else []
    return {"value": num["per_layer_us"] / den["per_layer_us"], "decided": ok, "impl": den["impl"],
            "range": (nl / dh, nh / dl) if ok else ((nl, nh), (dl, dh)), "contradicted": against,
            **({} if ok else {"fixed": ((state, *fixed_range(num)), (other, *fixed_range(den))),
                              "graphed": below})}


def eager_text(e: dict) -> str:
    """A decided eager ratio as its value and range (with the slopes other eager rows contradict, `contradicted`:
    then no conclusion); otherwise 'undecided (spread …)' where a slope's range reaches
    zero, else 'undecided (… eager slope … lies below its own graphed layer …)' where a slope lies wholly below its
    graphed layer (`below_graphed`), else 'undecided (fixed part: …)' where a fixed part's range reaches zero
    (entirely below zero: the two-depth line fails for that row, `line_fails`)."""
    if e["value"] is None:
        return "–"
    if not e["decided"]:
        (nl, nh), (dl, dh) = e["range"]
        if min(nl, dl) <= 0 or "fixed" not in e:
            return f"undecided (spread: per layer {span_text(nl, nh)} over {span_text(dl, dh)})"
        if e.get("graphed"):
            name, lo, hi, g = e["graphed"][0]
            return (f"undecided ({name}'s eager slope, {lo:,.0f}–{hi:,.0f} µs, lies below its own graphed layer, "
                    f"{g:,.0f} µs: not one layer's cost, its two-depth line falls below its GPU time with depth)")
        fixed = lambda st, lo, hi: (f"{st} {span_text(lo, hi)}"      # noqa: E731
                                    + (" (the two-depth line fails)" if hi <= 0 else ""))
        return f"undecided (fixed part: {fixed(*e['fixed'][0])}; {fixed(*e['fixed'][1])})"
    lo, hi = e["range"]
    text = f"{e['value']:.2f}× ({lo:.2f}–{hi:.2f})"
    if e.get("contradicted"):
        text += ", contradicted (" + "; ".join(
            f"{name}'s slope {l:,.0f}–{h:,.0f} µs against {ol:,.0f}–{oh:,.0f} µs at batch {b}, context {c}"
            for name, l, h, (b, c, ol, oh) in e["contradicted"]) + ")"
    return text
