"""`python -m lab.decode_step.generate`: the tokens/s a user gets from transformers' `generate`, int4 against bf16.

    python -m lab.decode_step.generate --out runs/generate_h100.json                        # a GPU, three models
    python -m lab.decode_step.generate --width tiny --archs mixtral --prompt 4 --new 3 --rounds 3   # a CPU

Per architecture (model.build: the published configuration at --width, random weights, the deepest of --layers
decoder layers; a shallower depth runs inside model.depth), batch 1, a seeded random prompt of P tokens:
  states   bf16 (as built: transformers' default experts implementation); int4 (a deep copy through
           quantize_model(model, "rtn", "experts+attn")); int4_fused (a copy of int4 through fuse_decode(model))
  modes    eager: generate(cache_implementation="static", disable_compile=True); compiled: the same with
           compile_config=CompileConfig(), as transformers 5 documents it (with a compilable cache `generate`
           compiles the forward of the decode steps: inductor, "reduce-overhead", i.e. CUDA graphs; the prefill
           runs uncompiled). CUDA only (a CPU records it skipped: inductor through Triton's interpreter would take
           hours). Each call's new StaticCache moves the cache tensors, so CUDA graphs re-record in its first decode
           step (counted in t(N)); --cache reused passes one StaticCache per state and depth, reset before each call.
  one call generate(prompt [1, P], greedy, min_new_tokens = max_new_tokens = n) between torch.cuda.synchronize()s,
           host wall time. Decode time per token = (t(N) - t(1)) / (N - 1) (t(1) is the prefill and generate's
           set-up, which cancel); tokens/s = 1 / that; per layer = the decode time's slope between the extreme depths.
  rounds   untimed warm-ups (the compile happens there), then R rounds timing every state back to back (each depth,
           t(1) then t(N)), the order rotating by round: per state and depth the median, min and max; per round int4
           tokens/s / bf16 tokens/s (int4_fused's too), its median's 95 % interval (lab.bench.decide.median_ci) and
           "int4 faster" / "slower" only when that interval lies wholly above / below 1, else "undecided".
  greedy   each state's new tokens at the deepest depth, eager against compiled (and whether all rounds agreed).
A state or mode that raises is an error row; what the budget (--budget-s, shared evenly by the architectures)
cannot fit is skipped and recorded. On a CPU the int4 Triton kernels run in the interpreter.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import signal
import sys
import time
import traceback
from pathlib import Path

import int4lab  # noqa: F401  (first: on a CPU it turns on Triton's interpreter before triton is imported)
import torch

from lab.bench.decide import ROUNDS_MIN, median_ci
from lab.paths import RUNS
from lab.synth import ARCHS, FULL_LAYERS, WIDTHS, config_fields

from . import model as M
from .bench import _free
from .step import _sync

STATES = ("bf16", "int4", "int4_fused")
MODES = ("eager", "compiled")
ORDER = ("olmoe", "qwen3_moe", "mixtral")


def check(args) -> None:
    """ValueError naming the flag and its rule, before any model is built."""
    if not args.layers or min(args.layers) < 1:
        raise ValueError(f"--layers must be depths >= 1, got {args.layers}")
    for flag, low in {"new": 2, "prompt": 1, "rounds": 3, "warmup": 1}.items():
        v = getattr(args, flag)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"--{flag} must be an int >= {low}, got {v!r}")
    for flag, v, rule in (("budget-s", args.budget_s, "> 0"), ("compile-reserve-s", args.compile_reserve_s, ">= 0")):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if rule == "> 0" else v >= 0)):
            raise ValueError(f"--{flag} must be a finite number of seconds {rule}, got {v!r}")
    for flag, known in (("archs", ARCHS), ("states", STATES), ("modes", MODES)):
        if not getattr(args, flag) or set(getattr(args, flag)) - set(known):
            raise ValueError(f"--{flag} must be a non-empty subset of {list(known)}, got {getattr(args, flag)}")
    deep = [a for a in args.archs if max(args.layers) > FULL_LAYERS[a]]
    if deep:
        raise ValueError(f"--layers must not exceed {deep[0]}'s published depth {FULL_LAYERS[deep[0]]}, "
                         f"got {args.layers}")
    if "bf16" not in args.states:
        raise ValueError("--states must include bf16 (every ratio is against it)")


def call(model, ids: torch.Tensor, n: int, mode: str, cache=None, kernels: bool = False) -> tuple[float, list]:
    """One greedy generate call of exactly n new tokens after ids [1, P]: (host seconds, the n new token ids).
    cache: None (generate builds a StaticCache) or a StaticCache, reset here. kernels: int4 modules send CPU
    tensors through Triton (the interpreter on a CPU)."""
    from transformers import CompileConfig

    from int4lab.quantize.modules import kernels_on_cpu
    gc_ = model.generation_config
    kw = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False, "attention_mask": torch.ones_like(ids),
          "pad_token_id": gc_.pad_token_id if gc_.pad_token_id is not None else gc_.eos_token_id}
    kw.update({"cache_implementation": "static"} if cache is None else {"past_key_values": cache})
    kw.update({"disable_compile": True} if mode == "eager" else {"compile_config": CompileConfig()})
    with kernels_on_cpu(model, True) if kernels else contextlib.nullcontext(), torch.no_grad():
        if cache is not None:
            cache.reset()
        _sync(ids.device)
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        _sync(ids.device)
        dt = time.perf_counter() - t0
    new = out[0, ids.shape[1]:].tolist()
    if len(new) != n:
        raise RuntimeError(f"generate returned {len(new)} new tokens, asked for exactly {n}")
    return dt, new


def decode_s(t1: float, tn: float, n: int) -> float:
    """Seconds per decoded token: (t(n) - t(1)) / (n - 1)."""
    return (tn - t1) / (n - 1)


def verdict(lo: float | None, hi: float | None, name: str = "int4") -> str:
    """'<name> faster' when [lo, hi] (an interval of tokens/s ratios) lies wholly above 1, '<name> slower' wholly
    below, else 'undecided' (also without an interval)."""
    if lo is None or hi is None:
        return "undecided"
    if not lo <= hi:
        raise ValueError(f"need lo <= hi, got [{lo}, {hi}]")
    return f"{name} faster" if lo > 1 else f"{name} slower" if hi < 1 else "undecided"


def ratio_summary(ratios: list, name: str = "int4") -> dict:
    """Per-round ratios -> median, its 95 % interval (None below ROUNDS_MIN rounds) and the verdict it carries."""
    rs = [float(r) for r in ratios]
    out = {"per_round": rs, "median": (_spread(rs) or {}).get("median"), "lo": None, "hi": None}
    if len(rs) >= ROUNDS_MIN:
        out["median"], out["lo"], out["hi"] = median_ci(rs)
    else:
        out["note"] = f"{len(rs)} rounds give no 95 % interval for the median (need {ROUNDS_MIN})"
    out["verdict"] = verdict(out["lo"], out["hi"], name)
    return out


def _spread(xs: list, scale: float = 1.0) -> dict:
    """{median, min, max} of xs times scale (None for no values)."""
    s = sorted(x * scale for x in xs)
    return {"median": (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2, "min": s[0], "max": s[-1]} if s else None


def summarise_state(samples: dict, n: int) -> dict:
    """samples {depth: [(t1, tN) per round]} -> per depth the decode ms and tokens/s of every round (None where
    t(N) <= t(1)) and their median, min, max; per layer (the extreme depths' slope) in ms, per round and spread."""
    out, dec = {"depths": {}}, {d: [decode_s(t1, tn, n) for t1, tn in pairs] for d, pairs in samples.items()}
    for d, pairs in samples.items():
        tps = [1 / x if x > 0 else None for x in dec[d]]
        out["depths"][str(d)] = {"t1_s": [p[0] for p in pairs], "tN_s": [p[1] for p in pairs], "tokens_per_s": tps,
                                 "decode_ms": [x * 1e3 for x in dec[d]], "decode_ms_spread": _spread(dec[d], 1e3),
                                 "tokens_per_s_spread": _spread([x for x in tps if x is not None])}
    if len(dec) >= 2:
        lo, hi = min(dec), max(dec)
        pl = [(b - a) / (hi - lo) * 1e3 for a, b in zip(dec[lo], dec[hi])]
        out["per_layer_ms"] = {"per_round": pl, **(_spread(pl) or {}),
                               "formula": f"(decode({hi}) - decode({lo})) / {hi - lo}"}
    return out


def ratios(rows: dict, state: str) -> dict:
    """Per depth and per layer: `state` tokens/s over bf16's, round by round (rows from summarise_state)."""
    a, b, out = rows[state], rows["bf16"], {}
    for d in a["depths"]:
        xs = [x / y for x, y in zip(a["depths"][d]["tokens_per_s"], b["depths"][d]["tokens_per_s"])
              if x is not None and y is not None]
        out[d] = ratio_summary(xs, state)
    if "per_layer_ms" in a and "per_layer_ms" in b:
        pairs = list(zip(a["per_layer_ms"]["per_round"], b["per_layer_ms"]["per_round"]))
        out["per_layer"] = ratio_summary([y / x for x, y in pairs], state) if all(x > 0 and y > 0 for x, y in pairs) \
            else {"verdict": "undecided", "note": "a round's per-layer time was not positive"}
    return out


def _error(e: BaseException) -> dict:
    """An error row: the message and the traceback's last lines."""
    return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc().splitlines()[-20:]}


def run_mode(models: dict, mode: str, ids, args, left, log) -> dict:
    """Warm-up, then paired rounds of every state in `mode`; returns the mode's record (rows, ratios, greedy
    tokens, errors, skipped). left(): seconds of the budget left."""
    out = {"rows": {}, "errors": {}, "skipped": [], "tokens": {}, "stable": {}}
    depths, N = sorted(set(args.layers)), args.new
    kernels = ids.device.type == "cpu" and args.cpu_kernels
    caches: dict = {}

    def one(state):
        """Every depth of `state`: {depth: (t1, tN)} and the deepest depth's new tokens."""
        from transformers import StaticCache
        m, got, toks = models[state], {}, None
        for d in depths:
            with M.depth(m, d):
                if args.cache == "reused" and (state, d) not in caches:     # built at this depth's layer count
                    caches[state, d] = StaticCache(config=m.config, max_cache_len=ids.shape[1] + N)
                c = caches.get((state, d))
                t1, _ = call(m, ids, 1, mode, c, kernels and state != "bf16")
                tn, toks = call(m, ids, N, mode, c, kernels and state != "bf16")
            got[d] = (t1, tn)
        return got, toks

    if mode == "compiled":      # a compile per state and depth, all on the shared forward code objects
        torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    live, cost, out["warmup_s"] = [], {}, {}
    for state in models:            # a compiled state needs what the last compiled warm-up took, at least; the
        past = list(out["warmup_s"].values())           # first (bf16) room for two, as alone it gives no ratio
        need = max([args.compile_reserve_s, *past]) * (1 if past else 2) if mode == "compiled" else 0.0
        if left() < need:
            out["skipped"].append({"what": f"{mode} {state}", "why": f"budget: {left():.0f} s left, {need:.0f} needed"})
            continue
        t0 = time.time()
        try:
            for _ in range(args.warmup):
                got, toks = one(state)
            cost[state] = sum(t1 + tn for t1, tn in got.values())
            live.append(state)
            out["warmup_s"][state] = time.time() - t0
            log(f"  {mode} {state}: warm-up {out['warmup_s'][state]:.1f} s")
        except Exception as e:                        # an error row, and the other states go on
            out["errors"][state] = _error(e)
            log(f"  {mode} {state} FAILED: {out['errors'][state]['error'][:300]}")
        _free()
    fit = int(left() // max(1e-9, sum(cost.values())))
    rounds = min(args.rounds, fit)
    why = "bf16 and an int4 state must run" if "bf16" not in live or len(live) < 2 else \
        f"budget: {left():.0f} s left fits {fit} rounds" if rounds < 3 else None
    if why:
        out["skipped"].append({"what": f"{mode} rounds", "why": why})
        return out
    if rounds < args.rounds:
        out["skipped"].append({"what": f"{mode} rounds {rounds + 1}..{args.rounds}", "why": "budget"})
    from torch._dynamo.utils import counters                   # graphs compiled so far: a rise means recompiles
    graphs = int(counters["stats"].get("unique_graphs", 0))
    samples = {s: {d: [] for d in depths} for s in live}
    seqs = {s: [] for s in live}
    for r in range(rounds):
        order = live[r % len(live):] + live[:r % len(live)]
        for state in [s for s in order if s in live]:
            try:
                got, toks = one(state)
            except Exception as e:                    # an error row; its rounds so far are dropped
                out["errors"][state] = _error(e)
                live.remove(state)
                continue
            for d, pair in got.items():
                samples[state][d].append(pair)
            seqs[state].append(toks)
    out["rounds"] = rounds
    out["graphs_compiled_in_rounds"] = int(counters["stats"].get("unique_graphs", 0)) - graphs
    for state in [s for s in samples if s in live]:
        out["rows"][state] = summarise_state(samples[state], N)
        out["tokens"][state] = seqs[state][-1]
        out["stable"][state] = all(t == seqs[state][0] for t in seqs[state])
    if "bf16" in live:
        out["ratios"] = {f"{s}/bf16": ratios(out["rows"], s) for s in live if s != "bf16"}
    return out


def build_states(arch: str, args, dev: str) -> tuple[dict, dict]:
    """{state: model} at the deepest depth (the states of --states that could be formed), {state: error} else.
    int4_fused is `fuse_decode(model)` with its defaults (attention and add + norm fused too): the form the decode-step
    benchmark calls int4_fused2 (lab.report.generate shows it under that name)."""
    from int4lab.quantize import fuse_decode, quantize_model
    models, errors = {"bf16": M.build(arch, max(args.layers), args.width, dev, torch.bfloat16, seed=args.seed)}, {}
    steps = (("int4", "bf16", lambda m: quantize_model(m, "rtn", "experts+attn", progress=False)[0]),
             ("int4_fused", "int4", fuse_decode))
    for state, base, form in steps:
        if base in models and (state in args.states or state == "int4" and "int4_fused" in args.states):
            try:
                models[state] = form(copy.deepcopy(models[base]))
            except Exception as e:
                errors[state] = _error(e)
    return {s: models[s] for s in STATES if s in models and s in args.states}, errors


def run_arch(arch: str, args, deadline: float, log, save, rec: dict) -> dict:
    """One architecture's record, filled in place (save() rewrites the receipt after each mode)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rec.update({"arch": arch, "width": args.width, "depths": sorted(set(args.layers)), "full_layers": FULL_LAYERS[arch],
                "config": config_fields(arch, max(args.layers), args.width), "modes": {}, "errors": {}, "skipped": []})
    models, rec["errors"] = build_states(arch, args, dev)
    rec["states"] = list(models)
    rec["default_experts_impl"] = M.default_experts_impl(models["bf16"])
    ids = torch.randint(0, models["bf16"].config.vocab_size, (1, args.prompt),
                        generator=torch.Generator().manual_seed(args.seed)).to(dev)
    left = lambda: deadline - time.time()                                   # noqa: E731
    for mode in [m for m in MODES if m in args.modes]:
        if mode == "compiled" and dev == "cpu":         # transformers compiles only on an accelerator by default
            rec["skipped"].append({"what": "compiled", "why": "CUDA only (inductor through Triton's interpreter)"})
            continue
        log(f"{arch} {mode} ...")
        try:
            rec["modes"][mode] = run_mode(models, mode, ids, args, left, log)
        except Exception as e:
            rec["errors"][mode] = _error(e)
        save()
    rec["greedy"] = greedy(rec)
    rec["summary"] = summary(rec)
    if dev == "cuda" and "compiled" in rec["modes"]:
        torch._dynamo.reset()                       # the compiled graphs and their CUDA-graph pools go with the model
    models.clear()
    _free()
    return rec


def greedy(rec: dict) -> dict:
    """Per state: the deepest depth's new tokens eager against compiled (None where a mode did not run)."""
    out = {}
    for s in rec["states"]:
        e, c = (rec["modes"].get(m, {}).get("tokens", {}).get(s) for m in MODES)
        out[s] = {"eager": e, "compiled": c, "equal": None if e is None or c is None else e == c,
                  "first_mismatch": next((i for i, (x, y) in enumerate(zip(e or [], c or [])) if x != y), None)}
    return out


def summary(rec: dict) -> dict:
    """The headline per mode: median tokens/s per state and depth, per-layer ms, each ratio's verdict and interval."""
    out = {m: {"tokens_per_s": {st: {d: (v["tokens_per_s_spread"] or {}).get("median") for d, v in r["depths"].items()}
                                for st, r in rec_m.get("rows", {}).items()},
               "per_layer_ms": {st: r.get("per_layer_ms", {}).get("median") for st, r in rec_m.get("rows", {}).items()},
               "verdicts": {k: {d: [v["verdict"], v.get("median"), v.get("lo"), v.get("hi")] for d, v in r.items()}
                            for k, r in rec_m.get("ratios", {}).items()}} for m, rec_m in rec["modes"].items()}
    out["int4_tokens_equal_eager_compiled"] = rec.get("greedy", {}).get("int4", {}).get("equal")
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.decode_step.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", nargs="+", default=list(ORDER), help=f"among {list(ARCHS)}")
    ap.add_argument("--width", choices=WIDTHS, default="real", help="real: the published widths; tiny: a CPU")
    ap.add_argument("--layers", nargs="+", type=int, default=[1, 2], help="decoder layers (depths) measured")
    ap.add_argument("--prompt", type=int, default=256, help="P: prompt tokens (random ids, seeded)")
    ap.add_argument("--new", type=int, default=64, help="N: new tokens per timed call (>= 2)")
    ap.add_argument("--rounds", type=int, default=7, help="paired rounds (>= 3; a 95 %% interval needs >= 6)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls of every state and depth before the rounds")
    ap.add_argument("--states", nargs="+", default=list(STATES), help=f"among {list(STATES)}")
    ap.add_argument("--modes", nargs="+", default=list(MODES), help=f"among {list(MODES)}")
    ap.add_argument("--cache", choices=("fresh", "reused"), default="fresh", help="fresh: a StaticCache per call")
    ap.add_argument("--cpu-kernels", action=argparse.BooleanOptionalAction, default=True,
                    help="on a CPU, the int4 modules' Triton kernels in the interpreter (else torch arithmetic)")
    ap.add_argument("--budget-s", type=float, default=270.0, help="wall-clock budget, shared evenly by the archs")
    ap.add_argument("--compile-reserve-s", type=float, default=30.0,
                    help="budget a compiled warm-up needs left before it starts (bf16, the first: twice)")
    ap.add_argument("--seed", type=int, default=0, help="the prompt's and the weights' seed")
    ap.add_argument("--out", help="receipt path (default runs/generate_<card>.json)")
    return ap


def main(argv=None) -> int:
    import transformers

    from int4lab.files import check_out_path
    from lab.provenance import portable_command, write_receipt

    from lab.interpreter import lighten

    from .cli import card
    lighten()                                        # the interpreter's speed-ups (a no-op on a GPU)
    ap = parser()
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else RUNS / f"generate_{card()}.json"
    try:                                             # every refusal before any model is built
        check(args)
        check_out_path(out)
    except ValueError as e:
        ap.error(str(e))
    t0 = time.time()
    command = portable_command(" ".join(["python -m lab.decode_step.generate"] +
                                        (argv if argv is not None else sys.argv[1:])))
    archs, state = {}, {"complete": False}

    def save():
        write_receipt(out, {"kind": "generate", "card": card(), "transformers": transformers.__version__,
                            "torch": torch.__version__, "command": command, "method": __doc__.split("\n", 4)[-1],
                            "settings": {k: v for k, v in vars(args).items() if k != "out"},
                            "compile_config": transformers.CompileConfig().to_dict(),
                            "seconds": time.time() - t0, **state, "archs": archs}, command=command)

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)
    todo = [a for a in ORDER if a in args.archs] + [a for a in args.archs if a not in ORDER]
    old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # `timeout` stops with SIGTERM
    try:
        for n, arch in enumerate(todo):
            share = time.time() + (t0 + args.budget_s - time.time()) / (len(todo) - n)
            archs[arch] = {}
            try:
                run_arch(arch, args, share, log, save, archs[arch])
            except Exception as e:                   # the next architecture still runs
                archs[arch].setdefault("errors", {})["arch"] = _error(e)
            log(f"{arch}: {archs[arch].get('summary')}")
            save()
    except BaseException as e:                       # Ctrl-C, a timeout's SIGTERM: the receipt says it stopped
        state["interrupted"] = f"{type(e).__name__}: {e}"[:500]
        save()
        raise
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    state["complete"] = True
    save()
    log(f"receipt: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
