"""Why the one-launch row moved from 0.95 us (v17 timer) to 1.12 us (v18 timer) (notes/perf.md v19d): the
floor kernel over one word (1024 launches per graph, as the bench's `launch` row) and our Qwen3 k/v GEMV
(512x2048, 1024 copies), each timed with the timer's prefill and warm-up on and off, twice, in one process.
Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_launch_timer.py $OUT"""
import json
import sys

import torch

from int4lab.bench import floor, peers, timing
from int4lab.receipts import provenance

out_dir = sys.argv[1]
l2 = timing.l2_bytes()
pool = torch.empty(1024, 256, dtype=torch.uint8, device="cuda")
launch = [floor.read_xor_call(pool[i, :4], *floor.FLOOR_CONFIGS[0]) for i in range(1024)]
gen = torch.Generator(device="cuda").manual_seed(0)
W = peers.weights(512, 2048, gen)
x = torch.randn(1, 2048, generator=gen, device="cuda").to(torch.bfloat16)
kv = peers.prep_gemv("int4_b32", W, x, timing.copies_for(512 * 2048 * 9 // 16, l2)).calls
res = {"provenance": provenance("python3 scripts/probe_launch_timer.py $OUT"), "us": {}}
for rep in range(2):
    for name, calls in (("launch", launch), ("qwen3 k/v int4", kv)):
        for prefill in (0, timing.PREFILL_CYCLES):
            for warm in (0.0, timing.WARMUP_MS):
                s = timing.summarise(timing.time_calls(calls, prefill_cycles=prefill, warmup_ms=warm))
                key = f"{name} prefill={prefill} warmup_ms={warm:g}"
                res["us"].setdefault(key, []).append(round(s["us"], 4))
                print(key, round(s["us"], 3), round(s["p90_us"] / s["p10_us"], 3), flush=True)
json.dump(res, open(f"{out_dir}/probe_launch_timer_h200.json", "w"), indent=1)
