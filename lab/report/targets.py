"""The named performance targets checked against a decode receipt: pass, miss, undecided (within the run-to-run
spread, unless paired rounds settle it) or not measured; and RESULTS.md's decode block."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from int4lab.archs import bench_label
from lab.bench import peer_table
from lab.bench.decide import decided
from lab.bench.schema import DEFAULT_OUT
from lab.bench.shapes import all_shapes
from lab.paths import RECEIPTS
from lab.provenance import portable_command
from .decode import (MARLIN_BUILD, MOE_PEERS, read, _f, _floor, _line, _ratio, _us, best_impl_moe, best_ours_moe, card, gemv_table,
                     llama_gemv_us, moe_table, same_card)


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
    margin: float | None = None  # measured / limit - 1 (the side that meets the limit depends on the target)


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
# committed receipt and an earlier full bench run on the same card (decode_<card>_<commit>.json, repeat_of). A
# target closer than that is "undecided"; without such a run the spread is unknown and every target is decided.
def repeat_of(rec, receipts=RECEIPTS) -> Path | None:
    """The newest earlier full bench on the card `rec` was measured on (decode_<card>_*.json), for run_to_run;
    None when there is none."""
    found = sorted(Path(receipts).glob(f"decode_{card(rec).lower()}_*.json"))
    return found[-1] if found else None
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
        dec = read(path)
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
            name: str = "", margin: float | None = None) -> Check:
    """The target's Check; an "undecided" status settled by the paired re-measurement of the same ratio, where
    there is one (paired=True). A run of other kernel sources whose interval lies wholly on the other side of
    the limit keeps it undecided: it cannot vouch for this code, but its contradiction says the margin may not
    survive another machine."""
    d = (paired or {}).get(key)
    if status != "undecided" or d is None:
        return Check(target, measured, status, name=name, margin=margin)
    new = decided(d["lo"], d["hi"], limit, at_most)
    note = (f"{measured}; paired: {d['median']:.3f}× [{d['lo']:.3f}, {d['hi']:.3f}], {d['n']}"
            + (f" (run medians {', '.join(f'{v:.3f}' for v in d['run_medians'])})" if len(d["run_medians"]) > 1 else ""))
    against = [s for s in d.get("stale", []) if decided(s[1], s[2], limit, at_most) not in (new, "undecided")]
    if new != "undecided" and against:
        med, lo, hi = against[0]
        new = "undecided"
        note += f"; an earlier run on other kernel sources read {med:.3f}× [{lo:.3f}, {hi:.3f}]"
    return Check(target, note, new, paired=True, name=name, margin=margin)


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

    def check(target, measured, status, key, limit, at_most=True, name="", value=None):
        margin = None if value is None else value / limit - 1
        out.append(_settle(target, measured, status, paired, key, limit, at_most, name, margin))
    for N, K in BIG_SHAPES:
        here = [r for r in rec["rows"] if r["layer"] != "moe" and (r["N"], r["K"]) == (N, K)]
        ours, fl = _us(rec, "int4_b32", N=N, K=K), _floor(here)
        check(f"{N}×{K}: int4_b32 ≤ 1.15× read floor", f"{_f(ours, 2)} / {_f(fl, 2)} µs = "
              f"{_f(_ratio(ours, fl), 2)}×", _within(_ratio(ours, fl), 1.15, spread),
              ("gemv", N, K, "int4_b32", "floor"), 1.15, name=GEMV_FLOOR, value=_ratio(ours, fl))
    for s in all_shapes():
        w = {"model": s.model, "layer": s.layer, "N": s.N, "K": s.K}
        here = [r for r in rec["rows"] if all(r[k] == v for k, v in w.items())]
        ours, fl = _us(rec, "int4_b32", **w), _floor(here)
        peers = {i: _us(rec, i, **w) for i in ("bf16", "tinygemm", "gemlite", "marlin")}
        # llama.cpp Q4_0 timed in the run (the faster of its two timers), else a recording on the same card
        llama = [t for i in ("llamacpp_q4_0", "llamacpp_q4_0_rot") if (t := _us(rec, i, **w)) is not None]
        peers["llama.cpp"] = min(llama) if llama else llama_gemv_us(anchors, s.N, s.K)
        have = {k: v for k, v in peers.items() if v is not None}
        best = min(have.values()) if have else None
        missing = [k for k, v in peers.items() if v is None and k not in ("llama.cpp", "marlin")]
        # slower than one measured peer is a miss whatever the others; a pass needs every re-measured peer
        ok = None if ours is None else False if best is not None and ours >= best else None if missing else True
        gap = f"; {', '.join(missing)} not measured" if missing else ""
        name = f"{s.model} {s.layer} {s.N}×{s.K}"
        out.append(Check(f"{name}: int4_b32 faster than every peer",
                         f"{_f(ours, 2)} µs vs best peer {_f(best, 2)} µs{gap}",
                         _status(ok, None if None in (ours, best) else ours / best - 1, spread),
                         name=GEMV_BESIDE_PEERS, margin=None if None in (ours, best) else ours / best - 1))
        check(f"{name}: int4_b32 ≤ 1.4× read floor", f"{_f(_ratio(ours, fl), 2)}×",
              _within(_ratio(ours, fl), 1.4, spread), ("gemv", s.N, s.K, "int4_b32", "floor"), 1.4,
              name=GEMV_BESIDE_PEERS, value=_ratio(ours, fl))
    for name, speedup in MOE_OVER_BF16.items():
        here = [r for r in rec["rows"] if r["model"] == name and r["layer"] == "moe" and r["rows"] == 1]
        best, fl = best_ours_moe(rec, name, 1), _floor(here)
        impl = best_impl_moe(rec, name, 1)
        bf = _us(rec, "bf16_loop", model=name, layer="moe", rows=1)
        check(f"{name} one-token MoE layer ≤ {MOE_FLOOR_LIMIT}× read floor of routed bytes",
              f"{_f(best, 2)} / {_f(fl, 2)} µs = {_f(_ratio(best, fl), 2)}×",
              _within(_ratio(best, fl), MOE_FLOOR_LIMIT, spread), ("moe", name, 1, impl, "floor"), MOE_FLOOR_LIMIT,
              name=ONE_TOKEN_MOE, value=_ratio(best, fl))
        lead = _ratio(bf, best)
        check(f"{name} one-token MoE layer ≥ {speedup:g}× the bf16 loop", f"{_f(lead, 2)}×",
              _status(None if lead is None else lead >= speedup, None if lead is None else lead / speedup - 1, spread),
              ("moe", name, 1, "bf16_loop", impl), speedup, at_most=False, name=ONE_TOKEN_MOE, value=lead)
    for name in MOE_OVER_BF16:
        for T in BATCH_TOKENS:
            here = [r for r in rec["rows"] if r["model"] == name and r["layer"] == "moe" and r["rows"] == T]
            best, fl = best_ours_moe(rec, name, T), _floor(here)
            impl = best_impl_moe(rec, name, T)
            bf, gm = (_us(rec, i, model=name, layer="moe", rows=T) for i in MOE_PEERS)
            check(f"{name} MoE, {T} tokens: best int4 ≤ {BATCH_FLOOR_LIMIT}× read floor of unique experts",
                  f"{_f(_ratio(best, fl), 2)}×", _within(_ratio(best, fl), BATCH_FLOOR_LIMIT, spread),
                  ("moe", name, T, impl, "floor"), BATCH_FLOOR_LIMIT, name=BATCHED_MOE, value=_ratio(best, fl))
            slow = min((t for t in (bf, gm) if t is not None), default=None)
            ok = None if best is None or None in (bf, gm) else slow / best >= BATCH_SPEEDUP
            edge = f" ({slow / best:.3f}×)" if ok is not None and abs(slow / best / BATCH_SPEEDUP - 1) < spread else ""
            out.append(Check(f"{name} MoE, {T} tokens: best int4 ≥ {BATCH_SPEEDUP:g}× faster than bf16 loop and "
                             "grouped_mm", f"bf16 loop {_f(_ratio(bf, best), 2)}×, grouped_mm "
                             f"{_f(_ratio(gm, best), 2)}×{edge}",
                             _status(ok, None if ok is None else slow / best / BATCH_SPEEDUP - 1, spread),
                             name=BATCHED_MOE, margin=None if ok is None else slow / best / BATCH_SPEEDUP - 1))
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
        f"- **{GEMV_BESIDE_PEERS}**: every batch-1 decode shape of the three models, and the bench's two extra "
        "shapes (Mixtral's gate or up alone, a 28672x8192 stress shape), is faster than bf16 cuBLAS, "
        "tinygemm, GemLite, Marlin (where timed; a patched build, below) and llama.cpp Q4_0 on the same card (where "
        "timed: the faster of "
        "its two timers), and takes at "
        "most 1.4× its read floor.",
        f"- **{ONE_TOKEN_MOE}**: the MoE layer at one token (gate_up, SwiGLU, down, weighted combine) takes at most "
        f"{MOE_FLOOR_LIMIT}× the read floor of its routed experts' bytes and is at least {leads} faster than the "
        f"bf16 per-expert loop ({models}).",
        f"- **{BATCHED_MOE}**: the MoE layer at {tokens} tokens takes at most {BATCH_FLOOR_LIMIT}× the read floor of "
        f"the unique routed experts' bytes and is at least {BATCH_SPEEDUP:g}× faster than both the bf16 loop and "
        "`torch._grouped_mm`.",
        "",
        "The **read floor** of a row is the time of a kernel that only reads the same int4-b32 bytes, timed the same "
        "way in the same run (`lab/bench/floor.py`), so every ratio of a row the bench timed is measured on one GPU in "
        "one run; the llama.cpp columns are ggml's own timings from separate processes and other timers (their "
        "footnotes), merged into the receipt afterwards (`lab/bench/ggml_peer.py`), which records neither when nor on "
        "which device those processes ran (only the merged files' names say H100), so their ratios cross timers and "
        "rest on those runs having used the same card. The Marlin timed is " + MARLIN_BUILD + ".",
    ])


# A verdict of one run within this relative margin of its limit is listed as undecided in the kernel notes'
# misses table: about the run-to-run spread of torch's own kernels between two full H100 benches of the same device
# code (4.1 %, chapter 05, section 7), which report.run_to_run cannot measure without such a bench in RECEIPTS.
NEAR = 0.05


def near(c: Check) -> bool:
    """A pass or miss not settled by paired rounds whose margin to its limit is under NEAR."""
    return c.status in ("pass", "miss") and not c.paired and c.margin is not None and abs(c.margin) < NEAR


def _left_status(c: Check) -> str:
    if not near(c):
        return c.status
    return f"undecided ({'met' if c.status == 'pass' else 'missed'} by {100 * abs(c.margin):.1f} % in this run)"


def misses_table(checks) -> str:
    """The checks that miss, are undecided, or are met by less than NEAR, by named target: the kernel notes' table
    of what is left, after a line that counts the verdicts within NEAR of their limit."""
    left = [c for c in checks if c.status in ("miss", "undecided") or near(c)]
    if not left:
        return "Every target is met."
    close = [c for c in checks if near(c)]
    n_met, n_met_close = sum(c.status == "pass" for c in checks), sum(c.status == "pass" for c in close)
    n_miss = sum(c.status == "miss" for c in checks)
    head = (f"These are the verdicts of one run. {len(close)} of them lie within {100 * NEAR:g} % of their limit "
            f"({len(close) - n_met_close} of the {n_miss} missed, {n_met_close} of the {n_met} met), where at the "
            "run-to-run spread (\"Run to run\" above) a verdict is undecided: the table lists each of them as "
            "undecided, with the side this run put it on.\n\n" if close else "")
    lines = ["| target | check | measured | status |", "|---|---|---|---|"]
    lines += [_line([c.name, c.target, c.measured, _left_status(c)]) for c in left]
    return head + "\n".join(lines)


def _late_note(rec) -> str:
    """How many samples of the receipt's rows and floors started late (`late`, lab/bench/timing.py): those may hold
    a host delay; '' where the receipt does not count them."""
    timed = [x for x in rec["rows"] + (rec.get("floor") or []) if "late" in x]
    if not timed:
        return ""
    late = [x for x in timed if x["late"]]
    return (f" (`late`: {sum(x['late'] for x in late)} such samples, on {len(late)} of {len(timed)} rows and floors)"
            if late else " (`late`: none in this receipt)")


# ---- the peers at their own read floors (lab/bench/peer_table.py), as this report prints them --------------
# peer_table names its rotated llama.cpp columns "(rotated, CUDA graph)‡" and describes that harness in its ‡ legend
# as the merge script expects it (ggml's CUDA graphs, "given the bench's L2 figure"). The receipt records none of
# that: its only trace of the harness is the timer label lab/bench/ggml_peer.py writes for every rotated file, a
# constant of that script. So the report prints those columns and that legend by what is recorded.
ROT_AS_LABELLED = "(rotated, CUDA graph)‡"
ROT_HEADER = "(rotating harness)‡"
_ROT_LEGEND = peer_table.DAGGER[peer_table.DAGGER.index("‡"):peer_table.DAGGER.index(" Both are host wall clock")]
ROT_LEGEND = ("‡ a harness over ggml's library, outside this repository, on weights of its own (not the bench's), "
              "run in separate processes whose output `lab/bench/ggml_peer.py` merged into the receipt (which records "
              "neither when nor on which device they ran); what the receipt keeps of it is the timer label that script "
              "writes for every rotated file, not read from the run: weight copies rotated past 4× L2, median of 20 "
              "samples of ≥ 16 calls. That label also names ggml's CUDA graphs, a build option of ggml whose setting "
              "in the peers' build is not recorded, so whether they were on is not established.")


def peer_labels(text: str) -> str:
    """peer_table's text with its rotated llama.cpp column names (ROT_AS_LABELLED -> ROT_HEADER) and their ‡ legend
    (ROT_LEGEND) saying what the receipt records of that harness."""
    return text.replace(_ROT_LEGEND, ROT_LEGEND).replace(ROT_AS_LABELLED, ROT_HEADER)


def peer_gemv_table(rec) -> str:
    """`peer_table.gemv_table` with the rotated columns named by `peer_labels`."""
    return peer_labels(peer_table.gemv_table(rec))


def peer_moe_table(rec) -> str:
    """`peer_table.moe_table` with the rotated columns named by `peer_labels`."""
    return peer_labels(peer_table.moe_table(rec))


def peer_tables(rec) -> str:
    """`peer_table.render` (both tables and their legend) through `peer_labels`."""
    return peer_labels(peer_table.render(rec))


def render(rec, anchors=(), spread: float = 0.0, paired=None) -> str:
    """RESULTS.md's decode block: provenance, method, GEMV, MoE and target tables, skipped count. `spread`: the
    run-to-run spread (run_to_run) under which a target's margin is "undecided" (where it is 0, unmeasured, a
    verdict within NEAR of its limit is undecided, as in `misses_table`); `paired` (paired_ratios) settles such a
    target where it holds the same ratio."""
    p = rec["provenance"]
    checks = targets(rec, anchors, spread, paired)
    if not spread:
        # no run-to-run spread measured: a verdict within NEAR of its limit is undecided, as in the misses table
        checks = [Check(c.target, c.measured, _left_status(c), c.paired, c.name, c.margin) for c in checks]
    n_near = sum(c.status.startswith("undecided (") for c in checks)
    n_settled = sum(c.paired for c in checks)
    n_pass = sum(c.status == "pass" for c in checks)
    n_none = sum(c.status == "not measured" for c in checks)
    n_open = sum(c.status.startswith("undecided") for c in checks)
    has_floor = any("floor_us" in r for r in rec["rows"])
    parts = [
        f"Generated by `python -m lab.report --results RESULTS.md` from `data/receipts/{DEFAULT_OUT.name}` "
        f"({p.get('device')}, torch {p.get('torch')}, triton {p.get('triton')}, commit `{p.get('commit')}`, "
        f"{p.get('date')}; `{portable_command(p.get('command'))}`). µs per call, median of "
        + ("samples of at least 16 calls (CUDA-graph replays back to back)" if rec.get("method", {}).get("min_calls")
           else "single CUDA-graph replays")
        + (", each queued behind a GPU busy-wait so that a host delay before a sample's first replay shows "
           "(`late` counts those; later replays of a sample are not checked)" + _late_note(rec)
           if rec.get("method", {}).get("prefill_cycles") else "")
        + (f", after {rec['method']['warmup_ms']:.0f} ms of replays (a slower start of load, seen on the H200 for "
           "its first ~10 ms and not measured on this card, stays out)"
           if rec.get("method", {}).get("warmup_ms") else "") +
        ", weights rotated beyond L2. Read floor: a kernel that only reads the row's int4-b32 bytes (MoE: the "
        "unique routed experts'), best of a few launch configurations, timed the same way in the same run; "
        "a peer's cell gives its µs and (peer / int4_b32)."
        + (" Marlin (the `marlin` column and the Marlin column of the peers at their own read floors) is "
           + MARLIN_BUILD + "." if "marlin" in {r["impl"] for r in rec["rows"]} else "")
        + (f" A one-word read kernel, back to back in a graph, takes {rec['launch']['us']:.2f} µs per kernel (a "
            "throughput of tiny kernels, not a launch latency)."
           if "launch" in rec else "")
        + ("" if has_floor else " **This receipt predates the read floor**: its floor and ratio columns read –.")
        + ("" if rec.get("method", {}).get("complete", True) else
           " **Partial run**: the harness stopped before its schedule was done."),
        "**Batch-1 GEMV, µs**\n\n" + gemv_table(rec, anchors),
        "**MoE layer (gate_up, SwiGLU, down, weighted combine; the llama.cpp columns are sums of its MUL_MAT_ID ops, "
        "not its layer: †, ‡), µs**\n\n" + moe_table(rec, anchors),
        peer_tables(rec),                # every implementation over its own read floor (lab/bench/peer_table.py)
        f"**Targets: {n_pass} of {len(checks)} met, {n_open} undecided, {n_none} not measured**"
        + (f" (undecided: met or missed by less than {100 * spread:.1f} %, the 90th percentile of how far the same "
           "torch kernels' medians moved between two bench runs, `report.run_to_run`)" if spread else
           " (this bench run alone: no earlier full run of the same code on this card is committed as "
           "`decode_<card>_<commit>.json`, so the run-to-run spread is not measured here; a verdict within "
           f"{100 * NEAR:g} % of its limit, about the spread of torch's own kernels between this run and an earlier "
           "bench of the same device code that chapter 05, section 7 reads from git history, is undecided"
           + (f" ({n_near} here, each listed with the side this run put it on)" if n_near else "") + ")")
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


