"""Where the bench's slow samples sit (notes/perf.md v19c): the raw per-sample times of the bench's own row
functions (harness.bench_moe for the Mixtral one-token MoE, harness.bench_gemv for 28672x8192, our impls only),
three times each, beside the same calls timed directly as in the v19 probe (branch next/mma-magic-seed; inputs
from peers.moe_inputs / peers.prep_*), in one process.
Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_bench_samples.py $OUT"""
import functools
import json
import sys

import torch

from int4lab.bench import floor, harness, peers, timing
from int4lab.bench.traffic import expert_bytes
from int4lab.receipts import provenance
from int4lab.shapes import MODELS, Shape

out_dir = sys.argv[1]
raw = []
_summarise = timing.summarise


def keep(samples):
    raw.append([round(v, 3) for v in samples])
    return _summarise(samples)


timing.summarise = keep             # harness and floor call timing.summarise: every sample list lands in `raw`
# the timer as it ran for this receipt (before the 50 ms warm-up, which this probe motivated)
timing.time_calls = functools.partial(timing.time_calls, warmup_ms=0.0)
res = {"provenance": provenance("python3 scripts/probe_bench_samples.py $OUT"), "runs": []}
l2 = timing.l2_bytes()
m = MODELS["mixtral"]
gen = harness._generator(0)


def floor_of(nbytes):   # measured again in every repetition: its first configuration shows the slow start too
    return floor.read_floor(nbytes, l2=l2, replays=20)


for rep in range(3):
    n0 = len(raw)
    harness.bench_gemv(Shape("large", "28672x8192", 28672, 8192), ("int4_b32",), replays=20, l2=l2, gen=gen,
                       floor_of=floor_of)
    res["runs"].append({"what": "bench_gemv 28672x8192 int4_b32", "samples": raw[n0:]})
    n0 = len(raw)
    harness.bench_moe(m, "int4_b32_moe", 1, replays=20, l2=l2, gen=gen, floor_of=floor_of)
    res["runs"].append({"what": "bench_moe mixtral int4_b32_moe R=1", "samples": raw[n0:]})
    inp = peers.moe_inputs(m, 1, gen, 0)
    copies = timing.copies_for(peers.n_active(inp.ids) * expert_bytes("int4_b32_moe", m), l2)
    calls = peers.prep_moe("int4_b32_moe", m, inp, copies).calls
    n0 = len(raw)
    keep(timing.time_calls(calls, replays=20))
    res["runs"].append({"what": "direct mixtral int4_b32_moe R=1", "copies": copies, "samples": raw[n0:]})
    del inp, calls
    torch.cuda.empty_cache()
    for r in res["runs"][-3:]:
        print(r["what"], [[round(v, 1) for v in s] for s in r["samples"]], flush=True)
    json.dump(res, open(f"{out_dir}/probe_bench_samples_h200.json", "w"), indent=1)
