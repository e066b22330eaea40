"""Chapter 07's targets: each decode-step target against the receipt (met, missed, undecided within the samples'
spread, or not measured, with the reason), what the receipt measures behind each value, and how far its rows lie
from earlier runs of the same benchmark (run-to-run noise; `RUNS` names them) whose receipts name the same device
model, torch and transformers (each receipt's `provenance`, its last call's: it names the device model, not which
card, and a call merged before the last one records none)."""
from __future__ import annotations

from pathlib import Path

from .decode_step import (ORDER, _row, breakdown, eager_ratio, first_case, our_kernels, slope_range, span_text, spread,
                          step_range)

INT4_STATES = ("int4", "int4_fused", "int4_fused2")


def best_int4(a: dict, b: int, c: int, runs=("graphed", "compiled")) -> dict | None:
    """The fastest int4 layer (any int4 state, of `runs`) of a case, with its floor multiple; None where the receipt
    holds no such row or no int4 floor for the case."""
    rows = [r for st in INT4_STATES for run in runs for r in [_row(a, st, None, run, b, c)] if r]
    fl = a.get("floors", {}).get(f"int4 B{b} C{c}", {}).get("us")
    if not rows or not fl:
        return None
    r = min(rows, key=lambda r: r["per_layer_us"])
    return {"state": r["state"], "run": r["run"], "per_layer_us": r["per_layer_us"], "floor_us": fl,
            "over_floor": r["per_layer_us"] / fl, "spread": spread(r), "tokens_per_s": r["tokens_per_s"], "row": r}


def _meta_moe_args(rec: dict, a: dict, batch: int):
    """Shape-only (meta) arguments of `ops._moe_impl` for an arch of the receipt at `batch` tokens: x, the routed
    ids and weights, gate_up's and down's packs and scales; None where the receipt's device is not an H100 or H200."""
    import torch

    from int4lab.archs import get
    device = str(rec.get("provenance", {}).get("device") or "")
    if not any(name in device for name in ("H100", "H200")):
        return None
    z = get(a["arch"]).sizes(a["config"])
    H, I, E, A = z["hidden"], z["intermediate"], z["experts"], z["top_k"]

    def meta(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="meta")
    return (meta(batch, H, dtype=torch.bfloat16), meta(batch, A, dtype=torch.int32), meta(batch, A),
            meta(E, 2 * I, H // 2, dtype=torch.uint8), meta(E, 2 * I, H // 32, dtype=torch.float16),
            meta(E, H, I // 2, dtype=torch.uint8), meta(E, H, I // 32, dtype=torch.float16))


def moe_pdl(rec: dict, a: dict) -> bool | None:
    """Whether the modules' MoE step (`int4lab.kernels.ops`, the path the int4 states run) launches the down GEMV
    as a programmatic dependent of gate_up (PDL, `plan.moe_pdl`) for an arch of the receipt at batch 1 on the
    receipt's device: the down GEMV's programs then start while gate_up still runs (they ask L2 for their first
    weight tiles, then wait for gate_up), so a profile can record the two kernels' times overlapping. Computed from
    the model's shapes (the arch's `config`) with shape-only tensors, the plans' device queries answered for the
    receipt's device (`accuracy._on`: no GPU needed); None where the device is not an H100 or H200 (sm_90, the
    generation this answers for) or the step takes the grouped path (no PDL there)."""
    from int4lab.kernels import ops
    from .accuracy import _on
    args = _meta_moe_args(rec, a, 1)
    if args is None:
        return None
    with _on("sm90", 132):
        prep = ops._prepare_moe(*args)
    return bool(prep[3]) if prep[0] == "routed" else None


def moe_path(rec: dict, a: dict, batch: int) -> dict | None:
    """The path the modules' MoE step (`int4lab.kernels.ops`, the expert step of every int4 state) takes for an arch
    of the receipt at `batch` tokens on the receipt's device, and the kernels it launches there: {"path": "routed"
    or "grouped", "launches": [kernel names in order], "rows": routed rows (batch × top-k), "experts",
    "rows_per_expert": rows / min(experts, rows), the quantity `plan.moe_grouped` compares with its threshold}. The routed path is the
    two expert GEMVs (gate_up, then down with SwiGLU and the combine); the grouped path tiles the routed rows by
    expert and launches the routing, the activation's quantisation, the grouped gate_up, SwiGLU's quantisation and
    the grouped down. Counted from the code, not measured: `ops._moe_impl` run on shape-only tensors (the arch's
    `config`) with its four launchers replaced by counters, the plans' device queries answered for the receipt's
    device (`accuracy._on`: no GPU needed); the path depends on the shapes only, not on which experts the rows pick.
    None where the device is not an H100 or H200 (sm_90, the generation this answers for)."""
    from unittest import mock

    from int4lab.kernels import ops
    from .accuracy import _on
    args = _meta_moe_args(rec, a, batch)
    if args is None:
        return None
    A, E = args[1].shape[1], args[3].shape[0]
    launches = []

    def counted(name, result):
        def launch(*args, **kwargs):
            launches.append(name)
            return result(*args)
        return launch
    with _on("sm90", 132), mock.patch.object(ops, "_PREPARED", {}), \
            mock.patch.object(ops, "run_gemv", counted("gemv_dp4a_kernel", lambda *x: x[9])), \
            mock.patch.object(ops, "run_grouped", counted("grouped_kernel", lambda *x: x[6])), \
            mock.patch.object(ops, "run_quant_rows", counted("quant_rows_kernel", lambda *x: (x[2], x[3]))), \
            mock.patch.object(ops._grouped, "route_tiles", counted("route_tiles_kernel", lambda *x: None)):
        ops._moe_impl(*args)
    L = batch * A
    return {"path": "grouped" if "grouped_kernel" in launches else "routed", "launches": launches, "rows": L,
            "experts": E, "rows_per_expert": L / min(E, L)}


def gaps_text(gaps: float, busy: float, pdl: bool | None = None) -> str:
    """The breakdown's gaps: the profiled replay's layer minus the replay's own summed kernel time (`busy`, per
    layer), not minus the eager-profile kernel times the reason lists. A difference of two separately timed totals,
    so it holds launch gaps and the two measurements' difference, less any time two kernels overlap (the sum counts
    that time twice): with `pdl` (`moe_pdl`: the MoE's down GEMV a programmatic dependent of gate_up) the two
    kernels' recorded times can overlap and gaps can read below zero. The receipt keeps no replayed kernel's start
    time, so these parts are not separated."""
    over = ("; the MoE's down GEMV is launched here as a programmatic dependent of gate_up, so the two kernels' "
            "recorded times can overlap and that sum counts the overlap twice" if pdl else "")
    if gaps < 0:
        return (f"gaps −{-gaps:.1f} µs (the replay's own kernel times, {busy:.1f} µs, sum to {-gaps:.1f} µs more "
                f"than the layer{over}; launch gaps, overlap and the two timings' difference not separated)")
    return (f"gaps {gaps:.1f} µs (the replay's layer − its own kernels' {busy:.1f} µs, two separately timed "
            f"totals{over}; launch gaps{', overlap' if pdl else ''} and the two timings' difference not separated)")


def _verdict(v: float, op: str, bound: float, rows) -> tuple[bool | None, str | None]:
    """(met, why undecided) of a ratio of per-layer times: undecided where a row's slope range reaches zero, or where
    the value lies within the rows' added spread (`spread`) of the bound. A tokens/s ratio takes `_step_verdict`."""
    for r in rows:
        lo, hi = slope_range(r)
        if lo <= 0:
            return None, f"spread: per layer {span_text(lo, hi)}, reaching zero"
    rel = sum(spread(r) for r in rows)
    if abs(v - bound) <= abs(bound) * rel:
        return None, f"spread: {v:.2f} ± {rel:.1%} reaches the bound {bound:g}"
    return (v <= bound if op == "<=" else v >= bound), None


def _step_verdict(num, den, bound: float) -> tuple[bool | None, str | None]:
    """(met, why undecided) of tokens/s num over den >= bound: the ratio is step(den) / step(num) at the published
    depth, decided where the range the samples allow (`step_range` of each) lies on one side of the bound;
    undecided too where a slope's sample range reaches zero."""
    for r in (num, den):
        lo, hi = slope_range(r)
        if lo <= 0:
            return None, f"spread: per layer {span_text(lo, hi)}, reaching zero"
    (nl, nh), (dl, dh) = step_range(num), step_range(den)
    if dl / nh <= bound <= dh / nl:
        return None, f"spread: the samples allow {dl / nh:.2f}–{dh / nl:.2f}, reaching the bound {bound:g}"
    return dl / nh > bound, None


def row_name(arch: str, r: dict) -> str:
    """A row as `run_to_run` names it: "model state impl run B<b> C<c>"."""
    return f"{arch} {r['state']} {r['impl'] or '-'} {r['run']} B{r['batch']} C{r['context']}"


def status(t: dict) -> str:
    """A target's verdict as the chapter prints it: met, missed, undecided (why) or not measured (why)."""
    if t.get("not_measured"):
        return f"not measured ({t['not_measured']})"
    return {True: "met", False: "missed"}.get(t["met"], f"undecided ({t.get('undecided')})")


def _absent(a: dict, b: int, c: int) -> str:
    """Why a case has no int4 graphed layer or floor: the parts the run skipped (`bench.Run.part` skips a part when
    less of the model's share of the call's time budget is left than the part reserves: 5 s for a timing or floors
    part, 10 s for greedy and host, 15 s for a breakdown, `--compile-reserve-s` (60 s by default) for a compiled
    run; each model in turn gets an even share of what is left) or that failed, as the receipt lists them."""
    key = f"B{b} C{c}"
    skipped = [k for k in a.get("skipped", []) if k.endswith(key)]
    failed = [k for k in a.get("errors", {}) if k.endswith(key)]
    why = "skipped, less of the model's share of the call's time budget left than the part reserves"
    return "; ".join(([f"{why}: {', '.join(skipped)}"] if skipped else []) +
                     ([f"failed: {', '.join(failed)}"] if failed else [])) or "not in the receipt"


FLOOR_BOUND = {"olmoe": 2.5, "qwen3_moe": 2.5, "mixtral": 1.5}
# the fastest of the bf16 configurations run (batched_mm / grouped_mm, graphed, or compiled with the one fastest
# graphed), not bf16's best possible: no fused-kernel bf16, no `eager` experts impl, one attention impl, one compile
# mode
BF16_FASTEST = "the fastest transformers bf16 measured"
GENERATE = "generate with int4 faster than bf16, eager and compiled"
# the 07:57 run (H100, 2026-12-07 07:57 UTC; the 10:36 run's step settings and kernel sources, budgets 225 s / 125 s):
# a second run of the same rows, its receipt read from the commit that holds it where the checkout has that history
REPLACED = "49f9224b1df2c147945908f128c0f333a7a3e63b"


def _setup(r: dict) -> tuple:
    """(device model, torch, transformers) of a receipt, from its `provenance` (its last call's): the device model
    names no card."""
    return r["provenance"]["device"], r["provenance"]["torch"], r.get("transformers")


def _comparable(rec: dict, path: Path, commit: str) -> dict | None:
    """The receipt at `path` as `commit` holds it (an earlier run), where its device model, torch and transformers
    (`_setup`) match `rec`'s; None otherwise (or without that history)."""
    from .history import receipt_at
    old = receipt_at(path, commit)
    return old if old is not None and _setup(old) == _setup(rec) else None


def run_to_run(rec: dict, path: Path, commit: str = REPLACED) -> dict:
    """How far this receipt's rows lie from the run whose receipt `commit` holds, where device model, torch and
    transformers match: per kind
    ("graphed", "compiled" per-layer times, "floor" read floors), (largest |relative change|, count, unmatched) over
    the rows both hold with the same model, state, experts implementation, batch and context; unmatched lists this
    receipt's rows of that kind that run lacks ("model state impl run B<b> C<c>", or "model floor <key>"):
    not measured again there (`earlier_runs` looks for them in the runs of `EARLIER`). {} without that receipt."""
    old, out = _comparable(rec, path, commit), {}
    if old is None:
        return out
    for arch, a in rec["archs"].items():
        o = old["archs"].get(arch) or {"floors": {}, "rows": []}
        pairs = [("floor", f"{arch} floor {k}", f["us"], o["floors"].get(k, {}).get("us"))
                 for k, f in a["floors"].items() if f.get("us")] + [
            (r["run"], row_name(arch, r), r["per_layer_us"], (q or {}).get("per_layer_us")) for r in a["rows"]
            if "per_layer_us" in r and r["run"] != "eager"
            for q in [_row(o, r["state"], r["impl"], r["run"], r["batch"], r["context"])]]
        for kind, name, v, w in pairs:
            m, n, miss = out.get(kind, (0.0, 0, []))
            out[kind] = (m, n, miss + [name]) if not w else (max(m, abs(v / w - 1)), n + 1, miss)
    return out


# the 00:44 run (H100, 2026-12-07 00:44 UTC, other int4 kernel sources) and the 16:19 run (H100, 2026-12-06 16:19
# UTC, one call for both contexts, no int4_fused2, other kernel sources), latest first: where `earlier_runs` looks for
# the rows the 07:57 run lacks
EARLIER = ("4cf86c2b4c05427be115a8791b37dec0039edea1", "dee2c3bef2cba4c4f4e895a8238624c18ab34085")
# each earlier run by name (the time of its receipt's `provenance` date, UTC), as chapter 07 and notes/decode_step.md
# print it; its receipt: `git show <commit>:data/receipts/decode_step_h100.json`
RUNS = {REPLACED: "the 07:57 run", EARLIER[0]: "the 00:44 run", EARLIER[1]: "the 16:19 run"}


def run_name(commit: str) -> str:
    """The name of the earlier run whose receipt `commit` (full or a prefix of it) holds."""
    return next(n for c, n in RUNS.items() if c.startswith(commit))


def earlier_runs(rec: dict, path: Path, names, commits=EARLIER) -> dict:
    """The rows `names` ("model state impl run B<b> C<c>", as `row_name` writes them) in the earlier runs whose
    receipts `commits` hold, where device model, torch and transformers match: {name: [(commit, row, kernel sources
    alike)]}, one entry per run holding that row. "Kernel sources alike" compares `provenance.kernel_sources_sha256`: a
    row measured at other kernel sources is not a second measurement of the int4 kernels measured here. That hash is
    the receipt's last call's; a call merged before it with `--prior` records none, so for a row that call measured
    the comparison assumes both calls ran at the same kernel sources."""
    out = {n: [] for n in names}
    for commit in commits:
        old = _comparable(rec, path, commit)
        if old is None:
            continue
        alike = old["provenance"].get("kernel_sources_sha256") == rec["provenance"].get("kernel_sources_sha256")
        for arch, a in old["archs"].items():
            for r in a["rows"]:
                if "per_layer_us" in r and row_name(arch, r) in out:
                    out[row_name(arch, r)].append((commit[:7], r, alike))
    return out


def eager_run_to_run(rec: dict, path: Path, commit: str = REPLACED) -> dict:
    """The eager ratios over bf16's default experts implementation (`eager_ratio`) in this receipt and in the run
    whose receipt `commit` holds, where device model, torch and transformers match: {(model, "B<b> C<c>", state):
    (this, that)} for each int4 state whose ratio is decided in both. Each range holds only its run's own samples;
    {} without that receipt."""
    old, out = _comparable(rec, path, commit), {}
    if old is None:
        return out
    for arch, a in rec["archs"].items():
        o = old["archs"].get(arch)
        for key in (a["summary"] if o else ()):
            b, c = (int(x[1:]) for x in key.split())
            for st in INT4_STATES:
                e, f = eager_ratio(a, st, b, c), eager_ratio(o, st, b, c)
                if e["decided"] and f["decided"]:
                    out[(arch, key, st)] = (e, f)
    return out


def _target(arch, kind, key, name, value, bound, what, verdict=(None, None), **extra) -> dict:
    return {"arch": arch, "kind": kind, "case": key, "target": f"{key}: {name}" if key else name, "value": value,
            "bound": bound, "what": what, "met": verdict[0], "undecided": verdict[1], **extra}


def targets(rec: dict) -> list[dict]:
    """Every target of the decode step against the receipt, per model: value, bound, met (None: undecided, with the
    reason in "undecided"; or not measured, with the reason in "not_measured"), what it compares and its kind.
    int4 at its best = its fastest state (int4, int4_fused, int4_fused2), graphed or compiled."""
    out = []
    if rec.get("card") == "cpu":
        return out
    for arch in [m for m in ORDER if m in rec["archs"]]:
        a = rec["archs"][arch]
        best = best_int4(a, 1, 256)
        for kind, bound in (("floor", FLOOR_BOUND[arch]), ("goal", 2.0)):
            name = f"int4 at its best <= {bound}x its read floor" + (" (goal)" if kind == "goal" else "")
            what = f"{best['state']} {best['run']} {best['per_layer_us']:.1f} µs / {best['floor_us']:.1f} µs"
            out.append(_target(arch, kind, "B1 C256", name, best["over_floor"], bound, what,
                               _verdict(best["over_floor"], "<=", bound, [best["row"]]),
                               rows=[row_name(arch, best["row"])]))
        for key, s in a["summary"].items():
            b, c = (int(x[1:]) for x in key.split())
            bi, bf = best_int4(a, b, c), a["floors"].get(f"bf16 B{b} C{c}", {}).get("us")
            name = "int4 at its best below bf16's read floor"
            if bi and bf:
                out.append(_target(arch, "below_bf16", key, name, bi["per_layer_us"] / bf, 1.0,
                                   f"{bi['state']} {bi['run']} {bi['per_layer_us']:.1f} µs / bf16 floor {bf:.1f} µs",
                                   _verdict(bi["per_layer_us"] / bf, "<=", 1.0, [bi["row"]]),
                                   rows=[row_name(arch, bi["row"])]))
            else:
                out.append(_target(arch, "below_bf16", key, name, None, 1.0, "", not_measured=_absent(a, b, c)))
            if b == 1:
                bb = s["best_bf16"]
                bbr = _row(a, "bf16", bb["impl"], bb["run"], b, c)
                v = bi["tokens_per_s"] / bb["tokens_per_s"]
                what = f"{bi['state']} {bi['run']} over bf16 {bb['impl']} {bb['run']}"
                verdict, rows = _step_verdict(bi["row"], bbr, 3.0), [row_name(arch, bi["row"]), row_name(arch, bbr)]
                compiled = "bf16_compiled_per_layer_us" in s
                # the fastest transformers bf16 measured needs its compiled run: where the receipt has none the
                # target is undecided, and the verdict against graphed bf16 is a lower bar, given as a target of its own
                out.append(_target(arch, "tokens", key, f"int4 tokens/s >= 3x {BF16_FASTEST}", v, 3.0, what,
                                   verdict if compiled else (None, "compiled bf16 not measured at this batch and context"),
                                   rows=rows))
                if not compiled:
                    out.append(_target(arch, "tokens_graphed", key, "int4 tokens/s >= 3x bf16 graphed (none "
                                       "compiled)", v, 3.0, what, verdict, rows=rows))
            if (b, c) != (1, 256):
                name = "int4 graphed <= 2x its read floor"
                g = best_int4(a, b, c, runs=("graphed",))
                out.append(_target(arch, "graphed_floor", key, name, g["over_floor"], 2.0,
                                   f"{g['state']} {g['per_layer_us']:.1f} µs / {g['floor_us']:.1f} µs",
                                   _verdict(g["over_floor"], "<=", 2.0, [g["row"]]), rows=[row_name(arch, g["row"])])
                           if g else
                           _target(arch, "graphed_floor", key, name, None, 2.0, "", not_measured=_absent(a, b, c)))
        out.append(generate_target(arch))
        # the greedy check decodes the benchmark's deepest random-weight model (its 1 or 2 layers, not the published
        # depth) at the batch the receipt records: its target says so
        gr, depth = a["greedy"], max(a.get("depths") or [0])
        for st, g in sorted(gr["states"].items()):
            out.append(_target(arch, "greedy", None, f"{st}: {gr['steps']} greedy tokens identical graphed and eager "
                               f"(batch {gr.get('batch', 1)}, {depth}-layer random-weight model)", g["first_mismatch"],
                               None, "first mismatch", (bool(g["equal"]), None)))
    return out


def generate_target(arch: str, receipts=None) -> dict:
    """The `generate` target from the generate receipts (`python -m lab.decode_step.generate`, not this benchmark,
    which times one step over a static cache): a mode is met where some int4 state's per-round ratio over bf16 is
    "<state> faster" at the deepest depth (its median's interval wholly above 1), missed where every state's is
    "<state> slower"; the target is met where eager and compiled are both met, missed where either is missed, else undecided
    (a mode not measured leaves it undecided); not measured without a receipt for `arch`."""
    from lab.paths import RECEIPTS
    from lab.report.generate import shown, verdicts
    from lab.report import read
    found = {p.name: read(p) for p in sorted(Path(receipts or RECEIPTS).glob("generate*_*.json"))}
    per_mode: dict = {}                                      # mode: [(verdict, its text)] at the deepest depth
    for name, rec in found.items():
        vs = [v for v in verdicts(rec) if v["arch"] == arch]
        deep = max((v["depth"] for v in vs), default=None)
        for v in [v for v in vs if v["depth"] == deep]:
            per_mode.setdefault(v["mode"], []).append((v["verdict"], f"{shown(v['ratio'])} {v['verdict']} ({name}, {deep} "
                                                                     f"layers)"))
    if not per_mode:
        return _target(arch, "generate", None, GENERATE, None, None, "", not_measured=(
            "no generate receipt measures this model (data/receipts/generate*_*.json)"))
    # a verdict names its state ("int4 faster", "int4_fused faster"): any int4 state counts
    state = {m: True if any(v.endswith(" faster") for v, _ in got) else
             False if all(v.endswith(" slower") for v, _ in got) else None for m, got in per_mode.items()}
    why = "; ".join([f"{m}: {', '.join(t for _, t in got)}" for m, got in per_mode.items()] +
                    [f"{m}: not measured" for m in ("eager", "compiled") if m not in per_mode])
    met = False if False in state.values() else True if state.get("eager") and state.get("compiled") else None
    return _target(arch, "generate", None, GENERATE, None, None, why, (met, why if met is None else None),
                   modes=state)


def replicated(rec: dict, path: Path, commit: str = REPLACED) -> tuple[dict, bool]:
    """Targets measured again in the run whose receipt `commit` holds, where device model, torch and transformers
    match: ({(model, target): that run's value} for each target with a value and a bound whose rows ("model state impl
    run B<b> C<c>") are the same in both, whether the two runs' kernel sources hash alike). The hashes are each
    receipt's `provenance`, its last call's; a call merged before it with `--prior` records none, so "alike" does not
    cover that call's rows. ({}, False) without that receipt."""
    old = _comparable(rec, path, commit)
    if old is None:
        return {}, False
    was = {(t["arch"], t["target"]): t for t in targets(old)}
    same = {(t["arch"], t["target"]): w["value"] for t in targets(rec) for w in [was.get((t["arch"], t["target"]))]
            if w and t.get("rows") and w.get("rows") == t["rows"] and None not in (w["value"], t["value"], t["bound"])}
    src = [r["provenance"].get("kernel_sources_sha256") for r in (rec, old)]
    return same, src[0] is not None and src[0] == src[1]


def gemvs(a: dict) -> tuple[float, dict]:
    """(our four GEMVs' µs, {each other launch of ours: µs}) per layer in int4_fused2's profile (`our_kernels`)."""
    ours = our_kernels(a, "int4_fused2") or {}
    return (sum(us for k, (_, us) in ours.items() if k.startswith("gemv_")),
            {k.split(" @ ")[0]: us for k, (_, us) in ours.items() if not k.startswith("gemv_")})


def reason(rec: dict, t: dict) -> str:
    """What the receipt measures behind a target's value: int4_fused2's profiled layer where the case was profiled
    (batch 1, context 256), the per-layer and fixed parts for a tokens/s ratio, else the layer against its floors."""
    a = rec["archs"][t["arch"]]
    if t["case"] is None or t.get("not_measured"):
        return ""
    b, c = (int(x[1:]) for x in t["case"].split())
    bi = best_int4(a, b, c, runs=("graphed",) if t["kind"] == "graphed_floor" else ("graphed", "compiled"))
    if t["kind"] in ("tokens", "tokens_graphed"):
        bb = a["summary"][t["case"]]["best_bf16"]
        r, q = bi["row"], _row(a, "bf16", bb["impl"], bb["run"], b, c)
        return (f"per layer bf16 {q['per_layer_us']:.1f} µs over int4 {r['per_layer_us']:.1f} µs = "
                f"{q['per_layer_us'] / r['per_layer_us']:.2f}x; fixed part {q['fixed_us']:.1f} against "
                f"{r['fixed_us']:.1f} µs; step at {r['full_layers']} layers {q['full_step_us']:,.0f} "
                f"({step_range(q)[0]:,.0f}–{step_range(q)[1]:,.0f}) against {r['full_step_us']:,.0f} µs "
                f"({step_range(r)[0]:,.0f}–{step_range(r)[1]:,.0f}: the ranges the samples allow)")
    bd, floors = breakdown(a, "int4_fused2"), f"int4 floor {bi['floor_us']:.1f} µs, bf16 floor " \
                                               f"{a['floors'][f'bf16 B{b} C{c}']['us']:.1f} µs"
    if (b, c) != first_case(a) or bd is None or bi["state"] != "int4_fused2":
        return f"not profiled: layer {bi['per_layer_us']:.1f} µs ({bi['state']} {bi['run']}), {floors}"
    gemv, rest = gemvs(a)
    compiled = f" (the compiled one, {bi['per_layer_us']:.1f} µs, was not profiled)" if bi["run"] != "graphed" else ""
    others = ", ".join(f"{k.removesuffix('_kernel')} {us:.1f}" for k, us in rest.items())
    return (f"profiled int4_fused2 graphed layer {bd['step']:.1f} µs{compiled}: eager-profile kernel times, the "
            f"four GEMVs {gemv:.1f} µs ({gemv / bd['step']:.0%}), the other launches {others} µs "
            f"({sum(rest.values()):.1f}), torch glue {bd.get('glue', 0.0):.1f} µs, "
            f"{gaps_text(bd.get('gaps', 0.0), bd.get('busy', 0.0), moe_pdl(rec, a))}; "
            f"{floors}")
