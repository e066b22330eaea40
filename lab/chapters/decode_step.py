"""Chapter 07: what int4 buys in a decode step. Reads the decode-step receipt (lab.decode_step) and shapes it for
the chapter: which receipt, per-layer tables, the stacked bars against the floor, the targets.

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
BARS = (("int4", "eager"), ("int4", "graphed"), ("int4_fused", "graphed"), ("int4", "compiled"),
        ("bf16", "eager"), ("bf16", "graphed"), ("bf16", "compiled"))


def receipts() -> list[Path]:
    return sorted(RECEIPTS.glob("decode_step_*.json"))


def load(quick: bool) -> tuple[dict, Path, bool]:
    """(receipt, its path, stand-in?): the committed GPU receipt when there is one, else a CPU run at tiny width."""
    found = receipts()
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
    rows = [r for r in arch_rec["rows"] if (r["state"], r["run"], r["batch"], r["context"]) == (state, run, batch, context)
            and "per_layer_us" in r]
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
                            "tokens_per_s": r["tokens_per_s"], "formula": r["formula"]})
    return out


def breakdown(arch_rec: dict, state: str) -> dict | None:
    """The per-layer breakdown (us per category) of `state`'s graphed step, when the receipt holds one."""
    for bd in arch_rec.get("breakdown", []):
        if bd["state"] == state and "per_layer_us" in bd:
            return bd["per_layer_us"]
    return None


def plot_bars(rec: dict, axes) -> None:
    """Per model: a bar per (state, run), stacked by breakdown category where the receipt has one (graphed
    steps), one block otherwise; the floor of each state's bytes as a dashed line."""
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
            labels.append((i, f"{state}\n{run}"))
            bd = breakdown(a, state) if run == "graphed" else None
            if bd:
                bottom = 0.0
                for seg in SEGMENTS:
                    v = max(0.0, bd.get(seg, 0.0))
                    ax.bar(i, v, bottom=bottom, color=colours[seg], label=seg if i == 1 else None)
                    bottom += v
                ax.plot([i - 0.4, i + 0.4], [r["per_layer_us"]] * 2, color="k", lw=1.5,
                        label="per layer, step(2) − step(1)" if i == 1 else None)
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
        # eager steps are host-bound and tens of times taller: the axis fits the graphed and compiled bars, and an
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
        ax.legend(fontsize=6)


def case_table(arch_rec: dict) -> list[dict]:
    """Per (batch, context): the summary's ratios (graphed over floor, int4 over the best bf16, eager over eager)."""
    out = []
    for key, s in arch_rec.get("summary", {}).items():
        out.append({"case": key, **{k: v for k, v in s.items() if not isinstance(v, dict)},
                    "best_bf16": s.get("best_bf16", {}).get("impl")})
    return out


TARGETS = (("int4 graphed layer <= 2x its read floor", "int4_graphed_over_floor", "<=", 2.0),
           ("int4 graphed layer <= 3x its read floor (milestone)", "int4_graphed_over_floor", "<=", 3.0),
           ("int4 graphed tokens/s >= 3x the best bf16, batch 1", "int4_graphed_over_best_bf16_tokens_per_s", ">=",
            3.0),
           ("int4 at its best (graphed or compiled) >= 3x the best bf16", "int4_over_best_bf16_tokens_per_s", ">=", 3.0),
           ("int4 eager layer <= bf16 eager layer (default experts impl)", "int4_eager_over_default_bf16_eager", "<=",
            1.0))


def _row(a: dict, state, impl, run, b, c):
    return next((r for r in a["rows"] if (r["state"], r["impl"], r["run"], r["batch"], r["context"]) ==
                 (state, impl, run, b, c) and "per_layer_us" in r), None)


def spread(row) -> float:
    """A row's per-layer uncertainty relative to its per-layer time: (range of the 2-layer step's samples + range of
    the 1-layer step's) / per layer. per layer = step(2) - step(1) moves by at most that much within the samples."""
    if not row or not row.get("samples_us"):
        return float("inf")
    return sum(max(v) - min(v) for v in row["samples_us"].values()) / abs(row["per_layer_us"])


def target_spread(a: dict, state: str, key: str, b: int, c: int) -> float:
    """The relative uncertainty of a summary ratio: the spreads of the rows it divides, added."""
    s = a.get("summary", {}).get(f"B{b} C{c}", {})
    best = s.get("best_bf16") or {}
    bf = _row(a, "bf16", best.get("impl"), best.get("run"), b, c)
    if key.endswith("_graphed_over_floor"):
        return spread(_row(a, state, None, "graphed", b, c))
    if key.endswith("_graphed_over_best_bf16_tokens_per_s"):
        return spread(_row(a, state, None, "graphed", b, c)) + spread(bf)
    if key.endswith("_over_best_bf16_tokens_per_s"):               # int4 at its best: graphed or compiled
        mine = [r for r in (_row(a, state, None, run, b, c) for run in ("graphed", "compiled")) if r]
        return spread(min(mine, key=lambda r: r["per_layer_us"])) + spread(bf) if mine else float("inf")
    if key.endswith("_eager_over_default_bf16_eager"):
        return spread(_row(a, state, None, "eager", b, c)) + spread(
            _row(a, "bf16", a.get("default_experts_impl"), "eager", b, c))
    raise ValueError(f"key: no spread rule for {key!r}")


def targets(rec: dict, state: str = "int4") -> list[dict]:
    """Each target of the decode step, per model, at batch 1 of the first context: value, its relative spread and
    met / missed. None where the receipt has no number for it, where the value lies within its spread of the bound
    (undecided: the samples cannot tell), and everywhere in a CPU stand-in."""
    out = []
    judged = rec.get("card") != "cpu"           # a CPU stand-in decides nothing
    for arch in [a for a in ORDER if a in rec["archs"] and rec["archs"][a].get("rows")]:
        a = rec["archs"][arch]
        b, c = first_case(a)
        s = a.get("summary", {}).get(f"B{b} C{c}", {})
        if state not in a.get("states", (state,)):
            continue
        for name, key, op, bound in TARGETS:
            k = key.replace("int4", state, 1)
            v = s.get(k)
            rel = target_spread(a, state, k, b, c) if v is not None else None
            decided = v is not None and judged and abs(v - bound) > bound * rel
            met = (v <= bound if op == "<=" else v >= bound) if decided else None
            out.append({"arch": arch, "target": name, "value": v, "spread": rel, "met": met})
        g = a.get("greedy") or {}
        if state == "int4":
            out.append({"arch": arch, "target": f"graphed and eager int4 emit the same {g.get('steps')} greedy tokens",
                        "value": g.get("first_mismatch"), "spread": None,
                        "met": g.get("equal") if judged else None})
    return out
