"""llama.cpp's CUDA backend (ggml) as a peer, timed by its own `test-backend-ops perf` and merged into the bench
receipt.

    python -m lab.bench.ggml_peer cases > cases.txt          # the bench's shapes as test-backend-ops cases
    python -m lab.bench.ggml_peer merge --receipt decode_h100.json --ggml ggml_h100.txt \
        [--rotated ggml_rotated_h100.txt] --source "<repo> <commit>"

ggml's source is not part of this repository; it is built outside it with its perf case list read from
`cases.txt` (one case a line: `mm TYPE m k`, or `mmid TYPE n_mats n_used m k`; one token, ggml's m = our N,
k = K). Its timer differs from the bench's: an eager stream running the op back to back over the SAME weights,
so a shape whose weights fit in L2 (tens of MB) may be read partly from cache; activations are f32 in and out.
Rows say so (`timer`), and the report marks them. `--rotated` adds a second timing of the same cases by a small
harness over the built ggml library that times like the bench (weight copies rotated past 4x L2, ggml's CUDA
graphs, median of 20 samples of >= 16 ops (one op per weight copy per graph call, ceil(16 / copies) calls),
host wall clock per sample): impls `llamacpp_<type>_rot[_moe]`. That is the harness this merge expects, not a
record of the run: each file's `timer` is a fixed string of TIMERS, not read from the file, and the merge records
no date, device or command of the ggml runs (the receipt's provenance is the bench's own).

A MoE row is a sum of one token's routed expert matmuls (MUL_MAT_ID), `parts_us`: `gate_up` is twice the one
timed [I, H] op (llama.cpp keeps gate and up as separate expert tensors of that shape, so one timing is counted
twice; `cases` asks for it once) and `down` the timed [H, I] op. The SwiGLU and the weighted combine (small
elementwise launches) are not counted. At one token ggml's CUDA backend can fuse gate, up and the SwiGLU into one
MMVQ launch with one activation quantisation (`mul_mat_id_glu_ops` in ggml-cuda.cu), which this sum of separately
timed ops does not credit; the combine it leaves out, and an eager timer's L2 reuse, push the other way. Neither was
measured, so the sum may lie above or below llama.cpp's real layer: a lead over it is no bound. A MoE row records no
p10/p90; a GEMV row keeps the rotating harness's where its line prints them.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .shapes import MODELS, all_shapes, by_priority

TYPES = ("q4_0", "q4_K")
# bytes per block, weights per block (ggml's block_q4_0: fp16 scale + 16 B of nibbles; block_q4_K: 144 B / 256)
BLOCK = {"q4_0": (18, 32), "q4_K": (144, 256)}
# the timer label each merged row and file gets, by which option its file came in (--ggml or --rotated): fixed
# descriptions of the timer the merge expects, not read from the ggml output
TIMERS = {"": "ggml test-backend-ops perf: eager stream, the same weights re-read (no rotation; L2 may hold small "
              "shapes)",
          "_rot": "harness over ggml: weight copies rotated past 4x L2, ggml CUDA graphs, median of 20 samples of "
                  ">= 16 calls (host wall clock)"}
_LINE = re.compile(r"^\s*(MUL_MAT(?:_ID)?)\((.*)\):\s+(?:(\d+) runs -\s+([\d.]+) us/run|(.*not supported.*))")
_SPREAD = re.compile(r"us/run - p10 ([\d.]+) p90 ([\d.]+)")     # the rotating harness's sample spread
_VAR = re.compile(r"(\w+)=(\[[^\]]*\]|[^,]*)")
# gate and up are two launches of one timed [I, H] MUL_MAT_ID: a MoE row's parts_us["gate_up"] is this many times it
GATE_UP_LAUNCHES = 2


def weight_bytes(ggml_type: str, N: int, K: int) -> int:
    """Bytes of an [N, K] ggml weight of `ggml_type` (K must fill whole blocks)."""
    if ggml_type not in BLOCK:
        raise ValueError(f"ggml_type must be one of {TYPES}, got {ggml_type!r}")
    nb, nw = BLOCK[ggml_type]
    if K % nw:
        raise ValueError(f"K must be a multiple of {nw} for {ggml_type}, got {K}")
    return N * (K // nw) * nb


def cases(types=TYPES) -> list[str]:
    """test-backend-ops case lines, each type's in turn (a run cut short keeps the first type whole): every bench
    GEMV shape (distinct N x K, target shapes first), then each model's one-token routed projections, gate or up
    [I, H] (llama.cpp's expert tensors keep them apart: two launches) and down [H, I]."""
    out = []
    for t in types:
        seen = []
        for s in by_priority(all_shapes()):
            if (s.N, s.K) not in seen and s.K % BLOCK[t][1] == 0:
                seen.append((s.N, s.K))
                out.append(f"mm {t} {s.N} {s.K}")
        for m in MODELS.values():
            H, I = m.hidden, m.intermediate
            out += [f"mmid {t} {m.n_experts} {m.top_k} {n} {k}" for n, k in ((I, H), (H, I)) if k % BLOCK[t][1] == 0]
    return out


def parse(text: str) -> tuple[list[dict], list[dict]]:
    """(timings, unsupported) from test-backend-ops perf output. A timing: op, type, N (= m), K (= k), n,
    n_mats / n_used (MUL_MAT_ID), runs, us, and p10_us / p90_us where the line gives them (the rotating harness).
    Lines of other ops or other activation types are ignored."""
    timed, unsupported = [], []
    for line in text.splitlines():
        hit = _LINE.search(line)
        if not hit:
            continue
        v = dict(_VAR.findall(hit[2]))
        if v.get("type_b", "f32") != "f32" or "type_a" not in v:
            continue
        entry = {"op": hit[1], "type": v["type_a"], "N": int(v["m"]), "K": int(v["k"]), "n": int(v["n"])}
        if "copies" in v:
            entry["copies"] = int(v["copies"])
        if hit[1] == "MUL_MAT_ID":
            entry.update(n_mats=int(v["n_mats"]), n_used=int(v["n_used"]))
        if hit[5]:
            unsupported.append({**entry, "reason": hit[5].strip()})
        else:
            timed.append({**entry, "runs": int(hit[3]), "us": float(hit[4])})
            spread = _SPREAD.search(line)
            if spread:
                timed[-1].update(p10_us=float(spread[1]), p90_us=float(spread[2]))
    return timed, unsupported


def _find(timed, **key) -> float | None:
    hit = _best(timed, **key)
    return None if hit is None else hit["us"]


def _best(timed, **key) -> dict | None:
    """The fastest timing matching `key` (a case timed twice keeps its better run), or None."""
    hits = [t for t in timed if all(t.get(k) == v for k, v in key.items())]
    return min(hits, key=lambda t: t["us"]) if hits else None


def _floor_of(rec, **where) -> dict:
    """floor_us / floor_bytes of the bench's rows at the same shape or MoE layer (the int4-b32 read floor)."""
    for r in rec["rows"]:
        if "floor_us" in r and all(r.get(k) == v for k, v in where.items()):
            return {"floor_us": r["floor_us"], "floor_bytes": r["floor_bytes"]}
    return {}


def rows(timed, rec, source: str, way: str = "") -> list[dict]:
    """Receipt rows for the timings: one per (bench GEMV shape, type) and per (model, type) one-token MoE layer;
    `way` "" (test-backend-ops) or "_rot" (the rotating harness) names the timer."""
    if way not in TIMERS:
        raise ValueError(f"way must be one of {tuple(TIMERS)}, got {way!r}")
    out = []
    base = {"timer": TIMERS[way], "source": source}
    shapes = []
    for r in rec["rows"]:
        if r["layer"] != "moe" and (r["model"], r["layer"], r["N"], r["K"]) not in shapes:
            shapes.append((r["model"], r["layer"], r["N"], r["K"]))
    for t in TYPES:
        for model, layer, N, K in shapes:
            hit = _best(timed, op="MUL_MAT", type=t, N=N, K=K, n=1)
            if hit is None:
                continue
            us = hit["us"]
            nbytes = weight_bytes(t, N, K) + 4 * (N + K)           # f32 activation in, f32 out
            spread = {k: hit[k] for k in ("p10_us", "p90_us") if k in hit}
            out.append({"model": model, "layer": layer, "N": N, "K": K, "E": 1, "topk": 1, "rows": 1,
                        "impl": f"llamacpp_{t}{way}", "us": us, "GBps": nbytes / (us * 1e3), "bytes": nbytes,
                        **spread, **_floor_of(rec, model=model, layer=layer, N=N, K=K), **base})
        for name, m in MODELS.items():
            H, I, E, A = m.hidden, m.intermediate, m.n_experts, m.top_k
            key = {"op": "MUL_MAT_ID", "type": t, "n": 1, "n_mats": E, "n_used": A}
            one, down = (_find(timed, N=n, K=k, **key) for n, k in ((I, H), (H, I)))
            if one is None or down is None:
                continue
            gate_up = GATE_UP_LAUNCHES * one                    # gate and up: the one timed [I, H] op, twice
            us = gate_up + down
            nbytes = A * (weight_bytes(t, 2 * I, H) + weight_bytes(t, H, I)) + 4 * 2 * H
            out.append({"model": name, "layer": "moe", "N": I, "K": H, "E": E, "topk": A, "rows": 1,
                        "impl": f"llamacpp_{t}{way}_moe", "us": us, "GBps": nbytes / (us * 1e3), "bytes": nbytes,
                        "n_active": A, "parts_us": {"gate_up": gate_up, "down": down},
                        **_floor_of(rec, model=name, layer="moe", rows=1), **base})
    return out


def merge(receipt: Path, ggml_out: Path, source: str, rotated: Path | None = None) -> dict:
    """Replace the receipt's llama.cpp rows with those parsed from `ggml_out` (test-backend-ops) and `rotated`
    (the harness, optional); record the source, timers (TIMERS' fixed labels) and unsupported cases under
    "llamacpp". Written atomically; the receipt's provenance is kept as it was, and nothing records when or on
    which device the ggml output was made."""
    from int4lab.files import write_text_atomic
    from lab.bench.schema import LLAMACPP_IMPLS, validate_receipt
    rec = json.loads(Path(receipt).read_text())
    rec["rows"] = [r for r in rec["rows"] if r["impl"] not in LLAMACPP_IMPLS]
    rec["llamacpp"] = {"source": source, "files": {}}
    for way, path in (("", ggml_out), ("_rot", rotated)):
        if path is None:
            continue
        timed, unsupported = parse(Path(path).read_text())
        rec["rows"] += rows(timed, rec, Path(path).name, way)
        rec["llamacpp"]["files"][Path(path).name] = {"timer": TIMERS[way], "timed": len(timed),
                                                     "unsupported": unsupported}
    validate_receipt(rec)
    write_text_atomic(receipt, json.dumps(rec, indent=1) + "\n")
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.ggml_peer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cases", help="print the test-backend-ops case lines of the bench's shapes")
    mg = sub.add_parser("merge", help="merge test-backend-ops perf output into a decode receipt")
    mg.add_argument("--receipt", type=Path, required=True)
    mg.add_argument("--ggml", type=Path, required=True, help="test-backend-ops perf output")
    mg.add_argument("--rotated", type=Path, help="the rotating harness's output (optional)")
    mg.add_argument("--source", required=True, help="the ggml source measured: repository and commit")
    args = ap.parse_args(argv)
    if args.cmd == "cases":
        print("\n".join(cases()))
        return 0
    for p in (args.receipt, args.ggml) + ((args.rotated,) if args.rotated else ()):
        if not p.is_file():
            print(f"error: {p} is not a file", file=sys.stderr)
            return 2
    rec = merge(args.receipt, args.ggml, args.source, args.rotated)
    n = sum(r["impl"].startswith("llamacpp") for r in rec["rows"])
    bad = sum(len(f["unsupported"]) for f in rec["llamacpp"]["files"].values())
    print(f"merged {n} llama.cpp rows into {args.receipt} ({bad} unsupported cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
