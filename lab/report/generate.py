"""The `generate` receipts' block (`python -m lab.decode_step.generate`): transformers' `generate` decode tokens/s,
(N − 1) / (t(N) − t(1)) from an N-token and a 1-token call, so prefill and set-up cancel (a decode-only rate, not
the rate of one whole call), int4 and int4_fused2 against bf16, per model, depth and mode, with what was not
measured.

The receipts name the state int4 through `fuse_decode(model)` (its defaults: attention and add + norm fused too)
`int4_fused`; the decode-step benchmark calls that form `int4_fused2` and keeps `int4_fused` for the form without
the attention and add + norm launches, so the block shows it under `int4_fused2` (`shown`)."""
from __future__ import annotations

import re
from pathlib import Path

from lab.paths import RECEIPTS
from lab.provenance import portable_command
from .decode import _line, read, reading
from .pages import _prov

GENERATE_START, GENERATE_END = "<!-- generate:start -->", "<!-- generate:end -->"
STATES = ("bf16", "int4", "int4_fused")
MODES = ("eager", "compiled")
RATIOS = ("int4/bf16", "int4_fused/bf16")
# receipt state name -> the decode-step benchmark's name for the same form (fuse_decode's defaults)
SHOWN = {"int4_fused": "int4_fused2"}


def shown(text: str) -> str:
    """`text` (a state, a ratio such as "int4_fused/bf16", a row label) with each receipt state name replaced by its
    name in `SHOWN`: whole names only, so a name already shown is left as it is."""
    return re.sub(r"\b(" + "|".join(map(re.escape, SHOWN)) + r")\b", lambda m: SHOWN[m.group(1)], text)


def verdict_rule(lo: float, hi: float, ratio: str = "int4/bf16") -> str:
    """The receipt's own rule (`lab.decode_step.generate.verdict`) for `ratio` ("<state>/bf16"): "<state> faster"
    only when the median's interval lies wholly above 1, "<state> slower" wholly below, else "undecided"."""
    from lab.decode_step.generate import verdict          # here, not at import: that module loads the models' stack
    return verdict(lo, hi, ratio.split("/")[0])


def verdicts(rec: dict) -> list[dict]:
    """Every ratio the receipt decides: {arch, depth, mode, ratio, median, lo, hi, verdict} (verdict as recorded)."""
    out = []
    for arch, a in sorted(rec.get("archs", {}).items()):
        for mode, m in a.get("modes", {}).items():
            for name, by_depth in (m.get("ratios") or {}).items():
                for depth, r in sorted(by_depth.items(), key=lambda kv: int(kv[0])):
                    if "median" in r:
                        out.append({"arch": arch, "depth": int(depth), "mode": mode, "ratio": name,
                                    **{k: r[k] for k in ("median", "lo", "hi", "verdict")}})
    return out


def _tps(row: dict | None, depth) -> str:
    s = ((row or {}).get("depths", {}).get(str(depth)) or {}).get("tokens_per_s_spread")
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})" if s else "–"


def _ratio(m: dict, name: str, depth) -> str:
    r = (m.get("ratios") or {}).get(name, {}).get(str(depth))
    if not r:
        return "–"
    if "median" not in r:
        return r.get("verdict", "–") + (f" ({r['note']})" if r.get("note") else "")
    return f"{r['median']:.2f}× ({r['lo']:.2f}–{r['hi']:.2f}), {r['verdict']}"


def _stable(m: dict) -> str:
    """Per state: how many distinct token ids its greedy stream holds (of how many) and whether that stream was the
    same in every round."""
    st, tok = m.get("stable") or {}, m.get("tokens") or {}
    return "; ".join(f"{shown(s)} " + (f"{len(set(tok[s]))} of {len(tok[s])}, " if tok.get(s) else "")
                     + ("same" if st[s] else "not the same") for s in STATES if s in st) or "–"


def _streams(arch: str, mode: str, m: dict) -> str | None:
    """The greedy streams a ratio's rounds were fed, as far as the receipt keeps them: each state's stream of the
    last round only (`lab.decode_step.generate.run_mode`). Which states' kept streams are the same, and for each
    int4 state in how many decode steps it was fed the same token id as bf16 (an N-token call's decode steps are fed
    its first N − 1 tokens, the first token coming from the prefill); a state whose stream was not the same in every
    round leaves its other rounds' ids unrecorded. None where the receipt keeps no bf16 stream."""
    tok, st = m.get("tokens") or {}, m.get("stable") or {}
    have = [s for s in STATES if tok.get(s)]
    if "bf16" not in have or len(have) < 2:
        return None
    same = [f"{shown(x)} and {shown(y)} the same" for i, x in enumerate(have) for y in have[i + 1:] if tok[x] == tok[y]]
    fed = [f"{shown(s)} fed the same token id as bf16 in {sum(a == b for a, b in zip(tok[s][:-1], tok['bf16'][:-1]))} "
           f"of its {len(tok[s]) - 1} decode steps" for s in have if s != "bf16"]
    moving = [shown(s) for s in have if st.get(s) is False]
    return (f"{arch}, {mode}, greedy streams of the last round (the only round whose streams the receipt keeps): "
            + "; ".join(same + fed)
            + (f"; not the same in every round: {', '.join(moving)}, whose other rounds' ids are not recorded"
               if moving else "") + ".")


def _missing(rec: dict, arch: str, a: dict) -> list[str]:
    """What the receipt did not measure for `arch`: the modes absent, its `skipped` and `errors` rows (the
    architecture's and each mode's)."""
    out = []
    asked = rec.get("settings", {}).get("modes", list(MODES))
    for mode in MODES:
        if mode not in a.get("modes", {}) and mode not in a.get("errors", {}):
            why = next((k["why"] for k in a.get("skipped", []) if k.get("what") == mode), None)
            out.append(f"{mode}: {'not run' if mode not in asked else 'not in the receipt'}"
                       + (f" ({why})" if why else ""))
    rows = [(k["what"], f"skipped ({k['why']})") for k in a.get("skipped", []) if k.get("what") not in MODES]
    rows += [(k, f"error: {e['error']}") for k, e in a.get("errors", {}).items()]
    for mode, m in a.get("modes", {}).items():
        rows += [(k["what"], f"skipped ({k['why']})") for k in m.get("skipped", [])]
        rows += [(f"{mode} {k}", f"error: {e['error']}") for k, e in m.get("errors", {}).items()]
    return out + [f"{shown(what)}: {why}" for what, why in rows]


def receipt_text(path, rec: dict) -> str:
    """One receipt's paragraph and table."""
    s = rec.get("settings", {})
    head = (f"`data/receipts/{Path(path).name}` ({_prov(rec)}, transformers {rec.get('transformers', '?')}; "
            f"`{portable_command(rec.get('command'))}`): batch 1, prompt {s.get('prompt')}, {s.get('new')} new "
            f"tokens, greedy, {s.get('rounds')} paired rounds, random weights at the "
            f"{'published' if s.get('width') == 'real' else s.get('width')} width"
            + ("" if rec.get("complete") else "; **incomplete** (the run stopped before its end)") + ".")
    lines = [head, "", "| model | layers | mode | rounds | " + " | ".join(f"tokens/s {shown(st)}" for st in STATES)
             + " | " + " | ".join(shown(r).replace("/", " / ") for r in RATIOS) + " | greedy tokens: distinct ids of those decoded, the same in every round? |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for arch, a in sorted(rec.get("archs", {}).items()):
        for mode, m in a.get("modes", {}).items():
            for d in a.get("depths", []):
                rows = m.get("rows", {})
                lines.append(_line([arch, f"{d} of {a.get('full_layers', '?')}", mode, m.get("rounds", "–"),
                                    *(_tps(rows.get(st), d) for st in STATES),
                                    *(_ratio(m, r, d) for r in RATIOS), _stable(m)]))
        miss = _missing(rec, arch, a)
        notes.append(f"{arch}, not measured: " + ("; ".join(miss) if miss else "nothing") + ".")
        notes += [t for mode, m in a.get("modes", {}).items() for t in [_streams(arch, mode, m)] if t]
    if len(lines) == 4:
        lines.append(_line(["–"] * 10))
    return "\n".join(lines + ["", *notes])


def generate_text(receipts_dir=RECEIPTS) -> str:
    """Every `generate*_*.json` in `receipts_dir`: provenance, tokens/s per state (median, min–max over rounds), the
    int4 / bf16 and int4_fused2 / bf16 per-round ratios' medians with their 95 % intervals and the receipt's verdicts,
    greedy stability, and what was not measured; "not yet measured" where there is no such receipt."""
    found = sorted(Path(receipts_dir).glob("generate*_*.json"))
    if not found:
        return ("`generate` tokens/s: not yet measured (no `data/receipts/generate*_*.json`; run "
                "`python -m lab.decode_step.generate --out data/receipts/generate_<card>.json` on a CUDA machine).")
    out = []
    for path in found:
        rec = read(path)
        with reading(path):
            out.append(receipt_text(path, rec))
    legend = ("tokens/s: median (min–max) over the rounds, (N − 1) / (t(N) − t(1)) per round, a decode-only rate "
              "(prefill and `generate`'s set-up cancel in the difference; not the rate of one whole call); a ratio: the "
              "median of the per-round ratios (its 95 % distribution-free interval) and the receipt's "
              "verdict: a state faster or slower only when that interval lies wholly above or below 1. int4_fused2: "
              "int4 then `fuse_decode(model)` with its defaults (`attention=True, add_norm=True`), the receipt's "
              "`int4_fused` state and the decode-step benchmark's int4_fused2; whether its one-launch attention "
              "took its fast path in `generate`'s loop (else the stock attention runs) is not recorded. Greedy tokens: "
              "on random weights a greedy stream can collapse to one repeated id, and a stream the same in every "
              "round then says little about determinism. The receipt keeps each state's stream of the last round "
              "only; the line per model and mode under the table says which of those streams are the same and in "
              "how many decode steps each int4 state was fed the same token id as bf16 (the other steps compare "
              "different token ids at the same shapes and cache positions).")
    return "\n\n".join(out + [legend])
