"""Where a decode step's GPU time goes: every kernel attributed to the module that launched it, per layer.

Categories (a kernel belongs to the innermost labelled module that was running when it was launched):
    attn_proj   q/k/v/o projections (GEMVs)             experts     the routed experts (GEMVs and their glue)
    router      router GEMV, softmax, top-k             attention   the rest of self-attention: rope, the cache
    norm        RMSNorms (layer and q/k norms)                      write, the attention kernel, reshapes
    glue        the rest of a decoder layer (residual adds)
    fixed       outside the decoder layers: embedding, final norm, lm_head, the argmax
    gaps        the timed step minus the profiled replays' summed kernel time: two separately timed totals, so it
                holds launch gaps and the two measurements' difference, less any time two kernels overlap (the sum
                counts it twice). The routed MoE step launches its down GEMV as a programmatic dependent of gate_up
                for experts below a size (int4lab.kernels.plan.moe_pdl: OLMoE's and Qwen3's, not Mixtral's), its
                programs starting while gate_up runs, so the two recorded kernel times can overlap and gaps can
                read below zero; the replays' kernel start times are not kept, so the parts are not separated

How: an eager step is profiled with a profiler range per labelled module (forward hooks); a kernel's launch
(its CPU-side correlation) falls inside ranges, the innermost names it. The replay's kernels take the eager
step's categories by position only where the two name sequences match; `profile_eager`'s list also holds the
device-side `cat:` range records, so with its output they never match and each replay kernel takes its name's most
frequent eager category, ties to the first seen. A kernel name shared across categories is then filed under one:
e.g. transformers' two residual adds share their bf16 elementwise-add kernel with rope's two adds (q and k): two
of each a layer, a tie that "attention" wins, so the replay files the residual adds under "attention" and its
"glue" reads zero where they are the only glue.
Per layer = (2 layers) - (1 layer), per category.
"""
from __future__ import annotations

import bisect
import contextlib
from collections import Counter, defaultdict

import torch

CATEGORIES = ("attn_proj", "experts", "router", "attention", "norm", "glue", "fixed")
PREFIX = "cat:"


def module_category(name: str, module) -> str | None:
    """The category a module's range carries (None: no range of its own). `name` is its path in the model."""
    parts = name.split(".")
    leaf = parts[-1]
    cls = type(module).__name__.lower()
    in_layer = "layers" in parts
    if not in_layer:
        return None                                  # outside decoder layers: fixed (no range needed)
    if "norm" in cls or leaf.endswith("norm"):
        return "norm"
    if leaf.endswith("_proj") and "self_attn" in parts:
        return "attn_proj"
    if leaf == "experts":
        return "experts"
    if leaf == "gate" and "mlp" in parts:
        return "router"
    if leaf == "self_attn":
        return "attention"
    if parts[-2] == "layers":                        # the decoder layer itself
        return "glue"
    return None


@contextlib.contextmanager
def labelled(model):
    """Forward hooks that open a profiler range `cat:<category>` around every categorised module."""
    from torch.autograd.profiler import record_function
    handles, stack = [], []
    for name, mod in model.named_modules():
        cat = module_category(name, mod)
        if cat is None:
            continue

        def pre(_m, _a, cat=cat):
            rf = record_function(PREFIX + cat)
            rf.__enter__()
            stack.append(rf)

        def post(_m, _a, _o):
            stack.pop().__exit__(None, None, None)
        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def attribute(ranges, launches, kernels) -> list:
    """Kernels with the innermost range around their launch.

    ranges: [(category, start, end)] (CPU time); launches: {correlation id: CPU start time};
    kernels: [(name, start, duration, correlation id)] (GPU time). Returns [(name, category, duration)] in
    device start order; a kernel whose launch is in no range is "fixed", one with no known launch "unattributed".
    """
    rs = sorted(ranges, key=lambda r: r[1])
    starts = [r[1] for r in rs]
    out = []
    for name, start, dur, corr in sorted(kernels, key=lambda k: k[1]):
        t = launches.get(corr)
        if t is None:
            out.append((name, "unattributed", dur))
            continue
        cat = "fixed"
        for i in range(bisect.bisect_right(starts, t) - 1, -1, -1):     # latest-starting range that contains t
            if rs[i][2] >= t:
                cat = rs[i][0]
                break
        out.append((name, cat, dur))
    return out


def map_categories(eager: list, graph: list) -> tuple[list, str]:
    """Categories for a replay's kernels [(name, duration)] from an attributed eager step [(name, cat, dur)]:
    by position when the name sequences match, else each name's most frequent category (ties: the first seen in
    the eager list). Returns (list, how)."""
    if [n for n, _ in graph] == [n for n, _, _ in eager]:
        return [(n, c, d) for (n, d), (_, c, _) in zip(graph, eager)], "position"
    votes: dict = defaultdict(Counter)
    for n, c, _ in eager:
        votes[n][c] += 1
    return [(n, votes[n].most_common(1)[0][0] if n in votes else "unattributed", d) for n, d in graph], "name"


def sums(kernels: list) -> dict:
    """Microseconds per category of [(name, category, duration us)], and 'busy' = their total."""
    out = {c: 0.0 for c in CATEGORIES}
    for _, c, d in kernels:
        out[c] = out.get(c, 0.0) + d
    out["busy"] = sum(d for _, _, d in kernels)
    return out


def per_layer(one: dict, two: dict, step_one_us: float, step_two_us: float) -> dict:
    """Per-layer microseconds per category from the sums at 1 and 2 layers, gaps = step - busy at each depth (the
    step timed apart from the profiled kernels: a difference of two measurements, which can come out negative)."""
    keys = set(one) | set(two)
    out = {k: two.get(k, 0.0) - one.get(k, 0.0) for k in keys}
    out["gaps"] = (step_two_us - two["busy"]) - (step_one_us - one["busy"])
    out["step"] = step_two_us - step_one_us
    return out


# ------------------------------------------------------------------------------------------ the profiler

def _events(prof):
    return prof.profiler.kineto_results.events()


def _device_kernels(prof) -> list:
    ev = [e for e in _events(prof) if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0]
    return [(e.name(), e.start_ns(), e.duration_ns() / 1e3, e.linked_correlation_id()) for e in ev]


def profile_eager(run, model) -> list:
    """One eager run() under the profiler with module ranges: [(kernel name, category, us)] in device order."""
    from torch.profiler import ProfilerActivity, profile
    with labelled(model), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ev = _events(prof)
    cpu = [e for e in ev if e.device_type() == torch.autograd.DeviceType.CPU]
    ranges = [(e.name()[len(PREFIX):], e.start_ns(), e.start_ns() + e.duration_ns()) for e in cpu
              if e.name().startswith(PREFIX)]
    launches = {e.correlation_id(): e.start_ns() for e in cpu if e.correlation_id()}
    return attribute(ranges, launches, _device_kernels(prof))


def profile_replays(replay, n: int = 3) -> list:
    """n replays under the profiler: [[(kernel name, us)] per replay] (the device kernels split evenly)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            replay()
        torch.cuda.synchronize()
    ks = [(name, dur) for name, _, dur, _ in sorted(_device_kernels(prof), key=lambda k: k[1])]
    if not ks or len(ks) % n:
        return [ks] if ks else []
    m = len(ks) // n
    return [ks[i * m:(i + 1) * m] for i in range(n)]


def graph_sums(eager: list, replays: list) -> tuple[dict, str]:
    """Mean per-category sums over the replays, categories mapped from the eager attribution."""
    if not replays:
        return {}, "no device kernels seen in the replays"
    acc: dict = defaultdict(float)
    how = set()
    for r in replays:
        mapped, h = map_categories(eager, r)
        how.add(h)
        for k, v in sums(mapped).items():
            acc[k] += v / len(replays)
    return dict(acc), "/".join(sorted(how))
