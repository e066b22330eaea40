"""What a truncated-depth real-width fit (`lab.realscale_gate --layers`) rests on, read from its receipt: where each
measured depth's source sat (`source_bytes`, by device), the share of experts GPTQ swept at each depth (the rest
fell back to round-to-nearest: the gate table's "GPTQ→RTN fallback: n of m experts" note, kept in each depth's
`table`), and GPTQ's fitted sweeps and calibration forwards with the points they were fitted through; and which
fitted times the fixed + layers x per_layer line decides (`off_line`, `fitted_time`: a time whose timed part is off
the line is as undecided as one that is off it itself)."""
from __future__ import annotations

import re

_FALLBACK = re.compile(r"GPTQ→RTN fallback: (\d+) of (\d+) experts")


def _s(x) -> str:
    return "–" if x is None else f"{x:.3g} s"


def off_line(f: dict) -> bool:
    """A fit the fixed + layers x per_layer line does not describe: a negative slope (a deeper run measured less) or,
    through three or more depths, a negative fixed part (from depths that grow faster than the line, or below zero
    without such growth: `off_reasons` tells them apart). A line through two depths passes through both: its fixed
    part tests nothing (`two_depths`)."""
    return bool(f.get("warning")) or ((f.get("fixed") or 0) < 0 and not two_depths(f))


def two_depths(f: dict) -> bool:
    """True for a line through exactly two depths: it passes through both points, so no depth tests it."""
    return len(f.get("points") or {}) == 2


def _steps_grow(f: dict) -> bool:
    """True when each step per layer between neighbouring measured depths is larger than the one before."""
    pts = sorted((int(L), v) for L, v in (f.get("points") or {}).items() if v is not None)
    steps = [(v1 - v0) / (L1 - L0) for (L0, v0), (L1, v1) in zip(pts, pts[1:])]
    return len(steps) > 1 and all(b > a for a, b in zip(steps, steps[1:]))


def off_reasons(fits: dict) -> str:
    """The sentence naming the fits the line does not describe (`off_line`), each under its own reason: a negative
    slope; a negative fixed part with each step per layer larger than the last (the depths grow faster than the
    line); a negative fixed part whose steps do not grow (the rule counts it, but no faster growth stands behind
    it: its fixed part and slope are printed). "" when there is none."""
    off = {k: f for k, f in fits.items() if off_line(f)}
    if not off:
        return ""
    slope = [k for k, f in off.items() if f.get("warning") or (f.get("per_layer") or 0) < 0]
    rest = [k for k in off if k not in slope]
    grow = [k for k in rest if _steps_grow(off[k])]
    flat = [k for k in rest if k not in grow]
    names = lambda ks: ", ".join(f"`{k}`" for k in ks)                         # noqa: E731
    parts = ([f"with a negative slope (a deeper run measured less): {names(slope)}"] if slope else []) + (
        [f"with a negative fixed part and each step per layer larger than the last (the depths grow faster than the "
         f"line): {names(grow)}"] if grow else []) + (
        ["with a negative fixed part whose steps do not grow, so no faster growth stands behind it (the rule counts "
         "every negative fixed part through three or more depths): " + ", ".join(f"`{k}` (fixed {off[k]['fixed']:.3g} s against "
                                                 f"{off[k]['per_layer']:.3g} s a layer)" for k in flat)] if flat else [])
    return "Fits the line does not describe, so they decide nothing and are not shown: " + "; ".join(parts) + "."


def fit_flags(fits: dict) -> list:
    """The fits behind the time targets (gate, forwards, calibration forwards) the line does not describe
    (`off_line`): any one leaves the full-depth time and gate / forwards undecided, whatever the receipt's
    `targets` say."""
    return [k for k in ("gate_s", "forward_s", "calibration_forward_s") if off_line(fits.get(k) or {})]


# the timed parts each fitted row's time contains: GPTQ's calibration forwards run inside its build, the timed
# forwards inside the scoring loops, and both inside the gate
PARTS = {"gate_s": ("forward_s", "calibration_forward_s"), "build_s": ("calibration_forward_s",),
         "score_s": ("forward_s",)}


def fitted_time(fits: dict, key: str) -> str | None:
    """A fitted row's time cell when the line does not describe it or a part of it (`PARTS`, `off_line`):
    "undecided", naming them; a part off the line leaves the total open however straight the total looks (the
    line's own figure is shown beside it). None when the time and all its parts are on the line."""
    own = off_line(fits.get(key) or {})
    parts = [k for k in PARTS.get(key, ()) if off_line(fits.get(k) or {})]
    if not own and not parts:
        return None
    names = ", ".join(f"`{k}`" for k in parts)
    if own:
        return (f"undecided (the line does not describe `{key}`" + (f", {names}" if parts else "")
                + ": a negative slope or fixed part)")
    v = (fits.get(key) or {}).get("full_depth")
    return (f"undecided (contains {names}, which the line does not describe: a negative slope or fixed part"
            + (f"; the line through its own points gives {_s(v)}" if v is not None else "") + ")")


def fitted(fits: dict, key: str, fmt=None) -> str:
    """A fitted full-depth figure, or 'undecided' where the line does not describe its depths (`off_line`)."""
    f = fits.get(key) or {}
    if off_line(f) or f.get("full_depth") is None:
        return "undecided"
    return (fmt or _s)(f["full_depth"])


def _gates(depths: dict) -> list[tuple[str, dict]]:
    return [(L, d["gate"]) for L, d in sorted(depths.items(), key=lambda kv: int(kv[0])) if d.get("gate")]


def all_on_gpu(depths: dict) -> bool:
    """True when every measured depth's source lay wholly on CUDA devices (no layer kept on the host or disk)."""
    gates = _gates(depths)
    return bool(gates) and all(g.get("source_bytes") and all(k.startswith("cuda") for k in g["source_bytes"])
                               for _, g in gates)


def gptq_swept(depths: dict) -> dict[str, tuple[int, int, int]]:
    """{depth: (fewest experts GPTQ swept, most, experts in all)} over the fallback notes of the depth's GPTQ arms that
    its stored table holds (each draw calibrates on its own tokens, so arms differ); a depth without a note is left
    out."""
    out = {}
    for L, g in _gates(depths):
        got = [(int(m[2]) - int(m[1]), int(m[2])) for line in g.get("table") or [] if (m := _FALLBACK.search(line))]
        if got:
            out[L] = (min(s for s, _ in got), max(s for s, _ in got), got[0][1])
    return out


def _share(lo: int, hi: int, t: int) -> str:
    if lo == hi:
        return f"{lo} of {t} experts ({100 * lo / t:.0f} %)"
    return f"{lo}-{hi} of {t} experts ({100 * lo / t:.0f}-{100 * hi / t:.0f} %)"


def _settings(depths: dict) -> dict:
    """The gate settings of the first measured depth ({} where none ran)."""
    gates = _gates(depths)
    return (gates[0][1].get("settings") or {}) if gates else {}


def calib_tokens(depths: dict) -> tuple[int | None, bool]:
    """(calibration tokens per draw the depths ran, whether that is the README command's default)."""
    from int4lab.gate.cli import parser
    tokens = _settings(depths).get("calib_tokens")
    return tokens, tokens == parser().get_default("calib_tokens")


def used_tokens(depths: dict) -> int | None:
    """Calibration tokens a draw actually held: whole sequences of `calib_len` (`calibration_ids` keeps
    tokens // calib_len of them)."""
    st = _settings(depths)
    t, n = st.get("calib_tokens"), st.get("calib_len")
    return t // n * n if t and n else t


def min_rows(depths: dict) -> int | None:
    """The `--min-rows` the depths ran with; None at the default (K: `calib_need`)."""
    m = _settings(depths).get("min_rows")
    return m if isinstance(m, int) and not isinstance(m, bool) else None


def command_text(depths: dict) -> str:
    """How the fitted totals' command differs from the README's: "" at its defaults, else the calibration flags."""
    tokens, default = calib_tokens(depths)
    flags = ([] if default or tokens is None else [f"--calib-tokens {tokens}"]) + \
        ([f"--min-rows {min_rows(depths)}"] if min_rows(depths) else [])
    return " with " + " and ".join(f"`{f}`" for f in flags) if flags else ""


def _layers(L: str) -> str:
    return f"{L} layer{'' if L == '1' else 's'}"


def _points(fit: dict) -> str:
    return "; ".join(f"{_layers(L)} {v:.3g} s" for L, v in fit["points"].items())


def step_lines(fit: dict, n: int) -> list[float]:
    """Full-depth values of the lines through each pair of neighbouring measured depths, when the depths grow faster
    than a line (each step per layer at least the one before, three or more depths; [] otherwise): with every later
    layer costing at least the cheapest measured step, the least of them bounds the full depth from below."""
    pts = sorted(((int(L), v) for L, v in (fit.get("points") or {}).items()), key=lambda p: p[0])
    if len(pts) < 3 or any(v is None for _, v in pts):
        return []
    slopes = [(v1 - v0) / (L1 - L0) for (L0, v0), (L1, v1) in zip(pts, pts[1:])]
    if any(b < a for a, b in zip(slopes, slopes[1:])) or slopes[0] <= 0:
        return []
    return [v1 + (n - L1) * k for ((_, _), (L1, v1)), k in zip(zip(pts, pts[1:]), slopes)]


def step_growth(fit: dict) -> str:
    """The measured steps per layer between neighbouring depths, each with the one it exceeds: what "grow faster
    than a line" rests on (one run per depth; the first layer's cost is not separable from the fixed part)."""
    pts = sorted(((int(L), v) for L, v in (fit.get("points") or {}).items()), key=lambda p: p[0])
    steps = [((L0, L1), (v1 - v0) / (L1 - L0)) for (L0, v0), (L1, v1) in zip(pts, pts[1:])]
    return "; ".join(f"the step per layer from {b[0][0]} to {b[0][1]} layers, {b[1]:.0f} s, exceeds the {a[1]:.0f} s "
                     f"from {a[0][0]} to {a[0][1]}" for a, b in zip(steps, steps[1:]))


def _steps(fit: dict, n: int) -> str:
    steps = step_lines(fit, n)
    return (f"; each step larger than the last: the lines through neighbouring depths give "
            f"{min(steps):.0f}-{max(steps):.0f} s" if steps else "")


def gptq_text(arch: str, ex: dict, depths: dict, card_bytes, fitted, gb, log=None) -> str:
    """The GPTQ line under a fit's table: sweeps and calibration forwards fitted to full depth, each with its own
    points; the depths' placement (all on the GPU, and whether the GPU-peak fit passes the card at full depth); the
    README-defaults total with its target; the share of experts GPTQ swept at the calibration size the depths ran."""
    f, n = ex["fits"], ex["full_layers"]
    t = (ex.get("targets") or {}).get("gate_s") or {}
    d = f.get("default_gate_s") or {}
    whole = ""
    if d:
        v = fitted(f, "default_gate_s", lambda x: f"{x:.0f} s ({x / 60:.0f} min)")
        cap, peak = ex.get("device_map_cap") or {}, (f.get("gpu_peak_bytes") or {}).get("full_depth")
        # a placement the measured depths did not have (layers or arms past the GPU's share) leaves it open
        moved = cap.get("source_exceeds_cap") or (cap and peak and card_bytes and peak > card_bytes)
        # a part of the total the line does not describe leaves the total's verdict open, however straight it looks
        off = [k for k in ("gptq_sweep_default_s", "gptq_forward_default_s") if k in f and fitted(f, k) == "undecided"]
        steps = step_lines(d, n)
        verdict = ("" if not t.get("target") else
                   f" (target ≤ {t['target']:.0f} s: the depths grow faster than a line ({step_growth(d)}, one run "
                   f"per depth), and every line through two neighbouring depths passes the target, "
                   f"{min(steps):.0f}-{max(steps):.0f} s: missed if no later layer costs less than the cheapest one "
                   f"measured)"
                   if v == "undecided" and steps and min(steps) > t["target"] else
                   f" (target ≤ {t['target']:.0f} s: undecided)" if v == "undecided"
                   else f" (target ≤ {t['target']:.0f} s: undecided, a line through two depths is not tested by "
                        "either)" if two_depths(d)
                   else f" (target ≤ {t['target']:.0f} s: undecided, the line does not describe its part "
                        + ", ".join(f"`{k}`" for k in off) + ")" if off
                   else f" (target ≤ {t['target']:.0f} s: "
                        + ("undecided: the fit holds for the measured depths' placement, which a full-depth run cannot "
                           "keep: below)" if moved and d["full_depth"] <= t["target"] else
                           f"{'met' if d['full_depth'] <= t['target'] else 'missed'})"))
        whole = (f"The README's command{command_text(depths)} at its defaults (every ticket and draw, every document), "
                 f"each depth's parts "
                 f"scaled by `lab.realscale_predict` and fitted to {n} layers: **{v}**{verdict} (points by depth: "
                 f"{_points(d)}); the fitted row above is the quick settings the depths ran."
                 + floor_text(depths, log.parent if log is not None else None) + " ")
    text = whole + (f"GPTQ at the README's defaults{command_text(depths)} (every draw of both targets), each depth scaled "
            f"by `lab.realscale_predict` "
            f"and fitted to {n} layers: column sweeps {fitted(f, 'gptq_sweep_default_s')} (points by depth: "
            f"{_points(f['gptq_sweep_default_s'])}{_steps(f['gptq_sweep_default_s'], n)}), calibration forwards "
            f"{fitted(f, 'gptq_forward_default_s')}"
            + (f" (points: {_points(f['gptq_forward_default_s'])})" if "gptq_forward_default_s" in f else "") + ".")
    if all_on_gpu(depths):
        peak = (f.get("gpu_peak_bytes") or {}).get("full_depth")
        cap = ex.get("device_map_cap") or {}
        text += (" These fits and the table's fitted row run through depths whose layers all sat on the GPU "
                 "(`source_bytes`: no host offload)"
                 + (f"; at {n} layers the source alone ({gb(cap['source_gpu_bytes_full_depth'])} fitted) "
                    f"{'exceeds' if cap['source_exceeds_cap'] else 'stays under'} the GPU's `--max-memory` share "
                    f"({gb(cap['gpu_cap_bytes'])})" if cap.get("gpu_cap_bytes") else "")
                 + (f", while the GPU-peak fit, extrapolating the group of arms every measured depth held, reaches "
                    f"{gb(peak)} against the card's {gb(card_bytes)}: how many arms such a run holds beside the source "
                    f"was not predicted for a device-map run, nor measured"
                    if peak and card_bytes and peak > card_bytes else "") + ".")
    return text + swept_text(arch, depths, log)


def measured_floors(receipts) -> list[tuple[str, float, float]]:
    """[(receipt, measured floor s, the estimate for that run)] for every depth of the real-width receipts in the
    folder `receipts` that ran the precision floor: the estimate is what `lab.realscale_predict.default_seconds`
    gives the same run (its own arms and texts) with its floor taken as not measured."""
    import json
    from pathlib import Path

    from lab.realscale_predict import default_seconds
    out = []
    for p in sorted(Path(receipts).glob("realscale_gate_*.json")):
        for a in json.loads(p.read_text()).get("archs", {}).values():
            for d in (a.get("depths") or {}).values():
                g = d.get("gate") or {}
                tm = g.get("timing") or {}
                if not tm.get("floor_s") or not g.get("texts"):
                    continue
                full = {k: sum(t[k] for t in g["texts"].values()) for k in ("tokens", "docs")}
                est = default_seconds({**g, "timing": {**tm, "floor_s": 0.0}}, full, g["arms_by_kind"])["floor_s"]
                out.append((p.name, tm["floor_s"], est))
    return out


def floor_text(depths: dict, receipts=None) -> str:
    """The README-defaults total's precision-floor part where no measured depth ran the floor: how
    `lab.realscale_predict` estimates it, its size at the depths, and what the receipts that measured a floor
    (`measured_floors`, in the folder `receipts`) took against the same estimate for their own runs. "" where every
    depth measured its floor."""
    est = [d["defaults"]["seconds"]["floor_s"] for _, d in sorted(depths.items(), key=lambda kv: int(kv[0]))
           if d.get("gate") and str((((d.get("defaults") or {}).get("seconds") or {}).get("formulas") or {})
                                    .get("floor_s", "")).startswith("estimated")]
    if not est:
        return ""
    text = (f" The total holds a precision-floor part that no measured depth ran: `lab.realscale_predict` estimates "
            f"it as 2 passes over every 16th document at the arms' scoring cost per token ({min(est):.2g}-"
            f"{max(est):.2g} s at the measured depths), which leaves out the float32 copy of the source that the floor "
            f"loads and scores (twice the source's bytes, held beside the source: a placement no fitted depth had)")
    checks = [(n, m / e) for n, m, e in (measured_floors(receipts) if receipts is not None else []) if e]
    if not checks:
        return text + "; no receipt here measured a floor to check the estimate against."
    lo, hi = min(q for _, q in checks), max(q for _, q in checks)
    names = [f"`{n}`" for n in sorted({n for n, _ in checks})]
    many = len(checks) > 1
    return text + (f"; the {'floors' if many else 'floor'} measured in {' and '.join(names)} took "
                   + (f"{lo:.0f}×" if f"{lo:.0f}" == f"{hi:.0f}" else f"{lo:.0f}-{hi:.0f}×")
                   + f" that estimate for {'their own runs' if many else 'its own run'}, so the total's floor part "
                     "rests on an estimate that the floors measured do not bear out.")


def calib_need(arch: str) -> tuple[int, int]:
    """(K, tokens): an expert's default `min_rows` (K = max(H, I), the K of its widest input) and the calibration
    tokens per draw that give every expert K routed rows when routing is even (K x E / k)."""
    from int4lab.archs import ARCHS
    c = ARCHS[arch].published.config
    K = max(c["hidden_size"], c.get("moe_intermediate_size") or c["intermediate_size"])
    E = c.get("num_local_experts") or c["num_experts"]
    return K, -(-K * E // c["num_experts_per_tok"])


def swept_text(arch: str, depths: dict, log=None) -> str:
    """The share of experts GPTQ swept at each depth, with the calibration tokens per draw it had and the tokens
    that would give every expert `min_rows` on even routing; "" when the receipt's tables record no fallback."""
    swept = gptq_swept(depths)
    tokens, default = calib_tokens(depths)
    m = min_rows(depths)
    if not swept:
        if m and any(((g.get("arms_by_kind") or {}).get("gptq") for _, g in _gates(depths))):
            return (f" With `--min-rows {m}` and {tokens:,} calibration tokens per draw the stored tables record no "
                    f"expert packed round-to-nearest: GPTQ swept every expert at every depth, so the sweeps' times "
                    f"are GPTQ's for all experts (an expert calibrated from fewer rows than its K = "
                    f"{calib_need(arch)[0]} inputs has a rank-deficient Hessian, made positive definite by the "
                    f"damping, `int4lab/gptq.py`; the column sweep's work does not depend on the rows).")
        return ""
    K, n = calib_need(arch)
    need = (f"; an expert needs `min_rows` = K = {K} routed rows, which even routing gives every expert from "
            f"{n:,} calibration tokens per draw, uneven routing only from more" if not m else
            f"; `--min-rows {m}`: an expert needs {m} routed row{'s' if m > 1 else ''}")
    used = used_tokens(depths)
    held = "" if used in (None, tokens) else f", of which a draw holds {used:,}: whole sequences of the window"
    head = (f" With {tokens:,} calibration tokens per draw ({'the README' if default else 'not the README'}'s default"
            f"{held}) GPTQ swept " + ", ".join(f"{_share(lo, hi, t)} at {_layers(L)}" for L, (lo, hi, t) in swept.items())
            + " (over the GPTQ arms whose rows the receipt's stored table holds)")
    if m == 1:
        return head + ("; the rest had no routed calibration row at all (`--min-rows 1`: an expert needs one), so no "
                       "calibration sweeps them: the sweeps' times are GPTQ's for every expert the calibration "
                       "reaches.")
    if all(lo == t for lo, _, t in swept.values()):
        return head + ": every expert, so the sweeps' times are GPTQ's for all experts at this calibration size."
    return head + (f"; the rest fell back to round-to-nearest (fewer routed calibration rows than `min_rows`{need}), so "
                   "the sweeps' times hold for that share under the synthetic checkpoint's routing, not for all experts."
                   + gptq_rate_text(arch, depths, log))


def log_split(builds: list) -> tuple[list[float], dict[str, float]]:
    """From a gate's build lines [(arm, quantise s)] (`runlog.measured_builds`): the experts-only GPTQ arms' quantise
    times, and {draw: what the experts+attn arm of that draw took over the experts-only arm of the same draw} (its
    attention's GPTQ: the two differ only in attention's sweeps) for each draw the log holds in both kinds."""
    from .runlog import kind_of
    only = {a: q for a, q in builds if kind_of(a) == "gptq"}
    both = {a.replace("/experts+attn/", "/experts/"): q for a, q in builds if kind_of(a) == "gptq/experts+attn"}
    return list(only.values()), {a.rsplit(" ", 1)[-1]: q - only[a] for a, q in both.items() if a in only}


def gptq_rate_text(arch: str, depths: dict, log=None) -> str:
    """GPTQ's time for every expert predicted from the swept experts' rate at the deepest depth that swept any
    (experts swept per arm: the middle of the stored rows' range). With the stage log beside the receipt (`log`,
    whose build lines for that depth hold every GPTQ arm the receipt counts): the rate is the experts-only GPTQ arms'
    mean quantise time per swept expert (an upper bound for the sweep: the quantise time holds the arm's calibration
    forwards), and the prediction is the README's GPTQ arms x that rate x every expert of the published depth, plus
    the experts+attn arms' extra over the experts-only arm of the same draw (attention's sweeps), scaled to the
    README's GPTQ arms and the published depth; it leans high, since a layer's experts share a batched sweep.
    Without a log: no prediction (the receipt's sweeps also hold the attention sweeps, and a batched sweep's cost
    is not proportional to the experts in it), a pointer to the architecture's `--min-rows 1` receipt where the
    log's folder holds one. "" where no expert was swept."""
    from int4lab.archs import ARCHS
    swept = {L: v for L, v in gptq_swept(depths).items() if v[0] > 0}
    if not swept:
        return ""
    L = max(swept, key=int)
    lo, hi, t = swept[L]
    g, dft = depths[L]["gate"], (depths[L].get("defaults") or {}).get("gptq") or {}
    arms, arms_def = (g.get("arms_by_kind") or {}).get("gptq", 0), dft.get("arms")
    if not arms or not arms_def or g.get("gptq_sweep_s") is None:
        return ""
    layers = ARCHS[arch].published.config["num_hidden_layers"]
    every = t // int(L) * layers
    rows = [line for line in g.get("table") or [] if _FALLBACK.search(line)]
    attn_rows = sum("/experts+attn/" in line for line in rows)
    whose = ("the experts+attn arms' rows, taken for the experts-only arms of the same draws too (their own "
             "counts are not stored)" if attn_rows == len(rows) else
             "the experts-only arms' rows, taken for the experts+attn arms too" if not attn_rows else
             "taken for every arm")
    from .runlog import kind_of, measured_builds
    builds = []
    if log is not None and log.exists():
        builds = (measured_builds(log.read_text(encoding="utf-8", errors="replace")).get(arch) or {}).get(L) or []
    gptq_q = [q for a, q in builds if kind_of(a).startswith("gptq")]
    only, extra = log_split(builds)
    if only and len(gptq_q) == arms:
        mean = sum(only) / len(only)
        rate = mean / ((lo + hi) / 2)
        per_arm = rate * every
        attn = sum(extra.values()) * arms_def / arms * layers / int(L)
        total = per_arm * arms_def + attn
        scaled = "" if arms_def == arms and layers == int(L) else (
            f", {attn:.0f} s scaled to the README's {arms_def} GPTQ arms and {layers} layers")
        # at the published depth the measured gate itself, with GPTQ's quantising replaced by the prediction
        tail = (f"; the rest of the gate on top: in place of the {sum(gptq_q):.3g} s the log's GPTQ arms took, a gate "
                f"of about {g['s'] - sum(gptq_q) + total:.0f} s with every expert swept (not run)"
                if int(L) == layers and g.get("s") else "; the rest of the gate comes on top")
        return (f" At that routing GPTQ's rate, from the {_layers(L)} depth's build lines in "
                f"`data/receipts/{log.name}`: the {len(only)} experts-only GPTQ arms quantised in {mean:.3g} s each "
                f"(mean) over {_share(lo, hi, t).split(' (')[0]} swept = {rate:.3g} s an expert, an upper bound for "
                f"its sweep (an arm's quantise time holds its calibration forwards too, "
                f"{g.get('gptq_forward_s') or 0:.3g} s over the receipt's {arms} GPTQ arms; the swept counts are the "
                f"stored table's GPTQ rows, {len(rows)} rows, {whose}); each experts+attn arm took "
                + ", ".join(f"{v:.3g}" for v in extra.values())
                + f" s more than the experts-only arm of the same draw ({', '.join(extra)}; attention's GPTQ: its "
                f"sweeps and any calibration forward time it adds), {sum(extra.values()):.3g} s in all against the "
                f"receipt's {g['gptq_sweep_s']:.3g} s of sweeps. Every expert at "
                f"the published depth ({every:,}) at that rate: {per_arm:.0f} s per GPTQ arm, "
                f"{per_arm * arms_def:.0f} s for the README's {arms_def} GPTQ arms, plus attention's "
                f"{sum(extra.values()):.3g} s{scaled}: {total:.0f} s ({total / 60:.0f} min) of GPTQ quantising, "
                f"calibration forwards included (a prediction that scales the forwards with the experts swept, so "
                f"it leans high){tail}.")
    # the fit with every routed expert swept (a partial run beside it, e.g. a forced-offload one, is not that fit)
    allx = [q.name for q in sorted(log.parent.glob(f"realscale_gate_{arch}_allexperts_*.json"))
            if "offload" not in q.name] if log else []
    return (" GPTQ sweeps a layer's experts in batches (`int4lab/quantize/driver.py`; as many as its scratch budget "
            "holds: a quarter of the free GPU memory, at most 16 GiB, `budget_bytes` in "
            "`int4lab/quantize/placement.py`), so its time need not grow in proportion to the experts swept, and no "
            "prediction for every expert is read off this share"
            + (f"; `data/receipts/{allx[0]}` measures it with every expert that calibration reaches swept "
               "(`--min-rows 1`)." if allx else "."))


def one_depth(a: dict) -> bool:
    """True when the architecture's fits rest on one measured depth (no line: `fit_depths`' 'one depth' rule)."""
    return any(str(v.get("fit", "")).startswith("one depth")
               for v in ((a.get("extrapolation") or {}).get("fits") or {}).values())


def one_depth_text(arch: str, a: dict, log=None) -> str:
    """A fit-mode run that measured one depth: no full-depth time is read off it; what it holds is the measured
    depth, the share GPTQ swept and GPTQ's rate."""
    depths = a.get("depths", {})
    missed = "; ".join(f"{_layers(L)} {'skipped: ' + d['skipped'] if d.get('skipped') else 'not measured: '}"
                       f"{'' if d.get('skipped') else (d.get('error') or {}).get('error') or 'not run'}"
                       for L, d in sorted(depths.items(), key=lambda kv: int(kv[0])) if not d.get("gate"))
    return (f"One depth measured ({missed}): a line needs two, so no full-depth time or memory is read off this run"
            + command_text(depths).replace(" with", "; it ran with") + "." + swept_text(arch, depths, log))


def pack_text(path, r: dict, prov: str) -> str:
    """A lottery ticket's pack (dithered round-to-nearest) against round-to-nearest's, per shape, from a
    `lab.bench.pack` receipt: medians of its repeats, the ratio of the medians against the ticket target (1.5x)."""
    by = {}
    for row in r["rows"]:
        by.setdefault((row["N"], row["K"]), {})[row["impl"]] = row
    cells = []
    for (N, K), rows in by.items():
        t, b = rows.get("rtn_dithered"), rows.get("rtn")
        if t and b:
            q = t["seconds"] / b["seconds"]
            cells.append(f"{N}×{K}: {1e3 * t['seconds']:.3f} against {1e3 * b['seconds']:.3f} ms ({q:.2f}×, "
                         f"{'met' if q <= 1.5 else 'missed'})")
    return (f"A lottery ticket's pack against round-to-nearest's on the GPU (`data/receipts/{path.name}`, {prov}; "
            f"median of {r['config']['repeats']} calls each, from weights on the device to packed bytes, target "
            f"≤ 1.5×): " + "; ".join(cells) + ".")


def _ticket_cost(g: dict) -> str:
    """A ticket's build against round-to-nearest's, per arm (`build_s_by_kind` over `arms_by_kind`: the source copy
    and the pack, synchronised); "" where the receipt lacks either kind."""
    b, n = g.get("build_s_by_kind") or {}, g.get("arms_by_kind") or {}
    if not (b.get("lottery") and b.get("rtn") and n.get("lottery") and n.get("rtn")):
        return ""
    t, r = b["lottery"] / n["lottery"], b["rtn"] / n["rtn"]
    return (f"; a ticket's build (source copy and pack) {t:.3f} s per arm against round-to-nearest's {r:.3f} s "
            f"({t / r:.2f}×)")


def full_text(arch: str, a: dict, r: dict, log=None) -> str:
    """The targets of a full-depth run (`--full`), from its receipt: the gate's time against the architecture's
    target, the time outside the forwards and GPTQ's column sweeps against the forwards' own time, the tickets
    per round-to-nearest arm, and the receipt's gate / forwards beside TARGET_RATIO."""
    f = a["full"]
    (L, g), = _gates(a["depths"])
    if r["settings"].get("gate_args"):            # quick settings: the target is read off the scaled defaults
        return quick_full_text(arch, a, r, L, log)
    tm, ph = g["timing"], f["phases"]
    fw = tm["forward_s"] + tm.get("calibration_forward_s", 0.0)
    sweeps = ph.get("gptq_sweep_s") or 0.0
    outside = f["gate_s"] - fw - sweeps
    target = r["settings"]["targets"]["gate_s"].get(arch)
    arms = f.get("arms") or {}
    tickets = arms.get("lottery", 0) / arms["rtn"] if arms.get("rtn") else None
    ratio_t = r["settings"]["targets"]["gate_over_forwards"]
    return (f"Targets at {L} layers: the gate {f['gate_s']:.0f} s"
            + (f" against ≤ {target:.0f} s: {'met' if f['gate_s'] <= target else 'missed'}" if target else "")
            + f"; the time outside the timed forwards (scoring and GPTQ calibration, {fw:.0f} s; the floor's forwards "
              f"are not timed apart, so they count outside) and GPTQ's column sweeps ({sweeps:.0f} s) is "
              f"{f['gate_s']:.0f} − {fw:.0f} − {sweeps:.0f} = {outside:.0f} s against the forwards' own {fw:.0f} s: "
              f"{'met' if outside <= fw else 'missed'}"
            + (f"; {tickets:g} lottery tickets per round-to-nearest arm" if tickets else "")
            + _ticket_cost(g)
            + f". The receipt's gate / forwards, sweeps and building included, is {f['gate_over_forwards']:.2f} "
              f"(`TARGET_RATIO` {ratio_t} in `lab/realscale_gate.py`: "
              f"{'met' if f['gate_over_forwards'] <= ratio_t else 'missed'})." + swept_text(arch, a["depths"], log))


def quick_full_text(arch: str, a: dict, r: dict, L: int, log=None) -> str:
    """A full-depth run with quick settings (`--gate-args`): its own time is not the README command's; the
    command's time at its defaults is this depth's parts scaled by `lab.realscale_predict` (each part at its
    measured unit cost, the groups the arms fell into at this depth), set against the target and beside the
    earlier fit's prediction for the same command."""
    d = a["depths"][str(L)]
    sec, gp = d["defaults"]["seconds"], d["defaults"].get("gptq") or {}
    target = r["settings"]["targets"]["gate_s"].get(arch)
    tot = sec["total"]
    parts = ", ".join(f"{k.removesuffix('_s')} {_n(sec[k])}" for k in ("build_s", "score_s", "floor_s",
                                                                          "bootstrap_s", "fixed_s"))
    text = (f"At {L} layers, the published depth, with the quick settings (`{' '.join(r['settings']['gate_args'])}`; "
            f"the gate's time in the row is theirs, not the README command's): the README's command at its defaults "
            f"(every ticket and draw, every document), each part of this run scaled by `lab.realscale_predict` "
            f"({sec['formulas']['score_s']} for scoring): **{_n(tot)} ({tot / 60:.0f} min)**"
            + (f" against ≤ {target:.0f} s: {'met' if tot <= target else 'missed'}" if target else "")
            + f" ({parts}; the floor {'measured' if 'estimated' not in sec['formulas']['floor_s'] else 'estimated'})")
    if gp:
        text += (f"; GPTQ at the defaults: column sweeps {_n(gp['sweep_s'])} and calibration forwards "
                 f"{_n(gp['calibration_forward_s'])} ({gp['formula']})")
    text += f". Checkpoint written in {_n(a['full']['checkpoint_s'])} before the gate."
    fit = earlier_default(a["full"].get("earlier_fit"), arch)
    if fit:
        text += (f" The fit over {fit[1]} in `{fit[0]}` had put the same command at {_n(fit[2])} for a placement "
                 f"of that run's depths (all on its card).")
    return text + swept_text(arch, a["depths"], log)


def earlier_default(e: dict | None, arch: str):
    """(receipt, depths, README-defaults seconds at full depth) of the fit a full run names, where that receipt
    is committed and its line describes its depths; None otherwise."""
    import json

    from lab.paths import RECEIPTS
    if not e or not (RECEIPTS / e["receipt"]).exists():
        return None
    fits = json.loads((RECEIPTS / e["receipt"]).read_text())["archs"][arch]["extrapolation"]["fits"]
    f = fits.get("default_gate_s") or {}
    if off_line(f) or f.get("full_depth") is None:
        return None
    return e["receipt"], _layers("-".join(map(str, (min(e["depths"]), max(e["depths"]))))), f["full_depth"]


def _n(x) -> str:
    """Seconds to three significant figures below 1,000, whole seconds above (no exponent)."""
    return f"{x:.0f} s" if x >= 1000 else _s(x)
