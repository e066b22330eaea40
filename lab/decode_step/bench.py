"""The decode-step benchmark: what one layer of a whole model costs per greedy step, int4 against bf16.

Per architecture (the published configuration at real width, random weights, `--layers` decoder layers):
  * states: "bf16" (the model as built, with each transformers experts implementation), "int4"
    (`quantize_model(model, "rtn", "experts+attn")`), "int4_fused" (int4 plus `fuse_decode(attention=False,
    add_norm=False)`: q/k/v in one GEMV, the router in one kernel, RMSNorm in one kernel) and "int4_fused2" (the same plus
    FusedAttention: q/k norm, rope, the cache write and attention in one launch; FusedDecoderLayer: the residual
    add after attention and the next RMSNorm in one launch);
  * runs: "eager" (the host launches every op, over the static cache; with such a cache `generate` compiles the
    decode forward unless `disable_compile` is set, so this is not its default mode; `generate`'s own per-step work
    is not timed), "graphed" (the step captured in one CUDA graph), "compiled" (each decoder
    layer torch.compile'd, then the step captured);
  * per (batch, context): the batch's rows are identical sequences (lab.decode_step.step.Stepper), so a batch
    routes to batch 1's experts; the step time at each depth; per layer = the slope between the smallest and largest
    depth, fixed = the rest; at the published depth: fixed + layers x per layer, tokens/s = batch / that step;
  * the read floor of one layer: the bytes it must read (int4 or bf16 weights of attention and of the distinct
    routed experts, router, norms, the KV cache of the context) timed by lab.bench.floor's read-only kernel;
  * a breakdown of the graphed layer (lab.decode_step.profile) for batch 1 at the first context;
  * greedy tokens over `--greedy-steps` steps, eager against graphed, int4 and int4_fused2 (they must be equal).
Everything lands in one receipt, rewritten after each part; a part that fails records its error and the rest run.
"""
from __future__ import annotations

import copy
import gc
import time
import traceback

import torch

from lab.synth import FULL_LAYERS, config_fields

from . import model as M
from . import profile as P
from . import step as S
from .summary import summarise

STATES = ("bf16", "int4", "int4_fused", "int4_fused2")
FUSED = {"int4_fused": False, "int4_fused2": True}     # state -> fuse_decode(attention=..., add_norm=...)
RUNS = ("eager", "graphed", "compiled")
PARTS = ("times", "floors", "greedy", "host", "breakdown")


def _cuda() -> bool:
    return torch.cuda.is_available()


def _free() -> None:
    gc.collect()
    if _cuda():
        torch.cuda.empty_cache()


def extrapolate(step_us: dict, full_layers: int, batch: int) -> dict:
    """step_us {depth: us} -> per layer (slope between the extreme depths), fixed, and the published depth's step
    and tokens/s, the arithmetic written out."""
    ds = sorted(int(d) for d in step_us)
    lo, hi = ds[0], ds[-1]
    per = (step_us[hi] - step_us[lo]) / (hi - lo)
    fixed = step_us[lo] - lo * per
    full = fixed + full_layers * per
    return {"per_layer_us": per, "fixed_us": fixed, "full_layers": full_layers, "full_step_us": full,
            "tokens_per_s": batch * 1e6 / full, "formula": (
                f"per layer = ({step_us[hi]:.2f} - {step_us[lo]:.2f}) / ({hi} - {lo}) = {per:.2f} us; fixed = "
                f"{step_us[lo]:.2f} - {lo} x {per:.2f} = {fixed:.2f} us; step at {full_layers} layers = {fixed:.2f} + "
                f"{full_layers} x {per:.2f} = {full:.2f} us; tokens/s = {batch} x 1e6 / {full:.2f} = "
                f"{batch * 1e6 / full:.1f}")}


class Run:
    """One architecture's measurements; `rec` is its part of the receipt, `save()` rewrites the receipt."""

    def __init__(self, arch, args, save, log, deadline, prior: dict | None = None):
        """prior: this architecture's record from an earlier call on the same receipt (same width and depths):
        its rows, parts, skipped parts and errors are kept unless this call attempts them again (a run split
        across calls)."""
        self.arch, self.args, self.save, self.log, self.deadline = arch, args, save, log, deadline
        self.dev = "cuda" if _cuda() else "cpu"
        fresh = {"arch": arch, "width": args.width, "depths": list(args.layers), "full_layers": FULL_LAYERS[arch],
                 "config": config_fields(arch, max(args.layers), args.width), "rows": [], "bytes": {},
                 "floors": {}, "breakdown": [], "errors": {}, "skipped": []}
        keep = prior and prior.get("width") == args.width and prior.get("depths") == list(args.layers)
        self.rec = {**fresh, **copy.deepcopy(prior)} if keep else fresh
        self.models: dict = {}

    # -------------------------------------------------------------------------------- plumbing
    def left(self) -> float:
        return self.deadline - time.time()

    def part(self, key: str, fn, need_s: float = 0.0):
        """Run fn() unless less than need_s of the budget is left (then record it skipped); record its error and go
        on when it fails."""
        if key in self.rec["skipped"]:                  # an earlier call's verdict on this part is replaced
            self.rec["skipped"].remove(key)
        self.rec["errors"].pop(key, None)
        if self.left() < need_s:
            self.rec["skipped"].append(key)
            self.log(f"{self.arch} {key}: skipped (budget: {self.left():.0f} s left)")
            return None
        t0 = time.time()
        self.log(f"{self.arch} {key} ...")
        try:
            out = fn()
            self.log(f"{self.arch} {key} done in {time.time() - t0:.1f} s")
            return out
        except Exception as e:                                  # recorded, and the next part runs
            self.rec["errors"][key] = {"error": f"{type(e).__name__}: {e}"[:2000],
                                       "traceback": traceback.format_exc().splitlines()[-30:]}
            self.log(f"{self.arch} {key} FAILED: {type(e).__name__}: {str(e)[:300]}")
            return None
        finally:
            _free()
            self.save()

    # -------------------------------------------------------------------------------- models
    def build(self):
        from int4lab.quantize import quantize_model
        a = self.args
        bf16 = M.build(self.arch, max(a.layers), a.width, self.dev, torch.bfloat16, seed=a.seed)
        self.rec["experts_impls"] = M.experts_impls(bf16)
        self.rec["default_experts_impl"] = M.default_experts_impl(bf16)
        self.models["bf16"] = bf16
        int4 = copy.deepcopy(bf16)
        quantize_model(int4, "rtn", "experts+attn", progress=False)
        self.models["int4"] = int4
        fuse = _fuser()
        for state, attn in FUSED.items():
            if fuse is not None and state in a.states:
                self.models[state] = fuse(copy.deepcopy(int4), attention=attn, add_norm=attn)
        self.rec["states"] = [s for s in STATES if s in self.models and s in a.states]
        return True

    def modes(self, batch: int, context: int, first: bool) -> list:
        """(state, experts impl, run) in the order they are measured for one (batch, context)."""
        a, out = self.args, []
        for state in self.rec["states"]:
            impls = [i for i in self.rec["experts_impls"] if i in a.impls] if state == "bf16" else [None]
            for impl in impls:
                for run in a.runs:
                    if run == "graphed" and (not _cuda() or impl == "eager"):
                        continue        # CUDA only; HF's eager experts loop reads the routing back (nonzero)
                    if run == "compiled":
                        if not first or state not in a.compile_states or (not _cuda() and
                                                                          a.compile_backend == "inductor"):
                            continue    # compiled: the first case only (a compile per shape); inductor on CUDA
                        if state == "bf16":
                            if impl == impls[0]:
                                out.append((state, "best", run))    # the best graphed impl, chosen when it runs
                            continue
                    out.append((state, impl, run))
        return out

    def best_impl(self) -> str:
        rows = [r for r in self.rec["rows"] if r["state"] == "bf16" and r["run"] == ("graphed" if _cuda() else "eager")
                and "per_layer_us" in r]
        if not rows:
            return self.rec["default_experts_impl"]
        return min(rows, key=lambda r: r["per_layer_us"])["impl"]

    # -------------------------------------------------------------------------------- measuring
    def time_mode(self, state, impl, run, batch, context) -> dict:
        a, model = self.args, self.models[state]
        if impl is not None:
            M.set_experts_impl(model, impl)
        row = {"state": state, "impl": impl, "run": run, "batch": batch, "context": context, "step_us": {}}
        key = (state, impl, run, batch, context)
        self.rec["rows"] = [r for r in self.rec["rows"] if (r["state"], r["impl"], r["run"], r["batch"],
                                                             r["context"]) != key] + [row]
        ctx = S.compiled_layers(model, a.compile_backend) if run == "compiled" else _null()
        with ctx:
            for d in a.layers:
                with M.depth(model, d):
                    st = S.Stepper(model, batch, context)
                    if run == "eager" or (run == "compiled" and not _cuda()):
                        r = S.time_eager(st, steps=a.eager_steps, warmup=a.eager_warmup, samples=a.eager_samples)
                    else:
                        r = S.time_graphed(st, replays=a.replays, samples=a.samples)
                    row["step_us"][str(d)] = r["us"]
                    row.setdefault("samples_us", {})[str(d)] = r["samples_us"]
                    del st
                    _free()
        row.update(extrapolate({int(k): v for k, v in row["step_us"].items()}, FULL_LAYERS[self.arch], batch))
        self.log(f"  {state:10s} {impl or '-':10s} {run:8s} B{batch:<3d} C{context:<5d} per layer "
                 f"{row['per_layer_us']:8.1f} us  fixed {row['fixed_us']:8.1f} us  {row['tokens_per_s']:8.1f} tok/s")
        return row

    def census(self, state, batch, context) -> float:
        """Mean distinct experts per layer per step (eager steps with a hook on each router). The batch's rows are
        identical, so this is batch 1's count (top-k) at every batch."""
        model = self.models[state]
        st = S.Stepper(model, batch, context)
        st.reset(context - S.HEADROOM)
        with torch.no_grad(), M.routing_census(model) as seen:
            for _ in range(4):
                st.step()
        return sum(n for _, n in seen) / max(1, len(seen))

    def floors(self, batch, context):
        from lab.bench import floor, timing
        out = {}
        for state in ("int4", "bf16"):
            if state not in self.models:
                continue
            distinct = self.census(state, batch, context)
            by = M.layer_bytes(self.models[state], batch, context, distinct)
            self.rec["bytes"][f"{state} B{batch} C{context}"] = by
            f = {"bytes": by["total"]}
            if _cuda():
                f.update(floor.read_floor(by["total"], l2=timing.l2_bytes(), replays=self.args.floor_replays,
                                          configs=FLOOR_CONFIGS))
            out[state] = f
            self.rec["floors"][f"{state} B{batch} C{context}"] = f
        return out

    def breakdown(self, state, impl, batch, context):
        model = self.models[state]
        if impl is not None:
            M.set_experts_impl(model, impl)
        res = {"state": state, "impl": impl, "batch": batch, "context": context, "depths": {}}
        self.rec["breakdown"] = [r for r in self.rec["breakdown"] if r["state"] != state] + [res]
        for d in (min(self.args.layers), max(self.args.layers)):
            with M.depth(model, d), torch.no_grad():
                st = S.Stepper(model, batch, context)
                st.reset(context - S.HEADROOM)
                st.step()                                         # warm (workspaces, lazy cache)
                st.reset(context - S.HEADROOM)
                eager = P.profile_eager(st.step, model)
                st.reset(context - S.HEADROOM)
                cap = S.Captured(st)
                st.reset(context - S.HEADROOM)
                replays = P.profile_replays(cap.replay, 3)
                sums, how = P.graph_sums(eager, replays)
                st.reset(context - S.HEADROOM)
                t = S.time_graphed(st, replays=self.args.replays, samples=self.args.samples)["us"]
                res["depths"][str(d)] = {"step_us": t, "sums_us": sums, "mapped_by": how,
                                         "kernels_eager": len(eager), "kernels_replay": len(replays[0]) if replays
                                         else 0, "eager_kernels": [list(k) for k in eager]}
                del cap, st
                _free()
        lo, hi = (res["depths"][str(d)] for d in (min(self.args.layers), max(self.args.layers)))
        span = max(self.args.layers) - min(self.args.layers)
        pl = P.per_layer(lo["sums_us"], hi["sums_us"], lo["step_us"], hi["step_us"])
        res["per_layer_us"] = {k: v / span for k, v in pl.items()}
        return res

    def host(self, calls: int = 200) -> dict:
        """Host time per call of one layer's projection and MoE step at batch 1: the public launchers (every
        argument checked, the ids read back) against the modules' entry (kernels.ops), and the bf16 modules they
        replace; wall time of `calls` calls back to back, the queue drained once at the end."""
        import torch.nn.functional as F

        from int4lab.kernels import int4_linear, moe_decode_step, ops
        from int4lab.quantize.layout import attention, decoder_layers, experts_of, router
        arch, dev = self.arch, self.dev
        q_lay, b_lay = (decoder_layers(self.models[s])[0] for s in ("int4", "bf16"))
        lin, ex = attention(q_lay, arch).q_proj, experts_of(q_lay, arch)
        blin, bex = attention(b_lay, arch).q_proj, experts_of(b_lay, arch)
        H = lin.in_features
        x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            _, w, ids = router(b_lay, arch)(x)
        wf = w.float()

        def per_call(fn):
            for _ in range(20):
                fn()
            S._sync(dev)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            S._sync(dev)
            return (time.perf_counter() - t0) / calls * 1e6
        out = {"calls": calls, "us": {}}
        with torch.no_grad():
            cases = {"int4 linear, public int4_linear": lambda: int4_linear(x, lin.packed, lin.scales),
                     "int4 linear, module entry ops.linear": lambda: ops.linear(x, lin.packed, lin.scales, lin.act),
                     "int4 moe, public moe_decode_step": lambda: moe_decode_step(
                         x, ids, wf, ex.gate_up_packed, ex.gate_up_scales, ex.down_packed, ex.down_scales),
                     "int4 moe, module entry ops.moe": lambda: ops.moe(
                         x, ids, w, ex.gate_up_packed, ex.gate_up_scales, ex.down_packed, ex.down_scales),
                     "bf16 linear, F.linear": lambda: F.linear(x, blin.weight)}
            for k, fn in cases.items():
                out["us"][k] = per_call(fn)
            for impl in self.rec["experts_impls"]:
                M.set_experts_impl(self.models["bf16"], impl)
                out["us"][f"bf16 experts, {impl}"] = per_call(lambda: bex(x, ids, w))
        for k, v in out["us"].items():
            self.log(f"  host {k:42s} {v:8.1f} us per call")
        self.rec["host"] = out
        return out

    def greedy(self):
        a = self.args
        g = torch.Generator().manual_seed(a.seed)
        vocab = min(self.models["int4"].config.vocab_size, 4096)
        prompt = torch.randint(0, vocab, (1, a.prompt), generator=g).to(self.dev)
        out = {"steps": a.greedy_steps, "prompt": a.prompt, "batch": 1, "states": {}}
        for state in [s for s in ("int4", "int4_fused2") if s in self.models]:
            r = {"tokens_eager": S.greedy(self.models[state], prompt, a.greedy_steps, graphed=False)}
            if _cuda():
                r["tokens_graphed"] = S.greedy(self.models[state], prompt, a.greedy_steps, graphed=True)
                te, tg = r["tokens_eager"], r["tokens_graphed"]
                r["equal"] = te == tg
                r["first_mismatch"] = next((i for i, (x, y) in enumerate(zip(te, tg)) if x != y), None)
            else:
                r["equal"] = None
                r["note"] = "graph capture needs CUDA: eager tokens only"
            out["states"][state] = r
        out.update(out["states"]["int4"])                     # int4's check also at the top level of `greedy`
        eq = [r["equal"] for r in out["states"].values()]
        out["equal"] = None if None in eq else all(eq)
        self.rec["greedy"] = out
        return out

    # -------------------------------------------------------------------------------- the whole run
    def run(self):
        a = self.args
        if not self.part("build", self.build):
            return self.rec
        cases = [(b, c) for b in a.batches for c in a.contexts]
        cases.sort(key=lambda bc: (bc != (a.batches[0], a.contexts[0]), bc[1], bc[0]))  # the first case first
        for i, (b, c) in enumerate(cases):
            modes = self.modes(b, c, first=i == 0)
            # the first case: every uncompiled run, its floors, the greedy check and the breakdown before the
            # compiled runs (a compile takes tens of seconds; what the targets need comes first)
            for state, impl, run in [m for m in modes if m[2] != "compiled" and "times" in a.parts]:
                self.part(f"time {state} {impl or '-'} {run} B{b} C{c}",
                          lambda: self.time_mode(state, impl, run, b, c), 5.0)
            if "floors" in a.parts:
                self.part(f"floors B{b} C{c}", lambda: self.floors(b, c), 5.0)
            if i == 0:
                if "int4" in self.models and "greedy" in a.parts:
                    self.part("greedy", self.greedy, 10.0)
                if "int4" in self.models and "host" in a.parts and _cuda():
                    self.part("host", self.host, 10.0)
                if _cuda() and "breakdown" in a.parts:
                    for state in [s for s in self.rec["states"] if s in getattr(a, "breakdown_states", STATES)]:
                        impl = self.best_impl() if state == "bf16" else None
                        self.part(f"breakdown {state} {impl or '-'} B{b} C{c}",
                                  lambda: self.breakdown(state, impl, b, c), 15.0)
            for state, impl, run in [m for m in modes if m[2] == "compiled" and "times" in a.parts]:
                impl = self.best_impl() if impl == "best" else impl
                self.part(f"time {state} {impl or '-'} {run} B{b} C{c}",
                          lambda: self.time_mode(state, impl, run, b, c), a.compile_reserve_s)
            self.rec["summary"] = summarise(self.rec)
        self.rec["summary"] = summarise(self.rec)
        self.models.clear()
        return self.rec


# The floor kernel's configurations tried per byte count: the recorded floor's two best and a wide one
# (lab.bench.floor.FLOOR_CONFIGS has six; three keep the floors of a whole run to seconds).
FLOOR_CONFIGS = ((1024, 4, 4), (2048, 2, 8), (4096, 1, 8))


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _fuser():
    """int4lab.quantize.fuse_decode when the library has it (the fused decode layer), else None."""
    try:
        from int4lab.quantize import fuse_decode
    except ImportError:
        return None
    return fuse_decode
