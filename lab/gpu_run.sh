#!/usr/bin/env bash
# The GPU measurements behind the receipts, one stage per part, each in its own process under its own time
# limit (a failing stage loses only itself). On the GPU machine, from the repository root:
#   INT4LAB_GIT_COMMIT=<sha> STAGES=checks bash lab/gpu_run.sh
# Give the commit literally: a copy of the tree on another machine may carry no .git of its own, and a receipt
# must name the clean commit it measured (tests/repo/test_receipts.py refuses a dirty or unknown one).
# Stages (comma list in STAGES; each is sized to run in under 10 minutes; `checks,bench` together do not):
#   checks   a fixed list of CUDA test files (TESTS overrides it; not every test that can use the GPU), 100 graph
#            replays bit-identical with the split-K counters back at zero (lab.tune.replay_check's cases), and
#            compute-sanitizer's memcheck, racecheck, synccheck and initcheck on the same cases at small shapes
#   bench    every decode shape and MoE layer beside its peers and the read floor (lab.bench)
#   step     the whole-model decode step, int4 (three forms) and bf16, eager, graphed, compiled (lab.decode_step)
#   qwen2moe the same decode step on Qwen2-MoE (Qwen1.5-MoE-A2.7B's published widths: a shared expert beside
#            60 routed ones), its own receipt
#   gate     the README's gate command on truncated-depth synthetic OLMoE checkpoints (lab.realscale_gate)
#   gate_full  the README's gate command on a synthetic checkpoint at its published depth, no fit (FULL_ARCH, default
#            olmoe: 16 layers, every default arm; FULL_ARGS passes --gate-args, e.g. the fits' quick settings;
#            FULL_MEMORY="0=130GiB cpu=60GiB" places it with --device-map auto; FULL_COMPARE names the fit to set
#            beside it; FULL_TAG is added to the name; checkpoint in /dev/shm; GATE_S caps it), after the dither's CUDA-vs-CPU test and a ticket's pack
#            time beside round-to-nearest's (dither_cuda_<card>.txt; FULL_DITHER=0 skips them); FULL_WARM=1 runs the
#            small unmeasured gate first (--warmup-full: a second run's time, the kernels compiled); FULL_ALLOC_CONF
#            sets PYTORCH_CUDA_ALLOC_CONF for it (e.g. expandable_segments:True; the log's first line names it and
#            the timeout, its second the host); the allocator's retries are logged; the stage's output is kept
#            beside the receipt as .log, the name the report reads (lab/report/pages.py: the receipt's .json -> .log)
#   gate_fit the README's gate command on synthetic Qwen3-30B-A3B and Mixtral-8x7B at 1, 2 and 3 layers, one card
#            plus the host (--device-map auto --max-memory), quick settings taken to the defaults and fitted to full
#            depth (FIT_ARCHS, FIT_S caps each architecture, FIT_LAYERS, FIT_ARGS, FIT_MEMORY override; FIT_TAG is
#            added to the receipt's name, e.g. _calib65536 for a run whose FIT_ARGS change the calibration size; the
#            stage's output, each arm's build line included, is kept beside it as .log)
#   pack     a lottery ticket's pack (dithered round-to-nearest) against round-to-nearest's on the GPU, at each
#            architecture's expert shapes, many repeats (lab.bench.pack; pack_<card>.json)
#   peers    the bench again with the peers built outside the repository: Marlin (a peer row) and llama.cpp's
#            CUDA backend (ggml test-backend-ops perf, merged into the receipt); runs .peers/run.sh, which builds
#            both from source carried in .peers/ (git-ignored), or skips when .peers/ is absent. Writes
#            decode_<card>.json, ggml_<card>.txt, ggml_cases.txt and the build logs under peers/.
#   prefill  many-row int4 scoring against bf16 and the decode path, paired in alternating rounds in one process,
#            and the rows sweep behind the gate's SCORE_PREFILL_ROWS (lab.bench.prefill)
#   generate what transformers' generate gives (static cache, eager and compiled as transformers documents it):
#            decode tokens/s of bf16, int4 and int4_fused at 1 and 2 layers, paired rounds, the int4/bf16 ratio's
#            95 % interval and greedy tokens eager against compiled (lab.decode_step.generate; GEN_BUDGET_S,
#            GEN_ARCHS, GEN_CACHE=reused for one StaticCache per state and depth, GEN_ARGS, GEN_TAG added to the name)
# Writes under $OUT, every receipt named for the card (h100 / h200): cuda_tests_<card>.txt, replay_check.json,
# sanitizer_<card>.txt, decode_<card>.json, decode_step_<card>.json, decode_step_qwen2_moe_<card>.json,
# realscale_gate_olmoe_<card>.json,
# realscale_gate_full_olmoe_<card>.json (and the gate's output without its checkpoint-writing and weight-loading progress lines, .log), dither_cuda_<card>.txt, realscale_gate_qwen3_moe_<card>.json,
# realscale_gate_mixtral_<card>.json, prefill_<card>.json, pack_<card>.json,
# generate_<card>.json. Carried wheels in .whl/ (git-ignored) are installed
# first: transformers (the pinned version; the image's is older) and GemLite (a peer column of the bench).
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
wheels=$(ls .whl/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels || echo "wheel install failed"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$OUT/gpu.txt"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00' | tr 'H' 'h')
card=${card:-gpu}
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
t0=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - t0 )) s in)"; }
STAGES=${STAGES:-checks}
has() { [[ ",$STAGES," == *",$1,"* ]]; }      # exact stage names: gate is not gate_full

if [[ $STAGES == *checks* ]]; then
  stage "CUDA tests"
  timeout ${TESTS_S:-200} python3 -m pytest -q -m "not notebook" -p no:cacheprovider ${TESTS:-tests/lib/test_kernels.py \
    tests/lib/test_prefill.py tests/lib/test_ops.py tests/lib/test_fused.py tests/lib/test_attention.py \
    tests/lib/test_fused_layer.py tests/lab/test_decode_step.py tests/lib/test_w4a16_cutlass.py \
    tests/lib/test_dither.py} \
    2>&1 | tee "$OUT/cuda_tests_$card.txt" | tail -8
  stage "graph replays"
  timeout 90 python3 -m lab.tune.replay_check --out "$OUT/replay_check.json" | tail -3
  stage "compute-sanitizer"
  for tool in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do
    timeout ${SANITIZER_S:-75} compute-sanitizer --tool $tool --error-exitcode 9 python3 -m lab.tune.replay_check --small \
      --replays 2 --out /tmp/san_$tool.json > /tmp/san_$tool.log 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san_$tool.log | tail -1)" \
      | tee -a "$OUT/sanitizer_$card.txt"
  done
fi
if [[ $STAGES == *bench* ]]; then
  stage "decode bench"
  timeout $(( ${BENCH_BUDGET_S:-250} + 80 )) python3 -m lab.bench --budget-s ${BENCH_BUDGET_S:-250} \
    --out "$OUT/decode_$card.json" | tail -4
fi
if [[ $STAGES == *peers* ]]; then
  stage "peers (Marlin, llama.cpp) and the decode bench"
  if [ -f .peers/run.sh ]; then
    OUT="$OUT" CARD=$card timeout ${PEERS_S:-540} bash -x .peers/run.sh 2> "$OUT/peers_trace.txt"
  else
    echo "no .peers/ here: the peers stage needs the peers' source carried in .peers/ (skipped)"
  fi
fi
if [[ $STAGES == *step* ]]; then
  stage "decode step"
  # One context fits a run of under 9 minutes: the default is context 256 (batches 1 and 16, every state,
  # compiled bf16 and int4_fused2); a second run adds context 4096 to the first's receipt, e.g.
  #   STEP_CONTEXTS=4096 STEP_PARTS="times floors" STEP_RUNS="eager graphed" STEP_PRIOR=<first receipt>
  # (the architectures share the budget evenly: what one leaves goes to the next).
  timeout $(( ${STEP_BUDGET_S:-470} + 50 )) python3 -m lab.decode_step --budget-s ${STEP_BUDGET_S:-470} \
    --batches ${STEP_BATCHES:-1 16} --contexts ${STEP_CONTEXTS:-256} --impls batched_mm grouped_mm \
    --states ${STEP_STATES:-bf16 int4 int4_fused int4_fused2} --runs ${STEP_RUNS:-eager graphed compiled} \
    --compile-states ${STEP_COMPILE:-bf16 int4_fused2} --parts ${STEP_PARTS:-times floors greedy host breakdown} \
    --breakdown-states ${STEP_BREAKDOWN:-int4_fused int4_fused2} \
    --samples 7 --replays 8 --eager-samples ${STEP_EAGER_SAMPLES:-5} ${STEP_PRIOR:+--prior "$STEP_PRIOR"} \
    --out "$OUT/decode_step_$card${STEP_TAG:-}.json" 2>&1 | tail -40
fi
if has qwen2moe; then
  stage "decode step, Qwen2-MoE"
  timeout $(( ${STEP_BUDGET_S:-470} + 50 )) python3 -m lab.decode_step --arch qwen2_moe --budget-s ${STEP_BUDGET_S:-470} \
    --batches 1 16 --contexts ${STEP_CONTEXTS:-256} --impls batched_mm grouped_mm \
    --states bf16 int4 int4_fused int4_fused2 --runs eager graphed compiled --compile-states bf16 int4_fused2 \
    --parts times floors greedy host breakdown --breakdown-states int4_fused int4_fused2 \
    --samples 7 --replays 8 --eager-samples 2 --out "$OUT/decode_step_qwen2_moe_$card.json" 2>&1 | tail -40
fi
if has prefill; then
  stage "prefill"
  timeout ${PREFILL_S:-300} python3 -m lab.bench.prefill --out "$OUT/prefill_$card.json" --rounds ${PREFILL_ROUNDS:-6} \
    --repeats 5 --sweep 16,32,64,128,256,512,1024,2048,4096,8192 2>&1 | tail -16
fi
if has gate; then
  stage "gate at real width"
  timeout ${GATE_S:-420} python3 -m lab.realscale_gate --arch olmoe --layers 2 4 --workdir /tmp/rsg \
    --out "$OUT/realscale_gate_olmoe_$card.json" --deadline $(( ${GATE_S:-420} - 40 )) 2>&1 \
    | grep --line-buffered -v "Writing model shards\|Loading weights" | tail -30
fi
if has gate_full; then
  if [ "${FULL_DITHER:-1}" = 1 ]; then
    stage "dither on CUDA against the CPU"
    timeout 45 python3 -m pytest -q -p no:cacheprovider tests/lib/test_dither.py 2>&1 | tee "$OUT/dither_cuda_$card.txt" | tail -2
    timeout 40 python3 -m lab.bench.pack --device cuda --impls rtn rtn_dithered --repeats 5 --no-write 2>&1 \
      | tee -a "$OUT/dither_cuda_$card.txt" | tail -4
  fi
  farch=${FULL_ARCH:-olmoe}
  stage "gate at full depth: $farch"
  rm -rf /dev/shm/rsg_full
  alloc=${FULL_ALLOC_CONF:-${PYTORCH_CUDA_ALLOC_CONF:-}}
  full="$OUT/realscale_gate_full_${farch}${FULL_TAG:-}${FULL_WARM:+_warm}_$card"   # a warmed run keeps its own name
  # the log's first lines record the settings the receipt does not (the allocator's, the stage's limit, the host)
  echo "PYTORCH_CUDA_ALLOC_CONF=${alloc:-(unset: the default allocator)}; timeout ${GATE_S:-480} s" \
    | tee "$full.log"
  echo "host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB memory, /dev/shm $(df -h /dev/shm | awk 'NR==2{print $2}')" \
    | tee -a "$full.log"
  PYTORCH_CUDA_ALLOC_CONF=$alloc \
  timeout ${GATE_S:-480} python3 -m lab.realscale_gate --arch $farch --full ${FULL_WARM:+--warmup-full} \
    ${FULL_MEMORY:+--device-map auto --max-memory $FULL_MEMORY} ${FULL_COMPARE:+--compare "$FULL_COMPARE"} \
    ${FULL_ARGS:+--gate-args="$FULL_ARGS"} --workdir /dev/shm/rsg_full \
    --out "$full.json" 2>&1 | grep --line-buffered -v "Writing model shards\|Loading weights" \
    | tee -a "$full.log" | tail -30
  rm -rf /dev/shm/rsg_full
fi
if has gate_fit; then
  for arch in ${FIT_ARCHS:-qwen3_moe mixtral}; do
    stage "gate fit: $arch at ${FIT_LAYERS:-1 2 3} layers, one card plus the host"
    rm -rf /dev/shm/rsg_fit
    timeout ${FIT_S:-260} python3 -m lab.realscale_gate --arch $arch --layers ${FIT_LAYERS:-1 2 3} --device-map auto \
      --max-memory ${FIT_MEMORY:-0=70GiB cpu=100GiB} --workdir /dev/shm/rsg_fit --deadline $(( ${FIT_S:-260} - 15 )) \
      --gate-args="${FIT_ARGS:---max-docs 20 --lottery 1 --calib-draws 1 --no-floor}" \
      --out "$OUT/realscale_gate_${arch}${FIT_TAG:-}_$card.json" 2>&1 | grep --line-buffered -v "Writing model shards\|Loading weights" \
      | tee "$OUT/realscale_gate_${arch}${FIT_TAG:-}_$card.log" | tail -20
    rm -rf /dev/shm/rsg_fit
  done
fi
if has pack; then
  stage "pack: a lottery ticket against round-to-nearest"
  timeout ${PACK_S:-120} python3 -m lab.bench.pack --device cuda --impls rtn rtn_dithered --repeats ${PACK_REPEATS:-101} \
    --shapes 14336x4096 4096x14336 2048x1024 1024x2048 768x2048 2048x768 --out "$OUT/pack_$card.json" 2>&1 | tail -14
fi
if has generate; then
  stage "generate: int4 against bf16, eager and compiled"
  timeout $(( ${GEN_BUDGET_S:-250} + 45 )) python3 -m lab.decode_step.generate --budget-s ${GEN_BUDGET_S:-250} \
    --archs ${GEN_ARCHS:-olmoe qwen3_moe mixtral} --cache ${GEN_CACHE:-fresh} ${GEN_ARGS:-} \
    --out "$OUT/generate${GEN_TAG:-}_$card.json" 2>&1 | grep --line-buffered -v "Warning\|warnings.warn" | tail -40
fi
stage "done"
