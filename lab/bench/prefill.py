"""Scoring forwards: bf16 against int4 through the decode kernels and through the prefill path.

    python -m lab.bench.prefill --out data/receipts/prefill_h100.json --sweep 16,64,256,1024,4096   # a GPU
    python -m lab.bench.prefill --arch mixtral --width tiny --layers 1 --batches 1x8 --out p.json  # CPU

The model is a synthetic checkpoint's, built in memory (lab.synth: the published configuration cut to
--layers decoder layers, random normal(0, initializer_range) weights, bf16), and a quantised copy of it beside
it, so all three paths are timed in one process, paired. Per batch shape B x T of random token ids,
`model(ids).logits` (CUDA events) for:
  bf16     the model as built (transformers' default experts implementation: grouped_mm where available);
  decode   the copy after quantize_model(m, "rtn", --targets, --act), every int4 module on the decode kernels
           (`prefill_rows(model, never)`), as scoring runs by default;
  prefill  the same int4 copy with every int4 module on the prefill path (`prefill_rows(model, 0)`).
Paired rounds: after --warmup untimed calls of each path, --rounds rounds each time --repeats calls of every
path, the paths' order rotated per round (bf16 decode prefill, decode prefill bf16, ...), so drift over the
run (clocks, temperature, neighbours) reaches every path alike. Each path keeps its per-round medians
(`round_medians_s`: drift shows as a trend along them); tokens/s = B * T / the median of its round medians;
prefill/bf16 and decode/bf16 (the target: prefill >= 0.8) are the median of the per-round ratios, each
round's ratio listed (`*_over_bf16_rounds`) with its min and max.
`default_takes_prefill` says whether the default threshold (PREFILL_MIN_ROWS rows per decoded weight:
B * T for a dense layer, B * T * k / E for an expert) sends the batch down the prefill path.

Logits: max_rel = max|a - b| / max|b| and mean_rel = mean|a - b| / mean|b| over the batch's logits, for
prefill against decode (what the prefill path's bf16 operands change), and each int4 path against bf16
(the quantisation itself), for scale.

--sweep R1,R2,..: one Int4Linear (layer 0's first quantised attention projection, if any) and layer 0's
Int4Experts (uniform random top-k routing) timed per call on R rows through both paths, in the same paired
rounds. `threshold` reads the crossover: per module the fewest rows from which the prefill path is faster at
every larger swept row count, in PREFILL_MIN_ROWS's unit (rows per decoded weight: R for a dense layer,
R * k / E for experts), and the larger of the two as the suggested PREFILL_MIN_ROWS (the default is not
changed here).

Bytes the prefill path adds per forward over bf16 weights: every int4 weight's decode reads 0.5625 bytes
and writes 2 (`extra_bytes_per_forward`, all experts routed), predicted time at the card's bandwidth.
On a CPU every int4 module runs its kernels in Triton's interpreter (`kernels_on_cpu`): a test of the
pipeline, not a measurement.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from int4lab.archs import arch_of
from lab.synth import ARCHS, WIDTHS, _init_, _reset_buffers, synth_config

TARGETS = ("experts", "experts+attn")
NEVER = 2 ** 62                         # prefill_rows(model, NEVER): the decode kernels at every row count
def build_model(arch: str, layers: int, width: str, device: str, seed: int = 0):
    """The synthetic checkpoint's model in memory (lab.synth's initialisation), bf16, eval mode."""
    from transformers import AutoModelForCausalLM
    cfg = synth_config(arch, layers, width)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model = model.to_empty(device=device)
    _init_(model, cfg.initializer_range)
    _reset_buffers(model)
    return model.eval()


def _sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


def time_calls(fn, dev, warmup: int, repeats: int):
    """(median seconds, [seconds of each repeat], the last result) of fn() after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    _sync(dev)
    times, out = [], None
    for _ in range(repeats):
        if torch.device(dev).type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def paired_rounds(fns: dict, dev, warmup: int, rounds: int, repeats: int) -> tuple[dict, dict]:
    """Time every fn of {name: fn} in alternating rounds (module doc): ({name: [median seconds per round]},
    {name: the last result})."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    med, last = {n: [] for n in names}, {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            m, _, last[name] = time_calls(fns[name], dev, 0, repeats)
            med[name].append(m)
    return med, last


def ratio_summary(num: list, den: list) -> dict:
    """Per-round speed ratios den / num (num, den: seconds per round) with their median, min and max."""
    rs = [d / n for n, d in zip(num, den)]
    return {"median": statistics.median(rs), "min": min(rs), "max": max(rs), "rounds": rs}


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    """max|a - b| / max|b| and mean|a - b| / mean|b| (float32)."""
    d, bb = (a.float() - b.float()).abs(), b.float().abs()
    return {"max_rel": float(d.max() / bb.max()), "mean_rel": float(d.mean() / bb.mean())}


def int4_modules(model):
    from int4lab.quantize import Int4Experts, Int4Linear
    lin = [m for m in model.modules() if isinstance(m, Int4Linear)]
    ex = [m for m in model.modules() if isinstance(m, Int4Experts)]
    return lin, ex


def extra_bytes(model) -> int:
    """Bytes the prefill path's weight decode moves per forward: 0.5625 read + 2 written per int4 weight."""
    lin, ex = int4_modules(model)
    n = sum(m.in_features * m.out_features for m in lin)
    n += sum(m.num_experts * 3 * m.hidden_dim * m.intermediate_dim for m in ex)
    return int(n * (0.5625 + 2))


def bandwidth(dev) -> float | None:
    """Bytes/s of the card's memory (clock x bus width x 2, double data rate), None off CUDA."""
    if torch.device(dev).type != "cuda":
        return None
    p = torch.cuda.get_device_properties(dev)
    clock, bus = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    return clock * 1e3 * bus / 8 * 2 if clock and bus else None


def sweep(model, rows, dev, warmup, repeats, rounds: int = 1) -> list:
    """Per-call seconds of one Int4Linear and layer 0's Int4Experts on R rows, decode vs prefill, paired rounds."""
    from int4lab.quantize.prefill import prefill_rows
    lin, ex = int4_modules(model)
    out = []
    for name, mod in (("attn", lin[0] if lin else None), ("experts", ex[0] if ex else None)):
        if mod is None:
            continue
        K = mod.in_features if name == "attn" else mod.hidden_dim
        for R in rows:
            x = torch.randn(R, K, device=dev).bfloat16()
            if name == "attn":
                args = (x,)
            else:
                k = model.config.num_experts_per_tok
                ids = torch.rand(R, mod.num_experts, device=dev).topk(k, -1).indices
                args = (x, ids, torch.softmax(torch.randn(R, k, device=dev), -1))
            def call(n, mod=mod, args=args):
                with prefill_rows(mod, n), torch.inference_mode():
                    return mod(*args)
            med, _ = paired_rounds({"decode": lambda: call(NEVER), "prefill": lambda: call(0)}, dev, warmup,
                                   rounds, repeats)
            row = {"module": name, "rows": R, "decode_s": statistics.median(med["decode"]),
                   "prefill_s": statistics.median(med["prefill"]), "decode_round_medians_s": med["decode"],
                   "prefill_round_medians_s": med["prefill"]}
            r = ratio_summary(med["prefill"], med["decode"])
            row["prefill_over_decode_speed"], row["prefill_over_decode_rounds"] = r["median"], r["rounds"]
            out.append(row)
    return out


def threshold(rows: list, experts: int, top_k: int) -> dict:
    """The sweep's crossover per module in rows per decoded weight (module doc), and the suggestion."""
    out = {}
    for name in ("attn", "experts"):
        rs = sorted((r["rows"], r["prefill_over_decode_speed"]) for r in rows if r["module"] == name)
        if not rs:
            continue
        cross = None
        for i, (R, _) in enumerate(rs):
            if all(v > 1 for _, v in rs[i:]):
                cross = R
                break
        per_weight = None if cross is None else (cross if name == "attn" else cross * top_k / experts)
        out[name] = {"crossover_rows": cross, "rows_per_weight": per_weight}
    ws = [v["rows_per_weight"] for v in out.values()]
    out["suggested_prefill_min_rows"] = max(ws) if ws and None not in ws else None
    out["rule"] = ("fewest swept rows from which prefill is faster at every larger swept count; experts in rows "
                   "x top_k / experts; suggestion: the larger (None: a module never crosses in the sweep)")
    return out


def run(arch="olmoe", layers=4, width="real", act="int8", targets="experts+attn", batches=((16, 256), (4, 1024)),
        warmup=2, repeats=5, sweep_rows=(), seed=0, device=None, log=print, rounds=4) -> dict:
    """The receipt's payload (module doc)."""
    import contextlib
    import copy

    from int4lab.quantize import kernels_on_cpu, quantize_model
    from int4lab.quantize.prefill import PREFILL_MIN_ROWS, prefill_rows
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(arch, layers, width, dev, seed)
    cfg = model.config
    sizes = arch_of(cfg).sizes(cfg)                  # the config keys, as the architecture's record names them
    E, k = sizes["experts"], sizes["top_k"]
    g = torch.Generator().manual_seed(seed)
    ids = {f"{B}x{T}": torch.randint(0, cfg.vocab_size, (B, T), generator=g).to(dev) for B, T in batches}
    rows = {key: {"batch": key, "tokens": x.numel(), "default_takes_prefill": {
        "attn": PREFILL_MIN_ROWS is not None and x.numel() >= PREFILL_MIN_ROWS,
        "experts": PREFILL_MIN_ROWS is not None and x.numel() * k >= PREFILL_MIN_ROWS * E}}
        for key, x in ids.items()}
    t0 = time.time()
    qmodel, _ = quantize_model(copy.deepcopy(model), "rtn", targets, act, progress=False)
    quant_s = time.time() - t0
    cpu = torch.device(dev).type == "cpu"

    def forward(m, n, x):
        with (kernels_on_cpu(m) if cpu and n is not None else contextlib.nullcontext()), \
                (prefill_rows(m, n) if n is not None else contextlib.nullcontext()), torch.inference_mode():
            return m(input_ids=x).logits

    for key, x in ids.items():
        fns = {"bf16": lambda: forward(model, None, x), "decode": lambda: forward(qmodel, NEVER, x),
               "prefill": lambda: forward(qmodel, 0, x)}
        if torch.device(dev).type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        med, last = paired_rounds(fns, dev, warmup, rounds, repeats)
        r = rows[key]
        for name in fns:
            m = statistics.median(med[name])
            r[name] = {"median_s": m, "round_medians_s": med[name], "tokens_per_s": x.numel() / m}
            log(f"{name:8s} {key:>8s}: {x.numel() / m:12.0f} tokens/s ({m * 1e3:.2f} ms; rounds "
                + " ".join(f"{v * 1e3:.2f}" for v in med[name]) + ")")
        if torch.device(dev).type == "cuda":
            r["peak_gib_all_paths"] = torch.cuda.max_memory_allocated(dev) / 2 ** 30
        for path in ("decode", "prefill"):
            rs = ratio_summary(med[path], med["bf16"])
            r[f"{path}_over_bf16"] = rs["median"]
            r[f"{path}_over_bf16_rounds"] = {k2: rs[k2] for k2 in ("rounds", "min", "max")}
        r["logits"] = {"prefill_vs_decode": rel_diff(last["prefill"], last["decode"]),
                       "decode_vs_bf16": rel_diff(last["decode"], last["bf16"]),
                       "prefill_vs_bf16": rel_diff(last["prefill"], last["bf16"])}
    del model
    with (kernels_on_cpu(qmodel) if cpu else contextlib.nullcontext()):
        sw = sweep(qmodel, sweep_rows, dev, warmup, repeats, rounds) if sweep_rows else []
    xb, bw = extra_bytes(qmodel), bandwidth(dev)
    return {
        "kind": "prefill_bench",
        "settings": {"arch": arch, "layers": layers, "width": width, "act": act, "targets": targets,
                     "batches": list(ids), "warmup": warmup, "repeats": repeats, "rounds": rounds,
                     "pairing": "bf16, decode and prefill in alternating rounds in one process, order rotated",
                     "seed": seed, "device": dev,
                     "prefill_min_rows": PREFILL_MIN_ROWS, "experts": E, "top_k": k,
                     "experts_implementation": getattr(cfg, "_experts_implementation", None),
                     "attn_implementation": getattr(cfg, "_attn_implementation", None),
                     "grouped_mm": hasattr(torch, "_grouped_mm")},
        "quantize_s": quant_s,
        "rows": list(rows.values()),
        "target": {"prefill_over_bf16_min": 0.8,
                   "met": all(r["prefill_over_bf16"] >= 0.8 for r in rows.values())},
        "extra_bytes_per_forward": xb,
        "extra_bytes_formula": "int4 weights x (0.5625 read + 2 written) bytes, every expert routed",
        "memory_bytes_per_s": bw,
        "extra_s_predicted": xb / bw if bw else None,
        "sweep": sw,
        "threshold": threshold(sw, E, k) if sw else None,
    }


def _batches(s: str):
    out = []
    for part in s.split(","):
        b, _, t = part.partition("x")
        if not (b.isdigit() and t.isdigit() and int(b) > 0 and int(t) > 0):
            raise argparse.ArgumentTypeError(f"batches must be BxT[,BxT...] with positive ints, got {s!r}")
        out.append((int(b), int(t)))
    return out


def _rows(s: str):
    if not s:
        return []
    if not all(p.isdigit() and int(p) > 0 for p in s.split(",")):
        raise argparse.ArgumentTypeError(f"sweep must be positive ints R1,R2,..., got {s!r}")
    return [int(p) for p in s.split(",")]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.prefill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=ARCHS, default="olmoe")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the synthetic model")
    ap.add_argument("--width", choices=WIDTHS, default="real")
    ap.add_argument("--act", choices=("int8", "bf16"), default="int8", help="W4A8 (int8) or W4A16 (bf16)")
    ap.add_argument("--targets", choices=TARGETS, default="experts+attn")
    ap.add_argument("--batches", type=_batches, default=_batches("16x256,4x1024"), help="B x T shapes, e.g. 16x256")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="timed forwards per path, shape and round (median)")
    ap.add_argument("--rounds", type=int, default=4, help="paired rounds of every path (order rotated per round)")
    ap.add_argument("--sweep", type=_rows, default=[], help="row counts for the per-module crossover, e.g. 16,64,256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default: cuda when available")
    ap.add_argument("--out", required=True, help="receipt path (JSON)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from int4lab.files import check_out_path
    from int4lab.gate.settings import check_device
    from lab.synth import FULL_LAYERS
    try:                                                # everything refusable, before any model is built
        if args.warmup < 0 or args.repeats < 1 or args.rounds < 1:
            raise ValueError("--warmup must be >= 0, --repeats >= 1 and --rounds >= 1")
        if not 1 <= args.layers <= FULL_LAYERS[args.arch]:
            raise ValueError(f"--layers must be an int in [1, {FULL_LAYERS[args.arch]}] for {args.arch} (its "
                             f"published depth), got {args.layers}")
        if args.device is not None:
            check_device(args.device)
        check_out_path(args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from int4lab.files import cli_out_ok
    from lab.provenance import portable_command, write_receipt
    if not cli_out_ok(args.out):                          # before anything is measured
        return 2
    payload = run(args.arch, args.layers, args.width, args.act, args.targets, args.batches, args.warmup,
                  args.repeats, args.sweep, args.seed, args.device, rounds=args.rounds)
    command = "python -m lab.bench.prefill " + " ".join(argv if argv is not None else sys.argv[1:])
    write_receipt(args.out, payload, command=portable_command(command))
    for r in payload["rows"]:
        lo, hi = r["prefill_over_bf16_rounds"]["min"], r["prefill_over_bf16_rounds"]["max"]
        print(f"{r['batch']}: prefill/bf16 {r['prefill_over_bf16']:.3f} (rounds {lo:.3f}..{hi:.3f}), decode/bf16 "
              f"{r['decode_over_bf16']:.3f}, logits prefill vs decode max_rel "
              f"{r['logits']['prefill_vs_decode']['max_rel']:.3g}")
    if payload["threshold"]:
        print(f"threshold: {payload['threshold']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
