"""What a truncated-depth real-width fit (`lab.realscale_gate --layers`) rests on, read from its receipt: where each
measured depth's source sat (`source_bytes`, by device), the share of experts GPTQ swept at each depth (the rest
fell back to round-to-nearest: the gate table's "GPTQ→RTN fallback: n of m experts" note, kept in each depth's
`table`), and GPTQ's fitted sweeps and calibration forwards with the points they were fitted through."""
from __future__ import annotations

import re

_FALLBACK = re.compile(r"GPTQ→RTN fallback: (\d+) of (\d+) experts")


def _gates(depths: dict) -> list[tuple[str, dict]]:
    return [(L, d["gate"]) for L, d in sorted(depths.items(), key=lambda kv: int(kv[0])) if d.get("gate")]


def all_on_gpu(depths: dict) -> bool:
    """True when every measured depth's source lay wholly on CUDA devices (no layer kept on the host or disk)."""
    gates = _gates(depths)
    return bool(gates) and all(g.get("source_bytes") and all(k.startswith("cuda") for k in g["source_bytes"])
                               for _, g in gates)


def gptq_swept(depths: dict) -> dict[str, tuple[int, int]]:
    """{depth: (experts GPTQ swept, experts in all)} from the fallback notes of the depth's GPTQ arms (the first
    arm's, the arms of one depth sharing one calibration set); a depth without a note is left out."""
    out = {}
    for L, g in _gates(depths):
        for line in g.get("table") or []:
            if m := _FALLBACK.search(line):
                fell, total = int(m[1]), int(m[2])
                out[L] = (total - fell, total)
                break
    return out


def _layers(L: str) -> str:
    return f"{L} layer{'' if L == '1' else 's'}"


def _points(fit: dict) -> str:
    return "; ".join(f"{_layers(L)} {v:.3g} s" for L, v in fit["points"].items())


def gptq_text(ex: dict, depths: dict, card_bytes, fitted, gb) -> str:
    """The GPTQ line under a fit's table: sweeps and calibration forwards fitted to full depth, each with its own
    points; the depths' placement (all on the GPU, and whether the GPU-peak fit passes the card at full depth); the
    share of experts GPTQ swept at the quick settings, when the receipt's tables record the fallback."""
    f, n = ex["fits"], ex["full_layers"]
    text = (f"GPTQ at the README's defaults (every draw of both targets), each depth scaled by `lab.realscale_predict` "
            f"and fitted to {n} layers: column sweeps {fitted(f, 'gptq_sweep_default_s')} (points by depth: "
            f"{_points(f['gptq_sweep_default_s'])}), calibration forwards {fitted(f, 'gptq_forward_default_s')}"
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
    swept = gptq_swept(depths)
    if swept:
        text += (" At the quick settings GPTQ swept " + ", ".join(
            f"{s} of {t} experts ({100 * s / t:.0f} %) at {_layers(L)}" for L, (s, t) in swept.items())
                 + "; the rest fell back to round-to-nearest (fewer calibration rows than `min_rows`), so the "
                   "sweeps' times hold for that share under the synthetic checkpoint's routing.")
    return text
