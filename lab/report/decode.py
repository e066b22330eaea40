"""The decode receipt's tables: the recorded llama.cpp references, the GEMV and MoE rows against their read
floors and peers, and the series the figures draw. Shape legend as in lab.report."""
from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

from lab.bench import peer_table
from lab.bench.schema import DEFAULT_OUT, OURS_MOE, validate_receipt
from lab.bench.shapes import MODELS
from lab.paths import RECEIPTS
from lab.provenance import read_receipt


ANCHORS = RECEIPTS / "anchors"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
LLAMA = "llama.cpp Q4_0 (recorded)"
# peers timed in the receipt; llama.cpp's rows: ggml (its file named for the card; time and device not recorded), by its own eager timer and by the bench's
GEMV_PEERS = ("w4a16_cutlass", "bf16", "tinygemm", "gemlite", "marlin", "llamacpp_q4_0", "llamacpp_q4_0_rot")
MOE_PEERS = ("bf16_loop", "grouped_mm")
MOE_LLAMA = ("llamacpp_q4_0_moe", "llamacpp_q4_0_rot_moe")
# what the Marlin timed is: the pages say it wherever a table or target names Marlin
MARLIN_BUILD = ("a build from IST-DASLab's Marlin source with its weight loads' L2 evict-first cache hint removed "
                "(a workaround for CUDA 13's ptxas), not an unmodified Marlin; the patch's effect on its time is not "
                "measured")
# column names of Marlin's and llama.cpp's rows († ggml's eager timer, ‡ ggml's rotating harness, on weights of its own; both host wall clock: the legend under the peer tables)
LABELS = {"marlin": "marlin (patched build)",
          "llamacpp_q4_0": "llama.cpp Q4_0 (eager)†", "llamacpp_q4_0_rot": "llama.cpp Q4_0 (rotated)‡",
          "llamacpp_q4_0_moe": "llama.cpp Q4_0 MUL_MAT_ID (eager)†",
          "llamacpp_q4_0_rot_moe": "llama.cpp Q4_0 MUL_MAT_ID (rotated)‡"}


def _timed(rec, impls) -> list[str]:
    """The implementations of `impls` the receipt has rows of (a peer it never timed gets no column)."""
    have = {r["impl"] for r in rec["rows"]}
    return [i for i in impls if i in have]


@contextlib.contextmanager
def reading(path):
    """Errors met while reading or tabulating the receipt (or page) at `path` become one ValueError naming it:
    truncated JSON, an unreadable file, a missing field, never a bare KeyError from deep inside a table."""
    try:
        yield
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON (truncated or corrupt?): {e}") from None
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"{path}: not a usable receipt (missing or malformed field: {type(e).__name__} {e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None


def read(path) -> dict:
    """read_receipt, its errors naming the file (`reading`); a receipt is a JSON object."""
    with reading(path):
        rec = read_receipt(path)
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: not a receipt (a JSON {type(rec).__name__}, not an object)")
    return rec


def load(path=DEFAULT_OUT) -> dict:
    """Read and validate a decode receipt (ValueError naming the file when it is not one)."""
    rec = read(path)
    try:
        validate_receipt(rec)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return rec


# ---- partial runs: shown when printed, refused for the README ---------------------------------------------
def partial_settings(rec: dict) -> list[str]:
    """Why a receipt does not hold a whole run ([] when it does). A decode receipt: a harness stopped before
    its schedule was done, the --quick schedule, an --only subset of implementations. A gate receipt: max_docs
    set (the first n documents of each text) or a subset of the texts."""
    why = []
    method, settings = rec.get("method") or {}, rec.get("settings") or {}
    command = str((rec.get("provenance") or {}).get("command", ""))
    if rec.get("complete") is False:                     # a run that stopped, or one still writing
        why.append("complete is false (" + (f"interrupted: {rec['interrupted']}" if rec.get("interrupted") else
                                            "the run had not finished when it was written") + ")")
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
        with reading(f):
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
    peers = _timed(rec, GEMV_PEERS)
    head = ["model", "layer", "N×K", "read floor", "int4_b32", "int4_b32 / floor"] + \
        [LABELS.get(i, i) for i in peers] + ([LLAMA] if anchors else []) + ["int4_b32 GB/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, layer, N, K in gemv_shapes(rec):
        w = {"model": model, "layer": layer, "N": N, "K": K}
        here = [r for r in rec["rows"] if all(r[k] == v for k, v in w.items())]
        ours = _us(rec, "int4_b32", **w)
        fl = _floor(here)
        cells = [model, layer, f"{N}×{K}", _f(fl), _f(ours), _f(_ratio(ours, fl), 2)]
        cells += [_vs(_us(rec, i, **w), ours) for i in peers] + ([_vs(llama_gemv_us(anchors, N, K), ours)]
                                                                   if anchors else [])
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
    generation (tests/lab/test_bench.py checks the two agree)."""
    from int4lab.kernels import plan
    m = MODELS[model]
    L = tokens * m.top_k
    N, K = 2 * m.intermediate, m.hidden
    return [p for mean, weights, p in plan.GROUPED_TABLE[generation]
            if L / max(1, min(m.n_experts, L)) >= mean and N * K >= weights][-1]


def moe_table(rec, anchors=()) -> str:
    anchors = same_card(rec, anchors)
    head = ["model", "tokens", "experts read", "read floor", "bf16 at its read floor", "int4-b32 routed GEMV",
            "int4-b32 grouped", "best int4 / floor", "bf16 loop", "grouped_mm (bf16)"]
    llamas = _timed(rec, MOE_LLAMA)
    head += [LABELS[i] for i in llamas] + (["llama.cpp Q4_0 routed (recorded)"] if anchors else [])
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
        cells += [_vs(_us(rec, i, **w), best) for i in MOE_PEERS + tuple(llamas)] + ([_vs(llama, best)] if anchors else [])
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


CARDS = ("H100", "H200")


def card(rec) -> str:
    """The card a receipt was measured on ("H100", "H200"), else its device string."""
    dev = str(rec.get("provenance", {}).get("device", ""))
    return next((c for c in CARDS if c in dev), dev)
