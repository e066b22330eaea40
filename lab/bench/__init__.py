"""Batch-1 decode timing harness: our int4-b32 kernels beside their peers and the read floor, one run, one
receipt.

    python -m lab.bench                       # full run on a CUDA device -> runs/decode_<card>.json
    python -m lab.bench --quick               # two GEMV shapes + Qwen3's MoE layer (< 1 min), same code path
    python -m lab.bench --only int4_b32,bf16 --out /tmp/r.json
    python -m lab.bench --dry-run             # no timing: shapes, routed experts and bytes (works on CPU)

GemLite on a GPU machine without network access: build the pure-Python wheel where PyPI is reachable, copy
`.whl` (git-ignored) to the GPU machine and install it there before the harness:
    pip wheel --no-deps gemlite==0.6.0.post2 -w .whl                     # on a machine with PyPI
    pip install -q --no-deps --target /tmp/site .whl/gemlite-0.6.0.post2-py3-none-any.whl
    PYTHONPATH=$PWD:/tmp/site python -m lab.bench --out $OUT/decode_h100.json
Its declared dependencies (numpy, tqdm, triton>=3.6.0) are already in this repository's environment.

Method (what one `us` means; `timing.py`):
  * weights are rotated through `copies` distinct copies so that the bytes one cycle touches exceed 4x L2:
    every call reads its weights from HBM, as in a real decode step;
  * one CUDA graph makes the call once per copy; a replay is timed with CUDA events and divided by `copies`;
    `us` is the median over `replays` (>= 20) replays after warm-up replays, `p10_us`/`p90_us` the spread;
  * `GBps` = bytes one call must move (`traffic.py`: weights + scales + activations in and out) / `us`; GEMV
    rows count the prepared tensors' real sizes and keep the formula beside them (`bytes_formula`);
  * `floor_us` = the read floor (`floor.py`): a kernel that only reads the row's int4-b32 bytes (MoE rows: the
    unique routed experts' bytes), its launch configuration searched, timed by the same timer in the same run;
  * before a row is timed its first copy's output is compared with an fp32 reference of the same quantised
    weights; a kernel that fails the check, or an implementation that is missing, goes to `skipped` with the
    reason -- never a row.

Modules: schema (receipt keys, validation), traffic (byte formulas), timing (the CUDA-graph timer), floor
(the read-only kernel), peers (registries: name -> prepare function), harness (schedule, rows, run), cli;
peers built outside the repository: marlin_peer (Marlin W4A16 through ctypes, skipped where not built),
ggml_peer (llama.cpp's CUDA backend: its case list, its output parsed and merged into the receipt), and
peer_table (every implementation over its own read floor).
Beside the decode harness, two benches of their own: pack (`python -m lab.bench.pack`: GPTQ and dithered pack
time beside round-to-nearest) and prefill (`python -m lab.bench.prefill`: scoring forwards, bf16 against int4
through the decode kernels and through the prefill path).
Shapes come from `lab.bench.shapes`.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = expert
intermediate; gate_up is [E, 2I, H] (gate rows first), down is [E, H, I].
"""
from .shapes import EXTRA_SHAPES, MODELS, MoEModel, Shape, all_shapes, decode_shapes
from lab.bench.cli import main
from lab.bench.harness import MOE_TOKENS, Work, bench_gemv, bench_moe, dry_run, run, schedule
from lab.bench.schema import DEFAULT_OUT, GEMV_IMPLS, IMPLS, MOE_IMPLS, validate_receipt, validate_row
from lab.bench.traffic import expert_bytes, gemv_bytes, moe_bytes

__all__ = ["DEFAULT_OUT", "EXTRA_SHAPES", "GEMV_IMPLS", "IMPLS", "MODELS", "MOE_IMPLS", "MOE_TOKENS", "MoEModel",
           "Shape", "Work", "all_shapes", "bench_gemv", "bench_moe", "decode_shapes", "dry_run", "expert_bytes",
           "gemv_bytes", "main", "moe_bytes", "run", "schedule", "validate_receipt", "validate_row"]
