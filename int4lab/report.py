"""README performance tables, generated from the decode receipt (never typed by hand).

    python -m int4lab.report                          # print the markdown block for data/receipts/decode_h200.json
    python -m int4lab.report --readme README.md       # rewrite the block between the perf-table markers

Columns come from the receipt's rows; the floor is bytes / the same run's measured copy bandwidth; the
llama.cpp column is *recorded* (ggml test-backend-ops on the H200, /work/shared/anchors/), not re-measured.
Targets are issue 6's, checked against the receipt: pass, miss, or not measured.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = expert
intermediate (MoE rows carry N = I, K = H).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .bench import DEFAULT_OUT, MODELS, decode_shapes, validate_receipt
from .paths import ROOT
from .receipts import read_receipt

ANCHORS = ROOT.parent / "shared" / "anchors"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
LLAMA = "llama.cpp Q4_0 (recorded)"


def load(path=DEFAULT_OUT) -> dict:
    """Read and validate a decode receipt."""
    rec = read_receipt(path)
    validate_receipt(rec)
    return rec


# ---- recorded references ------------------------------------------------------------------------------
_MM = re.compile(r"MUL_MAT\(type_a=q4_0,.*?m=(\d+),n=1,k=(\d+).*?\):\s+\d+ runs -\s+([\d.]+) us/run")
_MMID = re.compile(r"MUL_MAT_ID\(type_a=q4_0,type_b=f32,n_mats=(\d+),n_used=(\d+),b=0,m=(\d+),n=1,k=(\d+)\):"
                   r"\s+\d+ runs -\s+([\d.]+) us/run")


def parse_ggml(text: str, source: str = "ggml") -> list[dict]:
    """llama.cpp Q4_0 rows from ggml `test-backend-ops perf` output: dense MUL_MAT (E = 1) and routed MUL_MAT_ID."""
    rows = []
    for line in text.splitlines():
        if (mm := _MM.search(line)):
            n, k, us = int(mm[1]), int(mm[2]), float(mm[3])
            rows.append({"impl": "llama.cpp_q4_0", "N": n, "K": k, "E": 1, "topk": 1, "us": us, "source": source})
        elif (mm := _MMID.search(line)):
            e, t, n, k, us = int(mm[1]), int(mm[2]), int(mm[3]), int(mm[4]), float(mm[5])
            rows.append({"impl": "llama.cpp_q4_0", "N": n, "K": k, "E": e, "topk": t, "us": us, "source": source})
    return rows


def anchor_rows(directory=ANCHORS) -> list[dict]:
    """Recorded llama.cpp Q4_0 times from the anchors folder; empty (with a message) where it is absent."""
    directory = Path(directory)
    files = sorted(directory.glob("ggml_q4_0_*.txt")) if directory.is_dir() else []
    if not files:
        print(f"no llama.cpp anchors under {directory}: the recorded column stays empty", file=sys.stderr)
        return []
    rows = []
    for f in files:
        rows += parse_ggml(f.read_text(), source=f.name)
    return rows


def llama_gemv_us(anchors, N: int, K: int):
    hits = [a["us"] for a in anchors if a["E"] == 1 and (a["N"], a["K"]) == (N, K)]
    return min(hits) if hits else None


def llama_moe_us(anchors, model) -> float | None:
    """One token's routed expert matmuls summed: fused gate_up [2I, H] if recorded, else gate and up, plus down."""
    def find(n, k):
        hits = [a["us"] for a in anchors if (a["E"], a["topk"], a["N"], a["K"]) ==
                (model.n_experts, model.top_k, n, k)]
        return min(hits) if hits else None
    H, I = model.hidden, model.intermediate
    down = find(H, I)
    gate_up = find(2 * I, H)
    if gate_up is None and find(I, H) is not None:
        gate_up = 2 * find(I, H)
    return None if down is None or gate_up is None else gate_up + down


# ---- lookups in the receipt ---------------------------------------------------------------------------
def _us(rec, impl, **where):
    hits = [r["us"] for r in rec["rows"] if r["impl"] == impl and all(r[k] == v for k, v in where.items())]
    return hits[0] if hits else None


def _row(rec, impl, **where):
    hits = [r for r in rec["rows"] if r["impl"] == impl and all(r[k] == v for k, v in where.items())]
    return hits[0] if hits else None


def _line(cells) -> str:
    """One markdown table row; a '|' inside a cell (the layer name "gate|up") is escaped."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _f(v, nd=1) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def floor_us(nbytes: float, copy_gbps: float) -> float:
    """The time the bytes need at the device's measured copy bandwidth."""
    return nbytes / (copy_gbps * 1e3)


def gemv_shapes(rec) -> list[tuple[str, str, int, int]]:
    seen = []
    for r in rec["rows"]:
        if r["layer"] != "moe" and (r["model"], r["layer"], r["N"], r["K"]) not in seen:
            seen.append((r["model"], r["layer"], r["N"], r["K"]))
    return seen


def gemv_table(rec, anchors=()) -> str:
    bw = rec["copy"]["GBps"]
    head = ["model", "layer", "N×K", "int4_b32", "w4a16_cutlass", "bf16", "tinygemm", "gemlite", LLAMA,
            "floor", "int4_b32 GB/s", "bf16 / int4_b32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, layer, N, K in gemv_shapes(rec):
        w = {"model": model, "layer": layer, "N": N, "K": K}
        ours = _row(rec, "int4_b32", **w)
        bf = _us(rec, "bf16", **w)
        fl = floor_us(ours["bytes"], bw) if ours and "bytes" in ours else None
        cells = [model, layer, f"{N}×{K}"] + [_f(_us(rec, i, **w)) for i in
                                              ("int4_b32", "w4a16_cutlass", "bf16", "tinygemm", "gemlite")]
        cells += [_f(llama_gemv_us(anchors, N, K)), _f(fl), _f(ours["GBps"], 0) if ours else "–",
                  _f(bf / ours["us"], 2) if ours and bf else "–"]
        lines.append(_line(cells))
    return "\n".join(lines)


def moe_table(rec, anchors=()) -> str:
    bw = rec["copy"]["GBps"]
    head = ["model", "tokens", "experts read", "int4-b32 routed GEMV", "int4-b32 grouped GEMM", "bf16 loop",
            "grouped_mm (bf16)", "llama.cpp Q4_0 routed (recorded)", "int4 floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["model"], r["rows"]) for r in rec["rows"] if r["layer"] == "moe"},
                  key=lambda k: (list(MODELS).index(k[0]) if k[0] in MODELS else 99, k[1]))
    for model, R in keys:
        w = {"model": model, "layer": "moe", "rows": R}
        here = [r for r in rec["rows"] if all(r[k] == v for k, v in w.items())]
        n_active = next((r["n_active"] for r in here if "n_active" in r), None)
        ours = [r for r in here if r["impl"] in ("int4_b32_moe", "int4_b32_grouped") and "bytes" in r]
        fl = floor_us(ours[0]["bytes"], bw) if ours else None
        llama = llama_moe_us(anchors, MODELS[model]) if R == 1 and model in MODELS else None
        cells = [model, str(R), "–" if n_active is None else str(n_active)]
        cells += [_f(_us(rec, i, **w)) for i in ("int4_b32_moe", "int4_b32_grouped", "bf16_loop", "grouped_mm")]
        lines.append(_line(cells + [_f(llama), _f(fl)]))
    return "\n".join(lines)


# ---- issue 6 targets ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    target: str
    measured: str
    status: str          # "pass", "miss", "not measured"


def _status(ok) -> str:
    return "not measured" if ok is None else ("pass" if ok else "miss")


def targets(rec, anchors=()) -> list[Check]:
    """Issue 6's targets (H200, graph replay, same run) evaluated on the receipt."""
    out = []
    for N, K in ((14336, 4096), (4096, 14336)):
        ours = _us(rec, "int4_b32", N=N, K=K)
        bf = _us(rec, "bf16", N=N, K=K)
        ll = llama_gemv_us(anchors, N, K)
        out.append(Check(f"{N}×{K}: int4_b32 ≤ 11 µs", f"{_f(ours, 2)} µs",
                         _status(None if ours is None else ours <= 11)))
        out.append(Check(f"{N}×{K}: int4_b32 ≥ 2.9× bf16", "–" if None in (ours, bf) else f"{bf / ours:.2f}×",
                         _status(None if None in (ours, bf) else bf / ours >= 2.9)))
        out.append(Check(f"{N}×{K}: int4_b32 faster than llama.cpp Q4_0 (recorded {_f(ll, 2)} µs)",
                         f"{_f(ours, 2)} µs", _status(None if None in (ours, ll) else ours < ll)))
    big = _us(rec, "int4_b32", N=28672, K=8192)
    out.append(Check("28672×8192: int4_b32 ≤ 40 µs", f"{_f(big, 2)} µs",
                     _status(None if big is None else big <= 40)))
    for m in MODELS.values():
        for s in decode_shapes(m):
            w = {"model": s.model, "layer": s.layer, "N": s.N, "K": s.K}
            ours = _us(rec, "int4_b32", **w)
            peers = {i: _us(rec, i, **w) for i in ("bf16", "tinygemm", "gemlite")}
            peers["llama.cpp"] = llama_gemv_us(anchors, s.N, s.K)
            have = {k: v for k, v in peers.items() if v is not None}
            best = min(have.values()) if have else None
            missing = [k for k, v in peers.items() if v is None and k != "llama.cpp"]
            # slower than one measured peer is a miss whatever the others; a pass needs every re-measured peer
            ok = None if ours is None else False if best is not None and ours >= best else None if missing else True
            gap = f"; {', '.join(missing)} not measured" if missing else ""
            out.append(Check(f"{s.model} {s.layer} {s.N}×{s.K}: int4_b32 faster than every peer",
                             f"{_f(ours, 2)} µs vs best peer {_f(best, 2)} µs{gap}", _status(ok)))
    for name, limit in (("mixtral", 65), ("olmoe", 15), ("qwen3", 15)):
        us = _us(rec, "int4_b32_moe", model=name, layer="moe", rows=1)
        out.append(Check(f"{name} one-token MoE layer ≤ {limit} µs", f"{_f(us, 2)} µs",
                         _status(None if us is None else us <= limit)))
    return out


def targets_table(checks) -> str:
    lines = ["| target | measured | status |", "|---|---|---|"]
    lines += [_line([c.target, c.measured, c.status]) for c in checks]
    return "\n".join(lines)


def render(rec, anchors=()) -> str:
    """The whole README block: provenance, copy bandwidth, GEMV, MoE and target tables, skipped count."""
    p = rec["provenance"]
    checks = targets(rec, anchors)
    n_pass = sum(c.status == "pass" for c in checks)
    parts = [
        f"Generated by `python -m int4lab.report` from `data/receipts/decode_h200.json` "
        f"({p.get('device')}, torch {p.get('torch')}, triton {p.get('triton')}, commit `{p.get('commit')}`, "
        f"{p.get('date')}; `{p.get('command')}`). µs per call, median of CUDA-graph replays with weights "
        f"rotated beyond L2. Device copy bandwidth {rec['copy']['GBps']:.0f} GB/s (read + write); "
        f"floor = bytes / that bandwidth (a copy reads and writes, a GEMV almost only reads: a kernel can beat it)."
        + ("" if rec.get("method", {}).get("complete", True) else
           " **Partial run**: the harness stopped before its schedule was done."),
        "**Batch-1 GEMV, µs**\n\n" + gemv_table(rec, anchors),
        "**MoE layer (gate_up, SwiGLU, down, weighted combine), µs**\n\n" + moe_table(rec, anchors),
        f"**Issue 6 targets: {n_pass} of {len(checks)} met**\n\n" + targets_table(checks),
    ]
    if rec["skipped"]:
        parts.append(f"{len(rec['skipped'])} measurements were skipped; "
                     "the receipt's `skipped` list gives each reason.")
    return "\n\n".join(parts)


# ---- figures (matplotlib imported only here) ------------------------------------------------------------
GEMV_COLORS = {"int4_b32": "tab:red", "w4a16_cutlass": "tab:orange", "bf16": "tab:gray", "tinygemm": "tab:blue",
               "gemlite": "tab:green"}
MOE_COLORS = {"int4_b32_moe": "tab:red", "int4_b32_grouped": "tab:purple", "bf16_loop": "tab:gray",
              "grouped_mm": "tab:brown"}


def plot_bandwidth(rec, ax=None):
    """Effective GB/s per GEMV shape (x) and implementation (bars) against the run's copy bandwidth (line)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(12, 4.5))[1]
    shapes = gemv_shapes(rec)
    impls = [i for i in GEMV_COLORS if any(r["impl"] == i for r in rec["rows"])]
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for i, (model, layer, N, K) in enumerate(shapes):
            r = _row(rec, impl, model=model, layer=layer, N=N, K=K)
            if r:
                xs.append(i + (j - (len(impls) - 1) / 2) * width)
                ys.append(r["GBps"])
        ax.bar(xs, ys, width, label=impl, color=GEMV_COLORS[impl])
    ax.axhline(rec["copy"]["GBps"], color="k", ls="--", lw=1, label="device copy (read + write)")
    ax.set_xticks(range(len(shapes)), [f"{m} {l}\n{N}×{K}" for m, l, N, K in shapes], rotation=60, ha="right",
                  fontsize=8)
    ax.set_ylabel("effective GB/s (bytes that must move / time)")
    ax.set_title(f"Batch-1 GEMV on {rec['provenance'].get('device')}")
    ax.legend(fontsize=8, ncol=3)
    return ax


def plot_moe(rec, rows: int = 1, ax=None):
    """µs per MoE layer call (gate_up, SwiGLU, down, combine) for `rows` tokens, per model and implementation,
    with the int4 floor (bytes / copy bandwidth) as a tick."""
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
        ours = [r for r in moe if r["model"] == m and r["impl"].startswith("int4_b32") and "bytes" in r]
        if ours:
            ax.plot([i - 0.45, i + 0.45], [floor_us(ours[0]["bytes"], rec["copy"]["GBps"])] * 2, "k--", lw=1)
    ax.set_xticks(range(len(models)), models)
    ax.set_yscale("log")
    ax.set_ylabel("µs per layer call (log)")
    ax.set_title(f"MoE layer, {rows} token(s); dashed: int4 bytes / copy bandwidth", fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    return ax


def rewrite_readme(readme, block: str, start: str = START, end: str = END) -> Path:
    """Replace the text between the `start` and `end` markers in `readme` with `block`."""
    readme = Path(readme)
    text = readme.read_text()
    if start not in text or end not in text or text.index(start) > text.index(end):
        raise ValueError(f"{readme} must contain {start} followed by {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{block}\n{end}{tail}")
    return readme


# ------------------------------------------------------------------ the other receipts: models, gates, packing
RESULTS_START, RESULTS_END = "<!-- results-table:start -->", "<!-- results-table:end -->"
RECEIPTS = ROOT / "data" / "receipts"


def _prov(rec) -> str:
    p = rec["provenance"]
    commit = p["commit"] if p["commit"] != "unknown" else rec.get("launch_commit", "unknown")
    return f"{p['device']}, torch {p['torch']}, commit `{str(commit)[:12]}`, {p['date'][:10]}"


def train_table(receipts=RECEIPTS) -> str:
    """The small models: validation/test/out-of-domain perplexity against the unigram baseline."""
    lines = ["| model | params | steps | val ppl | unigram val ppl | test ppl | ood ppl | trained on |",
             "|---|---|---|---|---|---|---|---|"]
    for path in sorted(Path(receipts).glob("train_*.json")):
        r = read_receipt(path)
        ev = r["eval"]
        lines.append(_line([r["arch"], f"{r['params'] / 1e6:.2f} M", r["training"]["steps"],
                            _f(ev["validation"]["ppl"]), _f(ev["validation"]["unigram_ppl"]), _f(ev["test"]["ppl"]),
                            _f(ev["ood"]["ppl"]), _prov(r)]))
    return "\n".join(lines)


def gate_table(receipts=RECEIPTS) -> str:
    """One line per (model, arm): the gate's overall verdict and its calibration verdict where it has one."""
    from .gate import summary_rows
    lines = ["| model | arm | verdict | calibration verdict | receipt |", "|---|---|---|---|---|"]
    for path in sorted(Path(receipts).glob("gate_*.json")):
        r = read_receipt(path)
        seen = {}
        for row in summary_rows(r):
            seen.setdefault(row["arm"], (row["overall"], row["calibration"] or "–"))
        for arm, (overall, cal) in seen.items():
            lines.append(_line([r["model"], arm, overall, cal, f"`{path.name}`"]))
    return "\n".join(lines)


def pack_table(receipts=RECEIPTS) -> str:
    """Pack time per layer: round-to-nearest and GPTQ, median wall seconds."""
    lines = ["| device | N×K | impl | seconds (median) |", "|---|---|---|---|"]
    for path in sorted(Path(receipts).glob("gptq_pack_*.json")):
        r = read_receipt(path)
        for row in r["rows"]:
            lines.append(_line([r["provenance"]["device"], f"{row['N']}×{row['K']}", row["impl"],
                                f"{row['seconds']:.3g}"]))
    return "\n".join(lines)


def render_results(receipts=RECEIPTS) -> str:
    return "\n\n".join([
        "Generated by `python -m int4lab.report --readme README.md` from the receipts in `data/receipts/`.",
        "**The small trained models** (`data/models/`, trained on Shakespeare's plays; ood = KJV)", train_table(receipts),
        "**Perplexity gates on the small models** (notebook 04; budget 1% relative perplexity)", gate_table(receipts),
        "**GPTQ pack time per layer**", pack_table(receipts)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--receipt", type=Path, default=DEFAULT_OUT, help="decode receipt to tabulate")
    ap.add_argument("--readme", type=Path, default=None, help="rewrite this file's perf-table block")
    ap.add_argument("--anchors", type=Path, default=ANCHORS, help="folder with recorded llama.cpp timings")
    args = ap.parse_args(argv)
    if not args.receipt.exists():
        print(f"no receipt at {args.receipt}: run `python -m int4lab.bench` on a CUDA machine first", file=sys.stderr)
        return 2
    block = render(load(args.receipt), anchor_rows(args.anchors))
    if args.readme:
        print(f"rewrote {rewrite_readme(args.readme, block)}")
        if RESULTS_START in Path(args.readme).read_text():      # the models/gates/packing block, if the file has one
            rewrite_readme(args.readme, render_results(), RESULTS_START, RESULTS_END)
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
