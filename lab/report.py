"""RESULTS.md, the README's layout and the kernel notes' misses, and chapter 05's figures, generated from the
receipts (never typed by hand).

    python -m lab.report                              # print the decode block for the current decode receipt
    python -m lab.report --results RESULTS.md         # rewrite RESULTS.md's generated blocks (between its markers)
    python -m lab.report --readme README.md           # rewrite the README's layout block (folders and their sizes)
    python -m lab.report --notes notes/kernels.md     # rewrite the kernel notes' table of missed targets

Decode columns come from the receipt's rows: µs per call, the row's read floor (`floor_us`: a kernel that only
reads the row's int4-b32 bytes, timed in the same run; receipts from before the floor lack it and show "–"),
`int4_b32 / floor`, and beside every peer its time over ours. The llama.cpp column is *recorded* (ggml
test-backend-ops, data/receipts/anchors/, see PROVENANCE.md there), not re-measured, and shown only beside a
receipt of the card it was recorded on (`same_card`). The targets
have names, defined once by `target_definitions` (RESULTS.md prints them): "GEMV at the floor", "GEMV beside
its peers", "one-token MoE step" and "batched MoE"; each is checked against the receipt: pass, miss, undecided
or not measured.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = expert
intermediate (MoE rows carry N = I, K = H).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from lab.bench import peer_table
from lab.bench.decide import decided
from lab.bench.schema import DEFAULT_OUT, OURS_MOE, validate_receipt
from int4lab.paths import RECEIPTS
from int4lab.receipts import STALE, portable_command, read_receipt, sources_hash, write_text_atomic
from int4lab.archs import bench_label
from int4lab.shapes import MODELS, all_shapes

ANCHORS = RECEIPTS / "anchors"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
LLAMA = "llama.cpp Q4_0 (recorded)"
GEMV_PEERS = ("w4a16_cutlass", "bf16", "tinygemm", "gemlite")
MOE_PEERS = ("bf16_loop", "grouped_mm")


def load(path=DEFAULT_OUT) -> dict:
    """Read and validate a decode receipt."""
    rec = read_receipt(path)
    validate_receipt(rec)
    return rec


# ---- partial runs: shown when printed, refused for the README ---------------------------------------------
def partial_settings(rec: dict) -> list[str]:
    """Why a receipt does not hold a whole run ([] when it does). A decode receipt: a harness stopped before
    its schedule was done, the --quick schedule, an --only subset of implementations. A gate receipt: max_docs
    set (the first n documents of each text) or a subset of the texts."""
    why = []
    method, settings = rec.get("method") or {}, rec.get("settings") or {}
    command = str((rec.get("provenance") or {}).get("command", ""))
    if method.get("complete") is False:
        why.append("method.complete is false (the harness stopped before its schedule was done)")
    if method.get("quick"):
        why.append("method.quick (the --quick schedule)")
    if "--only" in command.split():
        why.append("--only (a subset of the implementations)")
    if "bootstrap_unit" in settings:                     # a gate receipt
        from int4lab.gate.texts import TEXTS
        if settings.get("max_docs") is not None:
            why.append(f"settings.max_docs = {settings['max_docs']} (the first documents of each text only)")
        if sorted(settings.get("texts") or []) != sorted(TEXTS):
            why.append(f"settings.texts = {settings.get('texts')} (not every text of {list(TEXTS)})")
    return why


def refuse_partial(rec: dict, path) -> None:
    """ValueError naming the receipt and its partial settings: the README publishes whole runs only."""
    why = partial_settings(rec)
    if why:
        raise ValueError(f"{path} was made with partial settings: {'; '.join(why)}. The README publishes whole "
                         f"runs only: rerun without them, or keep this receipt out of data/receipts/")


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


def same_card(rec, anchors) -> list[dict]:
    """The recorded rows taken on the card `rec` was measured on (each anchor file names its card:
    ggml_q4_0_h200_....txt): a time recorded on another card is no peer of this run."""
    return [a for a in anchors if card(rec).lower() in a["source"].lower()]


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
def _row(rec, impl, **where):
    hits = [r for r in rec["rows"] if r["impl"] == impl and all(r[k] == v for k, v in where.items())]
    return hits[0] if hits else None


def _us(rec, impl, **where):
    r = _row(rec, impl, **where)
    return None if r is None else r["us"]


def _floor(rows) -> float | None:
    """The read floor stamped on these rows (one shape or one MoE (model, tokens): they share it)."""
    return next((r["floor_us"] for r in rows if "floor_us" in r), None)


def _line(cells) -> str:
    """One markdown table row; a '|' inside a cell (the layer name "gate|up") is escaped."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _f(v, nd=1) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def _ratio(a, b) -> float | None:
    return None if a is None or b is None else a / b


def _vs(peer_us, ours_us) -> str:
    """A peer's cell: its µs and, where ours was timed, peer / ours (> 1: ours is faster)."""
    if peer_us is None:
        return "–"
    return f"{peer_us:.1f}" + ("" if ours_us is None else f" ({peer_us / ours_us:.2f}×)")


def gemv_shapes(rec) -> list[tuple[str, str, int, int]]:
    seen = []
    for r in rec["rows"]:
        if r["layer"] != "moe" and (r["model"], r["layer"], r["N"], r["K"]) not in seen:
            seen.append((r["model"], r["layer"], r["N"], r["K"]))
    return seen


def gemv_table(rec, anchors=()) -> str:
    anchors = same_card(rec, anchors)
    head = ["model", "layer", "N×K", "read floor", "int4_b32", "int4_b32 / floor"] + list(GEMV_PEERS) + \
        [LLAMA, "int4_b32 GB/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, layer, N, K in gemv_shapes(rec):
        w = {"model": model, "layer": layer, "N": N, "K": K}
        here = [r for r in rec["rows"] if all(r[k] == v for k, v in w.items())]
        ours = _us(rec, "int4_b32", **w)
        fl = _floor(here)
        cells = [model, layer, f"{N}×{K}", _f(fl), _f(ours), _f(_ratio(ours, fl), 2)]
        cells += [_vs(_us(rec, i, **w), ours) for i in GEMV_PEERS] + [_vs(llama_gemv_us(anchors, N, K), ours)]
        ours_row = _row(rec, "int4_b32", **w)
        lines.append(_line(cells + [_f(ours_row["GBps"], 0) if ours_row else "–"]))
    return "\n".join(lines)


def moe_keys(rec) -> list[tuple[str, int]]:
    """(model, tokens) of the receipt's MoE rows, models in the shapes table's order."""
    return sorted({(r["model"], r["rows"]) for r in rec["rows"] if r["layer"] == "moe"},
                  key=lambda k: (list(MODELS).index(k[0]) if k[0] in MODELS else 99, k[1]))


def best_impl_moe(rec, model: str, rows: int) -> str | None:
    """Which of our MoE paths is the faster one for (model, tokens), if either was timed."""
    ts = {i: t for i in OURS_MOE if (t := _us(rec, i, model=model, layer="moe", rows=rows)) is not None}
    return min(ts, key=ts.get) if ts else None


def best_ours_moe(rec, model: str, rows: int) -> float | None:
    """The faster of our two MoE paths (routed GEMV, grouped tiles) for (model, tokens), if either was timed."""
    impl = best_impl_moe(rec, model, rows)
    return None if impl is None else _us(rec, impl, model=model, layer="moe", rows=rows)


def moe_tile(model: str, tokens: int, generation: str = "sm90"):
    """The grouped path's gate_up tile (a plan.GroupedPlan, before split-K) for `tokens` tokens of `model` on
    `generation`: the row of plan.GROUPED_TABLE that plan.grouped_plan takes there, read without a device of that
    generation (tests/test_bench.py checks the two agree)."""
    from int4lab.kernels import plan
    m = MODELS[model]
    L = tokens * m.top_k
    N, K = 2 * m.intermediate, m.hidden
    return [p for mean, weights, p in plan.GROUPED_TABLE[generation]
            if L / max(1, min(m.n_experts, L)) >= mean and N * K >= weights][-1]


def moe_table(rec, anchors=()) -> str:
    anchors = same_card(rec, anchors)
    head = ["model", "tokens", "experts read", "read floor", "bf16 at its read floor", "int4-b32 routed GEMV",
            "int4-b32 grouped", "best int4 / floor", "bf16 loop", "grouped_mm (bf16)", "llama.cpp Q4_0 routed (recorded)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, R in moe_keys(rec):
        w = {"model": model, "layer": "moe", "rows": R}
        here = [r for r in rec["rows"] if all(r[k] == v for k, v in w.items())]
        # the floor's routing is our rows' (every impl shares it in receipts with a floor)
        mine = [r for r in here if r["impl"] in OURS_MOE] or here
        n_active = next((r["n_active"] for r in mine if "n_active" in r), None)
        best, fl = best_ours_moe(rec, model, R), _floor(here)
        llama = llama_moe_us(anchors, MODELS[model]) if R == 1 and model in MODELS else None
        cells = [model, str(R), "–" if n_active is None else str(n_active), _f(fl),
                 _f(peer_table.bf16_floor_us(rec, model, R))]     # the bf16 peers' bytes at this run's floor curve
        cells += [_f(_us(rec, i, **w)) for i in OURS_MOE] + [_f(_ratio(best, fl), 2)]
        cells += [_vs(_us(rec, i, **w), best) for i in MOE_PEERS] + [_vs(llama, best)]
        lines.append(_line(cells))
    return "\n".join(lines)


def gemv_summary(rec, anchors=()) -> list[dict]:
    """Per GEMV shape of the receipt: read floor µs, int4_b32 µs, `ratio` = ours / floor, and in `vs` each peer's
    µs / ours (> 1: ours is faster; "llama.cpp" is the recorded time); a peer not timed is absent."""
    anchors = same_card(rec, anchors)
    out = []
    for model, layer, N, K in gemv_shapes(rec):
        w = {"model": model, "layer": layer, "N": N, "K": K}
        ours = _us(rec, "int4_b32", **w)
        fl = _floor([r for r in rec["rows"] if all(r[k] == v for k, v in w.items())])
        peers = {i: _us(rec, i, **w) for i in GEMV_PEERS}
        peers["llama.cpp"] = llama_gemv_us(anchors, N, K)
        vs = {i: us / ours for i, us in peers.items() if us is not None and ours is not None}
        out.append({**w, "floor": fl, "ours": ours, "ratio": _ratio(ours, fl), "vs": vs})
    return out


def moe_series(rec, model: str) -> dict[str, dict[int, float]]:
    """µs by token count for every MoE implementation the receipt timed on `model`, plus "floor": the read floor
    of the unique routed experts' int4-b32 bytes at that token count."""
    series: dict[str, dict[int, float]] = {}
    for r in rec["rows"]:
        if r["layer"] == "moe" and r["model"] == model:
            series.setdefault(r["impl"], {})[r["rows"]] = r["us"]
            if "floor_us" in r:
                series.setdefault("floor", {})[r["rows"]] = r["floor_us"]
    return {k: dict(sorted(v.items())) for k, v in series.items()}


# ---- targets: the named goals the receipt is checked against ---------------------------------------------
GEMV_FLOOR = "GEMV at the floor"
GEMV_BESIDE_PEERS = "GEMV beside its peers"
ONE_TOKEN_MOE = "one-token MoE step"
BATCHED_MOE = "batched MoE"


@dataclass(frozen=True)
class Check:
    target: str
    measured: str
    status: str          # "pass", "miss", "undecided" (margin under the run-to-run spread), "not measured"
    paired: bool = False  # the status comes from bench.decide's paired re-measurement (paired_ratios)
    name: str = ""        # which named target the check belongs to (GEMV_FLOOR, ..., BATCHED_MOE)


def _status(ok, margin=None, spread=0.0) -> str:
    """pass / miss, or "undecided" when the relative margin to the target (|measured / limit - 1|) is below
    `spread`: the next run of the same code could land on the other side."""
    if ok is None:
        return "not measured"
    if margin is not None and abs(margin) < spread:
        return "undecided"
    return "pass" if ok else "miss"


def _within(ratio, limit, spread=0.0) -> str:
    return _status(None if ratio is None else ratio <= limit, None if ratio is None else ratio / limit - 1, spread)


# How far a median moves between two bench runs: the 90th percentile of |us / us' - 1| over the rows of torch's own
# kernels (bf16 cuBLAS, tinygemm, the bf16 per-expert loop, grouped_mm), which no commit here changes, in the
# committed receipt and an earlier full bench run on the same card (REPEATS, by the card the receipt names). A
# target closer than that is "undecided".
REPEATS = {"H100": RECEIPTS / "decode_h100_6aec966.json", "H200": RECEIPTS / "decode_h200_e1e741f.json"}


def card(rec) -> str:
    """The card a receipt was measured on, as REPEATS names it ("H100", "H200"), else its device string."""
    dev = str(rec.get("provenance", {}).get("device", ""))
    return next((c for c in REPEATS if c in dev), dev)


def repeat_of(rec) -> Path:
    """The earlier full bench on the card `rec` was measured on (REPEATS), for run_to_run."""
    return REPEATS.get(card(rec), REPEATS["H200"])


REPEAT = repeat_of({"provenance": {"device": "H100"}})        # the current receipt's (lab.bench.schema.DEFAULT_OUT)
STABLE_PEERS = ("bf16", "tinygemm", "bf16_loop", "grouped_mm")


def run_to_run(rec, other, q: float = 0.9) -> float | None:
    """The q-quantile of |us / us' - 1| over the STABLE_PEERS rows that both receipts timed; None if none."""
    def key(r):
        return r["model"], r["layer"], r["N"], r["K"], r["rows"], r["impl"]
    then = {key(r): r["us"] for r in other["rows"] if r["impl"] in STABLE_PEERS}
    moves = sorted(abs(r["us"] / then[key(r)] - 1) for r in rec["rows"] if key(r) in then)
    return moves[min(len(moves) - 1, int(q * len(moves)))] if moves else None


# The paired re-measurements of undecided targets (`python -m lab.bench.decide`), one file per run on one
# machine; used only where they timed the same kernel sources as the receipt.
DECIDE_GLOB = "decide_h200*.json"


def paired_ratios(rec, paths=None) -> dict:
    """{(kind, model or N, tokens or K, numerator, denominator): {"median", "lo", "hi", "n"}} over the bench.decide
    receipts (default: RECEIPTS / DECIDE_GLOB) of `rec`'s card whose kernel hash equals `rec`'s. Several runs of
    the same ratio (each a file, possibly from another machine of the same model) pool into one: the median of
    their medians and the hull of all their intervals, so runs that disagree leave a target undecided. Runs of other kernel sources
    are kept as "stale" intervals: they can withhold a verdict (`_settle`), never grant one. {} when no run
    matches."""
    paths = sorted(RECEIPTS.glob(DECIDE_GLOB)) if paths is None else [Path(p) for p in paths]
    mine = rec.get("provenance", {}).get("kernel_sources_sha256")
    found: dict = {}
    stale: dict = {}
    for path in paths:
        if not path.exists():
            continue
        dec = json.loads(path.read_text())
        if card(dec) != card(rec):                 # another card's ratios neither grant nor withhold a verdict
            continue
        same = mine is not None and dec.get("provenance", {}).get("kernel_sources_sha256") == mine
        m = dec["method"]
        for spec in dec["specs"]:
            for r in spec["ratios"]:
                key = (*spec["key"], r["num"], r["den"])
                if same:
                    found.setdefault(key, []).append((r, m))
                else:
                    stale.setdefault(key, []).append((r["median"], r["lo"], r["hi"]))
    out = {}
    for key, runs in found.items():
        n_rounds = {f"{m['rounds']} rounds x {m['processes']} processes" for _, m in runs}
        out[key] = {"median": statistics.median(r["median"] for r, _ in runs),
                    "lo": min(r["lo"] for r, _ in runs), "hi": max(r["hi"] for r, _ in runs),
                    "n": f"{' / '.join(sorted(n_rounds))} x {len(runs)} run{'s' if len(runs) > 1 else ''}",
                    "run_medians": [r["median"] for r, _ in runs], "stale": stale.get(key, [])}
    return out


def _settle(target: str, measured: str, status: str, paired, key, limit: float, at_most: bool = True,
            name: str = "") -> Check:
    """The target's Check; an "undecided" status settled by the paired re-measurement of the same ratio, where
    there is one (paired=True). A run of other kernel sources whose interval lies wholly on the other side of
    the limit keeps it undecided: it cannot vouch for this code, but its contradiction says the margin may not
    survive another machine."""
    d = (paired or {}).get(key)
    if status != "undecided" or d is None:
        return Check(target, measured, status, name=name)
    new = decided(d["lo"], d["hi"], limit, at_most)
    note = (f"{measured}; paired: {d['median']:.3f}× [{d['lo']:.3f}, {d['hi']:.3f}], {d['n']}"
            + (f" (run medians {', '.join(f'{v:.3f}' for v in d['run_medians'])})" if len(d["run_medians"]) > 1 else ""))
    against = [s for s in d.get("stale", []) if decided(s[1], s[2], limit, at_most) not in (new, "undecided")]
    if new != "undecided" and against:
        med, lo, hi = against[0]
        new = "undecided"
        note += f"; an earlier run on other kernel sources read {med:.3f}× [{lo:.3f}, {hi:.3f}]"
    return Check(target, note, new, paired=True, name=name)


BIG_SHAPES = ((14336, 4096), (4096, 14336), (28672, 4096), (28672, 8192))
MOE_FLOOR_LIMIT = 1.2                                    # one token: best int4 / read floor of routed bytes
MOE_OVER_BF16 = {"mixtral": 4.0, "olmoe": 15.0, "qwen3": 15.0}
BATCH_TOKENS, BATCH_FLOOR_LIMIT, BATCH_SPEEDUP = (4, 8, 16, 32, 64), 1.3, 2.0


def targets(rec, anchors=(), spread: float = 0.0, paired=None) -> list[Check]:
    """The named targets (target_definitions; graph replay, ratios measured in the same run) evaluated on the
    receipt; a target missed or met by less than `spread` (relative; run_to_run) is "undecided", unless `paired`
    (paired_ratios: the bench.decide re-measurement of the same kernels) puts its ratio's interval on one side."""
    anchors = same_card(rec, anchors)
    out = []

    def check(target, measured, status, key, limit, at_most=True, name=""):
        out.append(_settle(target, measured, status, paired, key, limit, at_most, name))
    for N, K in BIG_SHAPES:
        here = [r for r in rec["rows"] if r["layer"] != "moe" and (r["N"], r["K"]) == (N, K)]
        ours, fl = _us(rec, "int4_b32", N=N, K=K), _floor(here)
        check(f"{N}×{K}: int4_b32 ≤ 1.15× read floor", f"{_f(ours, 2)} / {_f(fl, 2)} µs = "
              f"{_f(_ratio(ours, fl), 2)}×", _within(_ratio(ours, fl), 1.15, spread),
              ("gemv", N, K, "int4_b32", "floor"), 1.15, name=GEMV_FLOOR)
    for s in all_shapes():
        w = {"model": s.model, "layer": s.layer, "N": s.N, "K": s.K}
        here = [r for r in rec["rows"] if all(r[k] == v for k, v in w.items())]
        ours, fl = _us(rec, "int4_b32", **w), _floor(here)
        peers = {i: _us(rec, i, **w) for i in ("bf16", "tinygemm", "gemlite")}
        peers["llama.cpp"] = llama_gemv_us(anchors, s.N, s.K)
        have = {k: v for k, v in peers.items() if v is not None}
        best = min(have.values()) if have else None
        missing = [k for k, v in peers.items() if v is None and k != "llama.cpp"]
        # slower than one measured peer is a miss whatever the others; a pass needs every re-measured peer
        ok = None if ours is None else False if best is not None and ours >= best else None if missing else True
        gap = f"; {', '.join(missing)} not measured" if missing else ""
        name = f"{s.model} {s.layer} {s.N}×{s.K}"
        out.append(Check(f"{name}: int4_b32 faster than every peer",
                         f"{_f(ours, 2)} µs vs best peer {_f(best, 2)} µs{gap}",
                         _status(ok, None if None in (ours, best) else ours / best - 1, spread),
                         name=GEMV_BESIDE_PEERS))
        check(f"{name}: int4_b32 ≤ 1.4× read floor", f"{_f(_ratio(ours, fl), 2)}×",
              _within(_ratio(ours, fl), 1.4, spread), ("gemv", s.N, s.K, "int4_b32", "floor"), 1.4,
              name=GEMV_BESIDE_PEERS)
    for name, speedup in MOE_OVER_BF16.items():
        here = [r for r in rec["rows"] if r["model"] == name and r["layer"] == "moe" and r["rows"] == 1]
        best, fl = best_ours_moe(rec, name, 1), _floor(here)
        impl = best_impl_moe(rec, name, 1)
        bf = _us(rec, "bf16_loop", model=name, layer="moe", rows=1)
        check(f"{name} one-token MoE layer ≤ {MOE_FLOOR_LIMIT}× read floor of routed bytes",
              f"{_f(best, 2)} / {_f(fl, 2)} µs = {_f(_ratio(best, fl), 2)}×",
              _within(_ratio(best, fl), MOE_FLOOR_LIMIT, spread), ("moe", name, 1, impl, "floor"), MOE_FLOOR_LIMIT,
              name=ONE_TOKEN_MOE)
        lead = _ratio(bf, best)
        check(f"{name} one-token MoE layer ≥ {speedup:g}× the bf16 loop", f"{_f(lead, 2)}×",
              _status(None if lead is None else lead >= speedup, None if lead is None else lead / speedup - 1, spread),
              ("moe", name, 1, "bf16_loop", impl), speedup, at_most=False, name=ONE_TOKEN_MOE)
    for name in MOE_OVER_BF16:
        for T in BATCH_TOKENS:
            here = [r for r in rec["rows"] if r["model"] == name and r["layer"] == "moe" and r["rows"] == T]
            best, fl = best_ours_moe(rec, name, T), _floor(here)
            impl = best_impl_moe(rec, name, T)
            bf, gm = (_us(rec, i, model=name, layer="moe", rows=T) for i in MOE_PEERS)
            check(f"{name} MoE, {T} tokens: best int4 ≤ {BATCH_FLOOR_LIMIT}× read floor of unique experts",
                  f"{_f(_ratio(best, fl), 2)}×", _within(_ratio(best, fl), BATCH_FLOOR_LIMIT, spread),
                  ("moe", name, T, impl, "floor"), BATCH_FLOOR_LIMIT, name=BATCHED_MOE)
            slow = min((t for t in (bf, gm) if t is not None), default=None)
            ok = None if best is None or None in (bf, gm) else slow / best >= BATCH_SPEEDUP
            edge = f" ({slow / best:.3f}×)" if ok is not None and abs(slow / best / BATCH_SPEEDUP - 1) < spread else ""
            out.append(Check(f"{name} MoE, {T} tokens: best int4 ≥ {BATCH_SPEEDUP:g}× faster than bf16 loop and "
                             "grouped_mm", f"bf16 loop {_f(_ratio(bf, best), 2)}×, grouped_mm "
                             f"{_f(_ratio(gm, best), 2)}×{edge}",
                             _status(ok, None if ok is None else slow / best / BATCH_SPEEDUP - 1, spread),
                             name=BATCHED_MOE))
    return out


def targets_table(checks) -> str:
    lines = ["| target | check | measured | status |", "|---|---|---|---|"]
    lines += [_line([c.name, c.target, c.measured, c.status]) for c in checks]
    return "\n".join(lines)


def target_definitions() -> str:
    """The targets' names and what each asks, from the limits the checks use (one place: RESULTS.md prints it)."""
    big = ", ".join(f"{N}×{K}" for N, K in BIG_SHAPES)
    leads = " / ".join(f"{v:g}×" for v in MOE_OVER_BF16.values())
    models = " / ".join(bench_label(m) for m in MOE_OVER_BF16)
    tokens = f"{BATCH_TOKENS[0]}–{BATCH_TOKENS[-1]}"
    return "\n".join([
        f"- **{GEMV_FLOOR}**: each big batch-1 GEMV ({big}) takes at most 1.15× its read floor.",
        f"- **{GEMV_BESIDE_PEERS}**: every batch-1 decode shape of the three models is faster than bf16 cuBLAS, "
        "tinygemm, GemLite and the llama.cpp Q4_0 time recorded on the same card (where one is), and takes at "
        "most 1.4× its read floor.",
        f"- **{ONE_TOKEN_MOE}**: the MoE layer at one token (gate_up, SwiGLU, down, weighted combine) takes at most "
        f"{MOE_FLOOR_LIMIT}× the read floor of its routed experts' bytes and is at least {leads} faster than the "
        f"bf16 per-expert loop ({models}).",
        f"- **{BATCHED_MOE}**: the MoE layer at {tokens} tokens takes at most {BATCH_FLOOR_LIMIT}× the read floor of "
        f"the unique routed experts' bytes and is at least {BATCH_SPEEDUP:g}× faster than both the bf16 loop and "
        "`torch._grouped_mm`.",
        "",
        "The **read floor** of a row is the time of a kernel that only reads the same int4-b32 bytes, timed the same "
        "way in the same run (`lab/bench/floor.py`), so every ratio is measured on one GPU in one run.",
    ])


def misses_table(checks) -> str:
    """The checks that miss (or are undecided), by named target: the kernel notes' table of what is left."""
    left = [c for c in checks if c.status in ("miss", "undecided")]
    if not left:
        return "Every target is met."
    lines = ["| target | check | measured | status |", "|---|---|---|---|"]
    lines += [_line([c.name, c.target, c.measured, c.status]) for c in left]
    return "\n".join(lines)


def render(rec, anchors=(), spread: float = 0.0, paired=None) -> str:
    """RESULTS.md's decode block: provenance, method, GEMV, MoE and target tables, skipped count. `spread`: the
    run-to-run spread (run_to_run) under which a target's margin is "undecided"; `paired` (paired_ratios)
    settles such a target where it holds the same ratio."""
    p = rec["provenance"]
    checks = targets(rec, anchors, spread, paired)
    n_settled = sum(c.paired for c in checks)
    n_pass = sum(c.status == "pass" for c in checks)
    n_none = sum(c.status == "not measured" for c in checks)
    n_open = sum(c.status == "undecided" for c in checks)
    has_floor = any("floor_us" in r for r in rec["rows"])
    parts = [
        stale_note(DEFAULT_OUT, rec) +
        f"Generated by `python -m lab.report --results RESULTS.md` from `data/receipts/{DEFAULT_OUT.name}` "
        f"({p.get('device')}, torch {p.get('torch')}, triton {p.get('triton')}, commit `{p.get('commit')}`, "
        f"{p.get('date')}; `{portable_command(p.get('command'))}`). µs per call, median of "
        + ("samples of at least 16 calls (CUDA-graph replays back to back)" if rec.get("method", {}).get("min_calls")
           else "single CUDA-graph replays")
        + (", each queued behind a GPU busy-wait so that no host delay lands inside it"
           if rec.get("method", {}).get("prefill_cycles") else "")
        + (f", after {rec['method']['warmup_ms']:.0f} ms of replays (the GPU's slow first ~10 ms of load stay out)"
           if rec.get("method", {}).get("warmup_ms") else "") +
        ", weights rotated beyond L2. Read floor: a kernel that only reads the row's int4-b32 bytes (MoE: the "
        "unique routed experts'), best of a few launch configurations, timed the same way in the same run; "
        "a peer's cell gives its µs and (peer / int4_b32)."
        + (f" One launch costs {rec['launch']['us']:.2f} µs in a graph (the floor kernel over one word)."
           if "launch" in rec else "")
        + ("" if has_floor else " **This receipt predates the read floor**: its floor and ratio columns read –.")
        + ("" if rec.get("method", {}).get("complete", True) else
           " **Partial run**: the harness stopped before its schedule was done."),
        "**Batch-1 GEMV, µs**\n\n" + gemv_table(rec, anchors),
        "**MoE layer (gate_up, SwiGLU, down, weighted combine), µs**\n\n" + moe_table(rec, anchors),
        peer_table.render(rec),          # every implementation over its own read floor (lab/bench/peer_table.py)
        f"**Targets: {n_pass} of {len(checks)} met, {n_open} undecided, {n_none} not measured**"
        + (f" (undecided: met or missed by less than {100 * spread:.1f} %, the 90th percentile of how far the same "
           "torch kernels' medians moved between two bench runs, `report.run_to_run`)" if spread else "")
        + (f". {n_settled} targets within that spread were re-measured in paired rounds "
           "(`python -m lab.bench.decide`, `data/receipts/decide_h200_*.json`, one file per run, the same kernel "
           "sources): each such row gives the ratio's median and the hull of every process's and run's 95 % "
           "interval, and its status is decided only where that hull lies on one side of the limit and no earlier "
           "run on other kernel sources lies wholly on the other side" if n_settled else "")
        + "\n\n" + targets_table(checks),
    ]
    if rec["skipped"]:
        parts.append(f"{len(rec['skipped'])} measurements were skipped; "
                     "the receipt's `skipped` list gives each reason.")
    return "\n\n".join(parts)


# ---- figures (matplotlib imported only here) ------------------------------------------------------------
GEMV_COLORS = {"int4_b32": "tab:red", "w4a16_cutlass": "tab:orange", "bf16": "tab:gray", "tinygemm": "tab:blue",
               "gemlite": "tab:green", "marlin": "tab:cyan"}
MOE_COLORS = {"int4_b32_moe": "tab:red", "int4_b32_grouped": "tab:purple", "bf16_loop": "tab:gray",
              "grouped_mm": "tab:brown"}


GEMV_LABELS = {"int4_b32": "int4_b32 (ours, W4A8, tuned plan)",
               "w4a16_cutlass": "w4a16_cutlass (ours, W4A16, untuned)",
               "bf16": "bf16 cuBLAS (16-bit weights)",
               "tinygemm": "tinygemm (torch, W4A16)",
               "gemlite": "GemLite (W4A16)",
               "marlin": "Marlin (W4A16 g128)"}


def floor_fixed_share(rec) -> dict[int, float]:
    """{bytes: share} per read floor of the receipt: the part of the floor's time that streaming its bytes at the
    fastest floor's rate does not explain, 1 - (bytes / fastest bytes-per-µs) / µs. Near 1 the floor is a measured
    kernel dominated by its launch and tail, not a bandwidth bound."""
    floors = rec.get("floor") or []
    if not floors:
        return {}
    rate = max(f["bytes"] / f["us"] for f in floors)
    return {f["bytes"]: 1.0 - (f["bytes"] / rate) / f["us"] for f in floors}


def plot_time_over_floor(rec, ax=None, fixed_share: float = 0.5):
    """Time per call over the read floor of int4-b32's bytes, per GEMV shape (x) and implementation (markers); the
    line at 1 is that floor, which belongs to int4-b32's bytes only (bf16 moves 16/4.5 as many bytes). Shapes whose
    floor is more than `fixed_share` fixed cost (`floor_fixed_share`) are shaded: there the floor is a measured
    kernel, launch-dominated, not a bound. Shapes without a floor are left out."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(12, 4.5))[1]
    shapes = []
    for model, layer, N, K in gemv_shapes(rec):
        fl = _row(rec, "int4_b32", model=model, layer=layer, N=N, K=K)
        if fl and "floor_us" in fl:
            shapes.append((model, layer, N, K, fl))
    share = floor_fixed_share(rec)
    impls = [i for i in GEMV_COLORS if any(r["impl"] == i for r in rec["rows"])]
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for i, (model, layer, N, K, fl) in enumerate(shapes):
            r = _row(rec, impl, model=model, layer=layer, N=N, K=K)
            if r:
                xs.append(i + (j - (len(impls) - 1) / 2) * width)
                ys.append(r["us"] / fl["floor_us"])
        ax.plot(xs, ys, "o", ms=5, label=GEMV_LABELS.get(impl, impl), color=GEMV_COLORS[impl])
    shaded = False
    for i, (model, layer, N, K, fl) in enumerate(shapes):
        if share.get(fl["floor_bytes"], 0.0) > fixed_share:
            ax.axvspan(i - 0.5, i + 0.5, color="0.9", zorder=0,
                       label=None if shaded else f"floor > {fixed_share:.0%} fixed cost: a measured kernel, not a bound")
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


def rewrite_readme(readme, block: str, start: str = START, end: str = END) -> Path:
    """Replace the text between the `start` and `end` markers in `readme` with `block`."""
    readme = Path(readme)
    text = readme.read_text()
    if start not in text or end not in text or text.index(start) > text.index(end):
        raise ValueError(f"{readme} must contain {start} followed by {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    write_text_atomic(readme, f"{head}{start}\n{block}\n{end}{tail}")
    return readme


# ------------------------------------------------------------------ the other receipts: models, gates, packing
RESULTS_START, RESULTS_END = "<!-- results-table:start -->", "<!-- results-table:end -->"


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
    """The gate receipts' table: Δ% [95 % CI] per text, PASS / FAIL / UNDECIDED, lottery and calibration.
    A receipt made with partial settings (partial_settings) is refused (ValueError), never tabulated."""
    from int4lab.gate.table import render_gate_table
    for path in sorted(Path(receipts).glob("gate_*.json")):
        refuse_partial(read_receipt(path), path)
    return render_gate_table(receipts)


def pack_table(receipts=RECEIPTS) -> str:
    """Pack time per layer: round-to-nearest and GPTQ, median wall seconds."""
    lines = ["| device | N×K | impl | seconds (median) |", "|---|---|---|---|"]
    for path in sorted(Path(receipts).glob("gptq_pack_*.json")):
        r = read_receipt(path)
        for row in r["rows"]:
            lines.append(_line([r["provenance"]["device"], f"{row['N']}×{row['K']}", row["impl"],
                                f"{row['seconds']:.3g}"]))
    return "\n".join(lines)


REALSCALE_START, REALSCALE_END = "<!-- realscale-table:start -->", "<!-- realscale-table:end -->"


def _gb(x) -> str:
    return "–" if x is None else f"{x / 2 ** 30:.1f} GiB"


def _s(x) -> str:
    return "–" if x is None else f"{x:.3g} s"


def _receipts(pattern: str, receipts=RECEIPTS) -> list[tuple[Path, dict]]:
    return [(p, read_receipt(p)) for p in sorted(Path(receipts).glob(pattern))]


def _not_yet(name: str, module: str, stage: str) -> str:
    return (f"*Not yet measured*: no `data/receipts/{name}`. It is written by `python -m {module}` on a GPU "
            f"(`lab/gpu_run.sh`, stage `{stage}`).")


def stale_note(path: Path, rec: dict) -> str:
    """"" when the receipt measured the sources this tree holds; else a bold line saying it did not, with
    receipts.STALE's reason when the staleness is acknowledged there. A receipt from before receipts named their
    sources measured the kernels (its kernel_sources_sha256)."""
    p = rec["provenance"]
    src = p.get("sources") or {"kind": "kernels", "sha256": p.get("kernel_sources_sha256")}
    if src["sha256"] == sources_hash(src["kind"]):
        return ""
    why = STALE.get(Path(path).name, "not acknowledged in int4lab/receipts.py STALE: regenerate it")
    return f"**Stale: `{Path(path).name}` measured earlier {src['kind']} sources**: {why}.\n\n"


def realscale_table(receipts=RECEIPTS) -> str:
    """The README's gate command at the published width (`python -m lab.realscale_gate`): per architecture and
    measured depth, the gate's wall time, the time inside its forwards, its peaks and verdicts; then each quantity
    fitted as fixed + layers x per_layer and taken to the published depth (the arithmetic in the receipt), against
    the targets. Then the many-row scoring path's bench (`prefill_*.json`). "not yet measured" without receipts."""
    found = _receipts("realscale_gate_*.json", receipts)
    if not found:
        return _not_yet("realscale_gate_<arch>_<card>.json", "lab.realscale_gate", "gate")
    out = []
    for path, r in found:
        lines = [stale_note(path, r) + f"`data/receipts/{path.name}` ({_prov(r)}; "
                 f"`{portable_command(r['provenance'].get('command'))}`):", "",
                 "| model | layers | gate | build arms (by kind, s) | score | inside forwards | gate / forwards | GPU peak | "
                 "host peak | arms in groups | verdicts |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for arch, a in sorted(r.get("archs", {}).items()):
            for L, d in sorted(a.get("depths", {}).items(), key=lambda kv: int(kv[0])):
                g = d.get("gate")
                if not g:
                    lines.append(_line([arch, L, "error" if d.get("error") else "skipped"] + ["–"] * 8))
                    continue
                tm = g["timing"]
                fw = tm["forward_s"] + tm.get("calibration_forward_s", 0.0)
                v = list(g["verdicts"].values())
                verdicts = ", ".join(f"{v.count(k)} {k}" for k in ("PASS", "FAIL", "UNDECIDED") if v.count(k))
                bk = g.get("build_s_by_kind") or {}
                build = _s(tm["build_s"]) + (" (" + ", ".join(f"{k} {v:.3g}" for k, v in sorted(bk.items())) + ")"
                                             if bk else "")
                lines.append(_line([arch, f"{L} of {a['full_layers']}", _s(g["s"]), build,
                                    _s(tm["score_s"]), _s(fw), f"{g['s'] / fw:.1f}", _gb(g["gpu_peak_bytes"]),
                                    _gb(g["host_peak_bytes"]), " + ".join(map(str, g["groups"])), verdicts]))
            ex = a.get("extrapolation") or {}
            if not ex:
                continue
            t, mem = ex["targets"], ex.get("memory") or {}
            gof = t["gate_over_forwards"]
            lines.append(_line([arch, f"**{ex['full_layers']} (fitted)**",
                                f"**{_s(t['gate_s']['value'])}** (target ≤ {t['gate_s']['target']:.0f} s: "
                                f"{'met' if t['gate_s']['met'] else 'missed'})",
                                _s(ex["fits"]["build_s"]["full_depth"]), _s(ex["fits"]["score_s"]["full_depth"]),
                                "–", f"**{gof['value']:.1f}** (target ≤ {gof['target']}: "
                                f"{'met' if gof['met'] else 'missed'})", _gb(mem.get("peak_bytes")) + " predicted",
                                _gb(ex["fits"]["host_peak_bytes"]["full_depth"]),
                                f"{mem.get('arms_per_group')} per group, {mem.get('groups')} groups" if mem else "–",
                                "–"]))
            warn = [f"`{k}` ({v['warning']})" for k, v in ex["fits"].items() if v.get("warning")]
            lines += ["", f"Fitted rows: {r['settings']['extrapolation']}; memory: {mem.get('formula', '–')}."
                      + (f" Fits the fit itself flags: {', '.join(warn)}; a negative predicted extra time counts as 0 s."
                         if warn else "")]
        out.append("\n".join(lines))
    for path in sorted(Path(receipts).glob("prefill_*.json")):
        r = read_receipt(path)
        st = r["settings"]
        rows = "; ".join(f"{row['batch']}: many-row path {row['prefill_over_bf16']:.3f}×, decode path "
                         f"{row['decode_over_bf16']:.2f}× (logits against the decode path: max relative "
                         f"{row['logits']['prefill_vs_decode']['max_rel']:.3f})" for row in r["rows"])
        out.append(stale_note(path, r) + f"Scoring throughput against bf16 (`data/receipts/{path.name}`, {_prov(r)}; "
                   f"{st['arch']} at the published width, {st['layers']} layers, {st['targets']}, tokens/s over "
                   f"bf16 with {st['experts_implementation']} experts): {rows}. Target ≥ "
                   f"{r['target']['prefill_over_bf16_min']}×: {'met' if r['target']['met'] else 'missed'}.")
    return "\n\n".join(out)


DECODE_STEP_START, DECODE_STEP_END = "<!-- decode-step:start -->", "<!-- decode-step:end -->"


def decode_step_table(receipts=RECEIPTS) -> str:
    """What int4 buys in a whole decode step (`python -m lab.decode_step`): per model, batch and context, one
    layer's time graphed against its read floor, int4 (today's modules) and int4_fused (`fuse_decode`) beside the
    best bf16 (the fastest experts implementation, graphed or compiled), tokens/s at the published depth against
    that bf16, and eager int4 against eager bf16. From the receipt's own `summary`; "–" where it measured nothing."""
    found = _receipts("decode_step_*.json", receipts)
    if not found:
        return _not_yet("decode_step_<card>.json", "lab.decode_step", "step")
    out = []
    for path, r in found:
        lines = ["| model | batch, context | read floor / layer | int4 graphed | int4_fused graphed | best bf16 | "
                 "tokens/s int4_fused / best bf16 | eager int4 / eager bf16 | eager int4_fused / eager bf16 |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for arch, a in r.get("archs", {}).items():
            for case, v in a.get("summary", {}).items():
                fl = v.get("int4_floor_us")
                ratio = lambda k: (f"{v[k]:.1f} µs ({v[k] / fl:.2f}×)" if v.get(k) and fl else _f(v.get(k)))  # noqa: E731
                bb = v.get("best_bf16") or {}
                lines.append(_line([
                    arch, case.replace("B", "").replace(" C", ", "), f"{fl:.1f} µs" if fl else "–",
                    ratio("int4_graphed_per_layer_us"), ratio("int4_fused_graphed_per_layer_us"),
                    f"{bb['per_layer_us']:.1f} µs ({bb.get('impl')}, {bb.get('run')})" if bb else "–",
                    _f(v.get("int4_fused_over_best_bf16_tokens_per_s"), 2) + "×",
                    _f(v.get("int4_eager_over_default_bf16_eager"), 2) + "×",
                    _f(v.get("int4_fused_eager_over_default_bf16_eager"), 2) + "×"]))
        errs = {arch: sorted(a.get("errors") or {}) for arch, a in r.get("archs", {}).items() if a.get("errors")}
        out.append(stale_note(path, r) + "\n".join(lines) + "\n\n" + (
            f"Parts that failed (their errors are in the receipt): {errs}. " if errs else "") +
            "Eager columns: per layer = step(2 layers) − step(1 layer) from the run's eager samples; chapter 07 decides "
            f"a target only beyond the samples' spread. `{path.name}`: {_prov(r)}.")
    return "\n\n".join(out)


def render_results(receipts=RECEIPTS) -> str:
    return "\n\n".join([
        "Generated by `python -m lab.report --results RESULTS.md` from the receipts in `data/receipts/`.",
        "**The small trained models** (`data/models/`, trained on Shakespeare's plays; ood = KJV)", train_table(receipts),
        "**Perplexity gates on the small models** (notebook 04; budget 1% relative perplexity)", gate_table(receipts),
        "**GPTQ pack time per layer**", pack_table(receipts)])


# ------------------------------------------------------------------ the kernel notes' misses, the README's layout
TARGETS_START, TARGETS_END = "<!-- targets:start -->", "<!-- targets:end -->"
MISSES_START, MISSES_END = "<!-- misses:start -->", "<!-- misses:end -->"
LAYOUT_START, LAYOUT_END = "<!-- layout:start -->", "<!-- layout:end -->"


def misses_block(rec, anchors=(), spread: float = 0.0, paired=None) -> str:
    """The kernel notes' table of the targets the receipt misses (or leaves undecided), with its provenance."""
    p = rec["provenance"]
    checks = targets(rec, anchors, spread, paired)
    n_pass = sum(c.status == "pass" for c in checks)
    return (f"Generated by `python -m lab.report --notes notes/kernels.md` from `data/receipts/{DEFAULT_OUT.name}` "
            f"({p.get('device')}, commit `{str(p.get('commit'))[:12]}`, {str(p.get('date'))[:10]}): {n_pass} of "
            f"{len(checks)} targets met. The targets are defined in RESULTS.md.\n\n" + misses_table(checks))


# The README's tree: one line per folder, what it holds (written here) and its size (counted from the checkout).
LAYOUT = (
    ("int4lab/", "the library: the format, its packers (RTN, GPTQ, clip), Q4_0 and Paddle layouts, GGUF export"),
    ("int4lab/kernels/", "the Triton kernels a launch plan runs, their launchers, the plans per GPU"),
    ("int4lab/quantize/", "quantize_model: a model's layers, the int4 modules, the Hessian hook, save / load"),
    ("int4lab/gate/", "the perplexity gate: texts, scoring, paired bootstrap, decode parity, lm-eval"),
    ("int4lab/models/", "the small models' configurations, checkpoint and tokenizer loaders"),
    ("int4lab/archs/", "one record per architecture: module layout, config keys, GGUF names, published configs"),
    ("lab/", "tools run from the repository root: report, real-width run, training, llama.cpp judge, ..."),
    ("lab/bench/", "the timing harness: one CUDA-graph timer, the read floor, peers, paired rounds"),
    ("lab/tune/", "launch-plan sweeps, the compiler's resource report, graph-replay determinism"),
    ("lab/chapters/", "the chapters' experiments: format variants, calibration, GPTQ, accuracy"),
    ("notebooks/", "the chapters"),
    ("tests/", "pytest; the same suite runs on the CPU interpreter and on CUDA"),
    ("notes/", "the kernel notes (floor, plan rows' evidence, misses) and the real-width run"),
    ("data/", "what the chapters read: models, texts, tokenizer, receipts"),
    ("data/receipts/", "every measurement with its provenance; every table and figure reads these"),
    ("data/models/", "the three small trained models' checkpoints"),
    ("data/corpus/", "the texts they are trained and judged on, with provenance"),
    ("data/tokenizer/", "their tokenizer"),
    ("data/tasks/", "lm-eval task definitions for the gate"),
    ("figures/", "the chapters' figures (make notebooks rewrites them)"),
)
_COUNTED = (".py", ".md", ".sh")


def tracked_files(root=None) -> list[str]:
    """Paths of the files git tracks under `root` (default: the repository), relative to it; every file under it
    but .git and .venv where git is not available."""
    import subprocess
    from int4lab.paths import ROOT
    root = Path(root or ROOT)
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        return sorted(f for f in out.decode().split("\0") if f and (root / f).is_file())
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv"}
        return sorted(str(f.relative_to(root)) for f in root.rglob("*")
                      if f.is_file() and not skip & set(f.relative_to(root).parts))


def folder_sizes(root=None, folders=None) -> dict[str, tuple[int, int]]:
    """{folder: (tracked files under it, lines of its Python / Markdown / shell files)} for LAYOUT's folders."""
    from int4lab.paths import ROOT
    root = Path(root or ROOT)
    files = tracked_files(root)
    out = {}
    for folder in folders or [f for f, _ in LAYOUT]:
        mine = [f for f in files if f.startswith(folder)]
        lines = sum(len((root / f).read_text(errors="replace").splitlines()) for f in mine if f.endswith(_COUNTED))
        out[folder] = (len(mine), lines)
    return out


def layout_block(root=None) -> str:
    """The README's tree: one line per LAYOUT folder, its size, and what it holds."""
    sizes = folder_sizes(root)
    rows = []
    for folder, what in LAYOUT:
        depth = folder.rstrip("/").count("/")
        name = "  " * depth + folder.rstrip("/").split("/")[-1] + "/"
        n, lines = sizes[folder]
        size = f"{n} files" + (f", {lines:,} lines" if lines else "")
        rows.append((name, size, what))
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    body = "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)
    return ("Generated by `python -m lab.report --readme README.md`: tracked files per folder, and the lines of its "
            "Python, Markdown and shell files.\n\n```text\n" + body + "\n```")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--receipt", type=Path, default=DEFAULT_OUT, help="decode receipt to tabulate")
    ap.add_argument("--results", type=Path, default=None,
                    help="rewrite this file's generated blocks (RESULTS.md): the targets, the decode tables, the "
                         "real-width checkpoints, the models / gates / packing")
    ap.add_argument("--readme", type=Path, default=None,
                    help="rewrite this file's layout block (README.md): each folder and its size")
    ap.add_argument("--notes", type=Path, default=None,
                    help="rewrite this file's misses block (notes/kernels.md): the targets the receipt misses")
    ap.add_argument("--pages", type=Path, nargs="*", default=[],
                    help="other pages whose real-width and decode-step blocks to rewrite (notes/realscale.md)")
    ap.add_argument("--anchors", type=Path, default=ANCHORS, help="folder with recorded llama.cpp timings")
    args = ap.parse_args(argv)
    if args.readme:
        print(f"rewrote {rewrite_readme(args.readme, layout_block(), LAYOUT_START, LAYOUT_END)}")
        if not (args.results or args.notes or args.pages):
            return 0
    if not args.receipt.exists():
        print(f"no receipt at {args.receipt}: run `python -m lab.bench` on a CUDA machine first", file=sys.stderr)
        return 2
    rec = load(args.receipt)
    spread = (run_to_run(rec, load(repeat_of(rec))) if repeat_of(rec).exists() else None) or 0.0
    anchors, paired = anchor_rows(args.anchors), paired_ratios(rec)
    block = render(rec, anchors, spread, paired)
    if args.results:
        try:                                     # whole runs only, checked before anything is rewritten
            refuse_partial(rec, args.receipt)
            text = Path(args.results).read_text()
            results = render_results() if RESULTS_START in text else None
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"rewrote {rewrite_readme(args.results, block)}")
        if TARGETS_START in text:                                # the named targets' definitions
            rewrite_readme(args.results, target_definitions(), TARGETS_START, TARGETS_END)
        if results is not None:                                  # the models / gates / packing block
            rewrite_readme(args.results, results, RESULTS_START, RESULTS_END)
        if REALSCALE_START in text:                              # the real-checkpoint block
            rewrite_readme(args.results, realscale_table(), REALSCALE_START, REALSCALE_END)
        if DECODE_STEP_START in text:                            # the whole decode step
            rewrite_readme(args.results, decode_step_table(), DECODE_STEP_START, DECODE_STEP_END)
    for page in args.pages:
        text = Path(page).read_text()
        for start, end, fn in ((REALSCALE_START, REALSCALE_END, realscale_table),
                               (DECODE_STEP_START, DECODE_STEP_END, decode_step_table)):
            if start in text:
                print(f"rewrote {rewrite_readme(page, fn(), start, end)}")
    if args.notes:
        misses = misses_block(rec, anchors, spread, paired)
        print(f"rewrote {rewrite_readme(args.notes, misses, MISSES_START, MISSES_END)}")
    if not (args.results or args.notes or args.pages):
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
