"""The pages' other generated blocks: the small models' receipts (training, gates, packing), the real-width gate
and scoring bench, the whole decode step, the kernel notes' misses; and rewriting a block between its markers."""
from __future__ import annotations

from pathlib import Path

from int4lab.files import write_text_atomic

from lab.bench.schema import DEFAULT_OUT
from lab.chapters.decode_step import below_graphed, eager_ratio, eager_text, slope_range  # chapter 07's eager rule
from lab.chapters.decode_targets import REPLACED, RUNS  # the earlier run chapter 07's claim 12 compares
from lab.paths import RECEIPTS
from lab.provenance import portable_command
from .realscale_fit import (_s, fit_flags, fitted, fitted_time, full_text, gptq_text, off_reasons, one_depth,
                            one_depth_text, pack_text, two_depths)
from .runlog import summary_text
from .decode import END, START, _f, _line, read, reading, refuse_partial
from .targets import misses_table, targets


def replace_block(text: str, block: str, start: str, end: str, name) -> str:
    """`text` with what lies between the `start` and `end` markers replaced by `block`; ValueError naming the page
    `name` when the markers are not there in that order."""
    if start not in text or end not in text or text.index(start) > text.index(end):
        raise ValueError(f"{name} must contain {start} followed by {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


def rewrite_readme(readme, block: str, start: str = START, end: str = END) -> Path:
    """Replace the text between the `start` and `end` markers in `readme` with `block`."""
    readme = Path(readme)
    write_text_atomic(readme, replace_block(readme.read_text(), block, start, end, readme))
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
        with reading(path):
            r = read(path)
            ev = r["eval"]
            lines.append(_line([r["arch"], f"{r['params'] / 1e6:.2f} M", r["training"]["steps"],
                                _f(ev["validation"]["ppl"]), _f(ev["validation"]["unigram_ppl"]), _f(ev["test"]["ppl"]),
                                _f(ev["ood"]["ppl"]), _prov(r)]))
    return "\n".join(lines)


def gate_table(receipts=RECEIPTS) -> str:
    """The gate receipts' table: Δ% [95 % CI] per text, PASS / FAIL / UNDECIDED, lottery and calibration.
    A receipt made with partial settings (partial_settings) is refused (ValueError), never tabulated. A small
    model without its receipt is listed as not measured, with the command that writes it."""
    from int4lab.gate.table import render_gate_table
    from int4lab.models import ARCHS
    from lab.chapters.gate_study import regenerate
    found = sorted(Path(receipts).glob("gate_*.json"))
    for path in found:
        refuse_partial(read(path), path)
    out = []
    if found:
        with reading(Path(receipts) / "gate_*.json"):
            out.append(render_gate_table(receipts))
    absent = [a for a in ARCHS if not (Path(receipts) / f"gate_{a}.json").is_file()]
    if absent:
        out.append("*Not measured*: " + "; ".join(f"{a}, no data/receipts/gate_{a}.json (run `{regenerate(a)}`)"
                                                  for a in absent) + ".")
    return "\n\n".join(out)


def pack_table(receipts=RECEIPTS) -> str:
    """Pack time per layer: round-to-nearest and GPTQ, median wall seconds."""
    lines = ["| device | N×K | impl | seconds (median) |", "|---|---|---|---|"]
    for path in sorted(Path(receipts).glob("gptq_pack_*.json")):
        with reading(path):
            r = read(path)
            for row in r["rows"]:
                lines.append(_line([r["provenance"]["device"], f"{row['N']}×{row['K']}", row["impl"],
                                    f"{row['seconds']:.3g}"]))
    return "\n".join(lines)


REALSCALE_START, REALSCALE_END = "<!-- realscale-table:start -->", "<!-- realscale-table:end -->"


def _gb(x) -> str:
    return "–" if x is None else f"{x / 2 ** 30:.1f} GiB"


def _receipts(pattern: str, receipts=RECEIPTS) -> list[tuple[Path, dict]]:
    return [(p, read(p)) for p in sorted(Path(receipts).glob(pattern))]


def _not_yet(name: str, module: str, stage: str) -> str:
    return (f"*Not yet measured*: no `data/receipts/{name}`. It is written by `python -m {module}` on a GPU "
            f"(`lab/gpu_run.sh`, stage `{stage}`).")


def renamed(r: dict, path: Path) -> str:
    """A note where the receipt's recorded --out names another file than the one it is kept as."""
    words = str(r["provenance"].get("command") or "").split()
    out = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--out"), None)
    if out is None or Path(out).name == path.name:
        return ""
    return f" (it wrote `{Path(out).name}`; kept here as `{path.name}`)"


def warmup_text(r: dict) -> str:
    """Whether the measured gate ran after an unmeasured small one (kernels compiled) or paid compilation itself."""
    w = r["settings"].get("warmup")
    if w is None or w == "before each architecture's first depth":   # the fit mode's rule, stated as the code runs it:
        w = "none" if r["settings"].get("mode") == "full depth" else (  # a warm-up until a depth has run its gate
            "before each architecture's first depth, and again before each later depth while none has succeeded")
    args = next((d["warmup"].get("args") or [] for a in r.get("archs", {}).values()
                 for d in (a.get("depths") or {}).values() if isinstance(d.get("warmup"), dict)), [])
    which = "one text" if "--texts" in args else "each text"
    return ("no warm-up gate (the measured run pays the first-use costs, kernel compilation included, that earlier "
            "runs on the same machine had not already paid)") if w == "none" \
        else f"an unmeasured warm-up gate {w} (twenty documents of {which}, one arm per scheme and target)"


def realscale_table(receipts=RECEIPTS) -> str:
    """The README's gate command at the published width (`python -m lab.realscale_gate`): per architecture and
    measured depth, the gate's wall time, the time inside its forwards, its peaks and verdicts; then each quantity
    fitted as fixed + layers x per_layer and taken to the published depth (the arithmetic in the receipt), against
    the targets. Then the many-row scoring path's bench (`prefill_*.json`). "not yet measured" without receipts."""
    found = _receipts("realscale_gate_*.json", receipts)
    if not found:
        return _not_yet("realscale_gate_[full_]<arch>_<card>.json", "lab.realscale_gate", "gate")
    out = []
    for path, r in found:
        with reading(path):
            why = r.get("interrupted") or "no reason recorded"     # a run that stopped early says so first
            lines = [("" if r.get("complete") is not False else
                      f"**Partial run: `{path.name}` stopped before every depth ran** ({why}); the rows below are "
                      "the depths that finished.\n\n") + f"`data/receipts/{path.name}` ({_prov(r)}; "
                     f"`{portable_command(r['provenance'].get('command'))}`{renamed(r, path)}; {warmup_text(r)}):", "",
                     "| model | layers | gate | build arms (by kind, s) | score | inside forwards | gate / forwards | GPU peak | "
                     "host peak | arms in groups | verdicts |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            for arch, a in sorted(r.get("archs", {}).items()):
                for L, d in sorted(a.get("depths", {}).items(), key=lambda kv: int(kv[0])):
                    g = d.get("gate")
                    if not g:
                        err = (d.get("error") or {}).get("error")
                        lines.append(_line([arch, f"{L} of {a['full_layers']}",
                                            f"error: {err}" if err else f"skipped: {d.get('skipped', 'no reason')}"]
                                           + ["–"] * 8))
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
                if a.get("full") and any(d.get("gate") for d in a.get("depths", {}).values()):
                    lines += ["", full_text(arch, a, r, path.with_suffix(".log"))]
                ex = a.get("extrapolation") or {}
                if ex and one_depth(a):       # no line through one point: the measured depth and GPTQ's rate only
                    lines += ["", one_depth_text(arch, a, path.with_suffix(".log"))]
                if not ex or one_depth(a):
                    continue
                t, mem = ex["targets"], ex.get("memory") or {}
                gof = t["gate_over_forwards"]
                flagged = fit_flags(ex["fits"])       # read from the fits, so an older receipt is judged the same way
                why = lambda ks: (f"undecided (the line does not describe {', '.join(f'`{k}`' for k in ks)}: "  # noqa: E731
                                  "a negative slope or fixed part)")
                # the quick settings the depths ran: the targets are the README command's (the GPTQ line below)
                two = two_depths(ex["fits"]["gate_s"])      # a line through two points: shown, never bold
                mark = (lambda v: f"{v} (quick settings; through two depths, untested)") if two else \
                    (lambda v: f"**{v}** (quick settings)")                                    # noqa: E731
                time_cell = fitted_time(ex["fits"], "gate_s") or mark(_s(t['gate_s']['value']))
                gof_cell = why(flagged) if flagged else mark(f"{gof['value']:.1f}")
                lines.append(_line([arch, f"**{ex['full_layers']} (fitted)**", time_cell,
                                    fitted_time(ex["fits"], "build_s") or fitted(ex["fits"], "build_s"),
                                    fitted_time(ex["fits"], "score_s") or fitted(ex["fits"], "score_s"), "–", gof_cell,
                                    _gb(mem["peak_bytes"]) + " predicted" if mem.get("peak_bytes") else "–",
                                    fitted(ex["fits"], "host_peak_bytes", _gb),
                                    f"{mem.get('arms_per_group')} per group, {mem.get('groups')} groups" if mem else "–",
                                    "–"]))
                if "gptq_sweep_default_s" in ex["fits"]:
                    lines += ["", gptq_text(arch, ex, a.get("depths", {}), r["settings"].get("card_bytes"), fitted, _gb,
                                             path.with_suffix(".log"))]
                lines += ["", f"Fitted rows: {r['settings']['extrapolation']}; memory: {mem.get('formula', '–')}."
                          + (" Through two depths each line passes through both points, so no depth tests it: its "
                             "full-depth figures are the line's, undecided against any target, and a negative fixed "
                             "part there is not tested either (shown as the line's: "
                             + (", ".join(f"`{k}`" for k, v in ex["fits"].items()
                                          if two_depths(v) and (v.get("fixed") or 0) < 0) or "none") + ")." if two else "")
                          + (" " + off_reasons(ex["fits"]) if off_reasons(ex["fits"]) else "")]
            if not any(a.get("depths") for a in r.get("archs", {}).values()):
                lines = [lines[0].replace("stopped before every depth ran", "stopped before any depth finished")
                         .replace("; the rows below are the depths that finished.", ".")]   # no table to show
            if r.get("complete") is False and path.with_suffix(".log").exists():
                lines += ["", summary_text(path.with_suffix(".log"))]
            out.append("\n".join(lines))
    for path in sorted(Path(receipts).glob("prefill_*.json")):
        with reading(path):
            r = read(path)
            st = r["settings"]
            rows = "; ".join(f"{row['batch']}: many-row path {row['prefill_over_bf16']:.3f}×, decode path "
                             f"{row['decode_over_bf16']:.2f}× (logits against the decode path: largest |Δ logit| "
                             f"{row['logits']['prefill_vs_decode']['max_rel']:.3f} of the largest |logit|)"
                             for row in r["rows"])
            out.append(f"Scoring throughput against bf16 (`data/receipts/{path.name}`, {_prov(r)}; "
                       f"{st['arch']} at the published width, {st['layers']} layers, {st['targets']}, tokens/s over "
                       f"bf16 with {st['experts_implementation']} experts): {rows}. Target ≥ "
                       f"{r['target']['prefill_over_bf16_min']}×: {'met' if r['target']['met'] else 'missed'}.")
    for path in sorted(Path(receipts).glob("pack_*.json")):
        with reading(path):
            r = read(path)
            out.append(pack_text(path, r, _prov(r)))
    return "\n\n".join(out)


DECODE_STEP_START, DECODE_STEP_END = "<!-- decode-step:start -->", "<!-- decode-step:end -->"


def compiled_bf16_text(r: dict) -> str:
    """The decode-step table's note on its best bf16: which models and cases the receipt has a compiled bf16 row
    for, whether compiling made bf16 the fastest there, and that every other row's best bf16 is uncompiled."""
    cases, slower, none = {}, [], []
    for arch, a in r.get("archs", {}).items():
        got = sorted({(x["batch"], x["context"]) for x in a.get("rows", [])
                      if x.get("state") == "bf16" and x.get("run") == "compiled" and x.get("per_layer_us")})
        none += [] if got else [arch]
        for b, c in got:
            cases.setdefault((b, c), []).append(arch)
            best = (a.get("summary", {}).get(f"B{b} C{c}") or {}).get("best_bf16") or {}
            slower += [] if best.get("run") == "compiled" else [f"{arch} at batch {b}, context {c}"]
    if not cases:
        return ("Best bf16 measured: graphed bf16 (the receipt compiled no bf16; eager is not a candidate), so the "
                "tokens/s ratios would likely be lower against a compiled bf16.")
    where = "; ".join(f"{' and '.join(archs)} at batch {b}, context {c}" for (b, c), archs in sorted(cases.items()))
    made = ("where compiling made it the fastest bf16" if not slower else
            f"where compiling made it the fastest bf16 but for {', '.join(slower)}")
    return (f"Best bf16 measured: bf16 was compiled only for {where}, {made}"
            + (f" ({' and '.join(none)}: no compiled bf16 row in this receipt)" if none else "")
            + "; in every other row it is graphed bf16 (the faster experts implementation graphed; eager is not a "
              "candidate), so those tokens/s ratios would likely be lower against a compiled bf16.")


def eager_bf16_text(r: dict) -> str:
    """The decode-step table's note on its eager column's bf16 (`eager_ratio(..., fastest=True)`): which experts
    implementation it is, in how many rows with an eager ratio transformers' default is slower eager (and in how many
    of them beyond both slopes' sample ranges), and which lower eager per-layer values were no candidate because
    their slope's sample range does not lie above zero or lies wholly below their own graphed layer."""
    slower, beyond, shown, passed, dflts = 0, 0, 0, [], set()
    for arch, a in r.get("archs", {}).items():
        dflt = a.get("default_experts_impl")
        for case in a.get("summary", {}):
            b, c = (int(x[1:]) for x in case.split())
            e = eager_ratio(a, "int4_fused2", b, c, fastest=True)
            if e["value"] is None:
                continue
            shown += 1
            bf = {x["impl"]: x for x in a.get("rows", []) if "per_layer_us" in x and
                  (x["state"], x["run"], x["batch"], x["context"]) == ("bf16", "eager", b, c)}
            pick = bf[e["impl"]]
            passed += [f"{arch} at batch {b}, context {c} ({k}" + (f", its slope {lo:,.0f}–{hi:,.0f} µs below its "
                       f"graphed layer, {g:,.0f} µs" if lo > 0 and (g := below_graphed(a, x)) is not None else "") + ")"
                       for k, x in bf.items() if x["per_layer_us"] < pick["per_layer_us"]
                       for lo, hi in [slope_range(x)]]
            if dflt and e["impl"] != dflt:
                slower, dflts = slower + 1, dflts | {dflt}
                beyond += dflt in bf and slope_range(bf[dflt])[0] > slope_range(pick)[1]
    impls = sorted({i for c in r.get("calls", []) for i in (c.get("settings") or {}).get("impls") or []})
    unrun = sorted({i for a in r.get("archs", {}).values() for i in a.get("experts_impls") or []} - set(impls))
    return ("its bf16 is the experts implementation fastest eager in that row among those measured"
            + (f" ({', '.join(impls)}" + (f"; transformers' {', '.join(unrun)} experts implementation was not run"
                                          if unrun else "") + ")" if impls else "")
            + " whose slope's sample range lies above zero and not wholly below its graphed layer (named)" + (
                f"; transformers' default ({'/'.join(sorted(dflts))}) is slower eager in this run in {slower} of "
                f"the {shown} rows with an eager ratio ({beyond} of them beyond both slopes' sample ranges), and "
                "against it those ratios are lower (chapter 07 prints both)" if slower else "") + (
                "; a lower eager per layer whose slope's sample range does not lie above zero, or lies wholly below "
                "its own graphed layer (at depth an eager layer costs at least its graphed one), is no candidate (it "
                f"shows no implementation faster): {', '.join(passed)}" if passed else ""))


def moe_path_text(r: dict) -> str:
    """The decode-step table's note on the int4 states' MoE step at each batch above 1 (`decode_targets.moe_path`:
    counted from the code on the receipt's shapes, not measured): where it takes the grouped path, so that those
    rows run other expert kernels than batch 1's routed GEMVs. Empty where the receipt's device is not one the
    count answers for, or no batch above 1 was run."""
    from lab.chapters.decode_targets import moe_path
    grouped, routed = [], []
    for arch, a in r.get("archs", {}).items():
        for b in sorted({int(case.split()[0][1:]) for case in a.get("summary", {})} - {1}):
            p = moe_path(r, a, b)
            if p is None:
                return ""
            (grouped if p["path"] == "grouped" else routed).append(
                (arch, b, p["rows"], p["experts"], len(p["launches"])))
    if not grouped:
        return ""
    return ("The int4 states' MoE step picks its path from the shapes (`plan.moe_grouped` on sm_90: at least 2 "
            "routed rows per expert on average; counted from the code, `decode_targets.moe_path`, not measured): "
            + "; ".join(f"{arch} at batch {b} takes the grouped path ({rows} routed rows over {e} experts, {n} "
                        "launches in place of the routed path's 2 expert GEMVs)" for arch, b, rows, e, n in grouped)
            + ("; " + "; ".join(f"{arch} at batch {b} stays routed ({rows} rows over {e} experts)"
                                for arch, b, rows, e, _ in routed) if routed else "")
            + ". Those grouped rows run other expert kernels than batch 1, so their growth from batch 1 holds that "
              "change of path, not separated (no batch above 1 was profiled).")


def decode_step_table(receipts=RECEIPTS) -> str:
    """What int4 buys in a whole decode step (`python -m lab.decode_step`): per model, batch and context, one
    layer's time against its read floor: int4 as quantised, int4_fused and int4_fused2 (`fuse_decode`) graphed,
    int4_fused2 compiled, beside bf16's floor and the best bf16 (the fastest experts implementation graphed, or
    compiled where the receipt compiled bf16: only the implementation fastest graphed is compiled), tokens/s at the
    published depth against that bf16, and eager int4_fused2 against the fastest eager bf16 that
    `chapters.decode_step.best_row` admits (named; the range its samples allow, or undecided where either row's slope
    or fixed part is not, `decided`, or a slope lies wholly below its own graphed layer, `below_graphed`; a decided
    one marked where another eager row of a slope's configuration contradicts it, `contradicted`).
    From the receipt's `summary` and rows; "–" where it measured nothing."""
    found = _receipts("decode_step_*.json", receipts)
    if not found:
        return _not_yet("decode_step_<card>.json", "lab.decode_step", "step")
    out = []
    for path, r in found:
        with reading(path):
            refuse_partial(r, path)
            lines = ["| model | batch, context | int4 read floor / layer | int4 graphed | int4_fused graphed | "
                     "int4_fused2 graphed | int4_fused2 compiled | bf16 read floor | best bf16 measured | "
                     "tokens/s int4_fused2 / best bf16 | eager int4_fused2 / fastest eager bf16 |",
                     "|---|---|---|---|---|---|---|---|---|---|---|"]
            for arch, a in r.get("archs", {}).items():
                for case, v in a.get("summary", {}).items():
                    fl = v.get("int4_floor_us")
                    ratio = lambda k: (f"{v[k]:.1f} µs ({v[k] / fl:.2f}×)" if v.get(k) and fl else _f(v.get(k)))  # noqa: E731
                    bb = v.get("best_bf16") or {}
                    b, c = (int(x[1:]) for x in case.split())
                    lines.append(_line([
                        arch, f"{b}, {c}", f"{fl:.1f} µs" if fl else "–",
                        ratio("int4_graphed_per_layer_us"), ratio("int4_fused_graphed_per_layer_us"),
                        ratio("int4_fused2_graphed_per_layer_us"), ratio("int4_fused2_compiled_per_layer_us"),
                        _f(v.get("bf16_floor_us"), 1) + " µs",
                        f"{bb['per_layer_us']:.1f} µs ({bb.get('impl')}, {bb.get('run')})" if bb else "–",
                        _f(v.get("int4_fused2_over_best_bf16_tokens_per_s"), 2) + "×",
                        eager_text(e := eager_ratio(a, "int4_fused2", b, c, fastest=True))
                        + (f" ({e['impl']})" if e["impl"] else "")]))
            errs = {arch: sorted(a.get("errors") or {}) for arch, a in r.get("archs", {}).items() if a.get("errors")}
            out.append("\n".join(lines) + "\n\n" + (
                f"Parts that failed (their errors are in the receipt): {errs}. " if errs else "") +
                "Eager column: per layer = step(2 layers) − step(1 layer) from the run's eager samples, with the range "
                "they allow (min step(2) − max step(1) to max step(2) − min step(1)); a ratio is undecided where "
                "either row's slope range or fixed-part range (step(1) − per layer) reaches zero, a fixed range "
                "entirely below zero meaning the two-depth line fails for that row, or where either row's slope "
                "range lies wholly below the same configuration's graphed layer (graphing removes host launches, not "
                "device work, so at depth an eager layer costs at least its graphed one: such a slope is not one "
                "layer's cost) (chapter 07's rule for an eager row); the range holds only the spread of the run's own host-timed samples, not run-to-run "
                "noise, so a ratio whose range contains 1 does not say which eager step is faster, and one whose range "
                "excludes 1 says so for this run only, and only where the receipt's other eager rows do not "
                "contradict its slopes: a decided ratio is marked \"contradicted\" where a slope of its two lies "
                "wholly below that of the same state and experts implementation at a case no larger in batch and "
                "context, or wholly above one at a case no smaller (a layer's host work shrinks neither with the "
                "context nor with the batch, and its device work grows with both; set side by side only where both "
                "slopes' sample ranges lie above zero, neither row's two-depth line fails and neither slope lies "
                "wholly below its graphed layer), and is then no conclusion, even for this run: each depth's samples "
                "are taken back to back, so drift between the two depths' sample blocks is not in the range "
                f"(chapter 07's section 4 prints every such ratio, and claim 12 sets the ratios beside {RUNS[REPLACED]}'s); "
                + eager_bf16_text(r) + ". " + compiled_bf16_text(r) + " A batch of 16 is 16 "
                "identical sequences "
                "(every row starts from the same token over the "
                "same cache): it reads as many distinct experts as batch 1 (which ones is not recorded), so its rows are not batched decoding of distinct sequences. "
                + (f"{m} " if (m := moe_path_text(r)) else "") + f"`{path.name}`: {_prov(r)}.")
    return "\n\n".join(out)


def render_results(receipts=RECEIPTS) -> str:
    """RESULTS.md's block of the small models: their training, gates and GPTQ pack time, each table where its
    receipts exist (train_*.json from `python -m lab.train`, gptq_pack_*.json from `python -m lab.bench.pack`)."""
    parts = ["Generated by `python -m lab.report --results RESULTS.md` from the receipts in `data/receipts/`."]
    if any(Path(receipts).glob("train_*.json")):
        parts += ["**The small trained models** (`data/models/`, trained on Shakespeare's plays; ood = KJV)",
                  train_table(receipts)]
    parts += ["**Perplexity gates on the small models** (notebook 04; budget 1% relative perplexity)",
              gate_table(receipts)]
    if any(Path(receipts).glob("gptq_pack_*.json")):
        parts += ["**GPTQ pack time per layer**", pack_table(receipts)]
    return "\n\n".join(parts)


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


