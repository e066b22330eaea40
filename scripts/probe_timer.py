"""Timer probe (notes/perf.md v17): does one graph replay per sample put the host's graph-launch latency on
rows with 1-2 weight copies? Each case timed with 1, 16 and 64 calls per sample, twice, in one process.
On the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_timer.py $OUT  (writes timer_probe.json;
data/receipts/probe_timer_h200.json holds its runs)."""
import json, sys, time, subprocess
import torch
from int4lab.bench import timing, floor, peers
from int4lab.shapes import MODELS
out = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = False
gen = torch.Generator(device="cuda").manual_seed(0)
l2 = timing.l2_bytes()
res = {"smi_before": subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                     "--format=csv"], capture_output=True, text=True).stdout}
cases = {}
W = peers.weights(28672, 8192, gen); x = torch.randn(1, 8192, generator=gen, device="cuda").bfloat16()
cases["28672x8192 int4"] = peers.prep_gemv("int4_b32", W, x, 2).calls
cases["28672x8192 bf16"] = peers.prep_gemv("bf16", W, x, 2).calls
del W
W = peers.weights(14336, 4096, gen); x = torch.randn(1, 4096, generator=gen, device="cuda").bfloat16()
cases["14336x4096 int4"] = peers.prep_gemv("int4_b32", W, x, 8).calls
x_long = torch.randn(1, 14336, generator=gen, device="cuda").bfloat16()
cases["4096x14336 int4"] = peers.prep_gemv("int4_b32", W.reshape(4096, 14336).contiguous(), x_long, 8).calls
del W
for nb, c in ((132194304, 2), (33067008, 8), (198197248, 2)):
    pool = torch.empty(c, nb, dtype=torch.uint8, device="cuda")
    cases[f"floor {nb}"] = [floor.read_xor_call(pool[i], 2048, 2, 8) for i in range(c)]
for mname in ("mixtral", "qwen3"):
    m = MODELS[mname]
    inp = peers.moe_inputs(m, 1, gen)
    routed = 2 if mname == "mixtral" else 8                     # experts one token reads (top-k)
    c = timing.copies_for(routed * peers.expert_bytes("int4_b32_moe", m), l2)
    cases[f"{mname} moe1 int4 x{c}"] = peers.prep_moe("int4_b32_moe", m, inp, c).calls
# host cost of one replay of a 2-call graph
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for cl in cases["28672x8192 int4"]: cl()
torch.cuda.synchronize()
ts = []
for _ in range(50):
    torch.cuda.synchronize(); t = time.perf_counter(); g.replay(); ts.append((time.perf_counter() - t) * 1e6)
res["host_replay_us_median"] = sorted(ts)[25]
res["cases"] = {}
for rep in range(2):
    for name, calls in cases.items():
        for mc in (1, 16, 64):
            s = timing.summarise(timing.time_calls(calls, replays=20, min_calls=mc, prefill_cycles=0,
                                                    warmup_ms=0.0))   # the timer as it ran (v17)
            res["cases"].setdefault(name, {}).setdefault(f"min_calls={mc}", []).append(round(s["us"], 2))
            print(rep, name, len(calls), mc, round(s["us"], 2), flush=True)
res["smi_after"] = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                   "--format=csv"], capture_output=True, text=True).stdout
json.dump(res, open(f"{out}/timer_probe.json", "w"), indent=1)
print(json.dumps(res, indent=1))
