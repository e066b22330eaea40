"""Power probe (notes/perf.md v17): 400 interleaved samples each of the Mixtral one-token MoE, 28672x8192
and the 198 MB read floor, wall-stamped, beside nvidia-smi every 20 ms: are slow samples the SM clock?
On the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_power.py $OUT  (power_probe.json, smi_fast.csv;
summarised in data/receipts/probe_timer_h200.json)."""
import json, sys, time, subprocess
import torch
from int4lab.bench import timing, floor, peers
from int4lab.shapes import MODELS
out = sys.argv[1]
gen = torch.Generator(device="cuda").manual_seed(0)
m = MODELS["mixtral"]
inp = peers.moe_inputs(m, 1, gen)
moe = peers.prep_moe("int4_b32_moe", m, inp, 2).calls
W = peers.weights(28672, 8192, gen); x = torch.randn(1, 8192, generator=gen, device="cuda").bfloat16()
big = peers.prep_gemv("int4_b32", W, x, 2).calls
del W
pool = torch.empty(2, 198197248, dtype=torch.uint8, device="cuda")
fl = [floor.read_xor_call(pool[i], 2048, 2, 8) for i in range(2)]
def graph(calls):
    for c in calls: c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls: c()
    return g
gs = {"moe": graph(moe), "big": graph(big), "floor": graph(fl)}
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                        "--format=csv,noheader", "-lms", "20"], stdout=open(f"{out}/smi_fast.csv", "w"))
time.sleep(1.0)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
res = {k: [] for k in gs}
for i in range(400):
    for k, g in gs.items():
        s.record()
        for _ in range(8): g.replay()
        e.record(); e.synchronize()
        res[k].append((time.time(), s.elapsed_time(e) * 1e3 / 16))
time.sleep(0.5)
smi.terminate()
json.dump(res, open(f"{out}/power_probe.json", "w"))
for k, v in res.items():
    us = sorted(u for _, u in v)
    print(k, "p10 %.2f p50 %.2f p90 %.2f max %.2f" % (us[40], us[200], us[360], us[-1]))
