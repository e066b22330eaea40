# Bench-context probe (notes/perf.md v17): the bench's first minute with the SM clock logged every 200 ms, then
# scripts/probe_timer.py again on the warm GPU. On the GPU machine: PYTHONPATH=$PWD bash scripts/probe_bench_context.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > $OUT/smi.csv &
SMI=$!
timeout 200 python3 -m int4lab.bench --budget-s 70 --out $OUT/ctx_bench.json 2>&1 | grep -E "int4|floor|moe" | head -60
python3 scripts/probe_timer.py $OUT 2>&1 | grep -E "^[01] (28672x8192 int4|floor 1|mixtral)"
kill $SMI
