"""RESULTS.md, the README's layout and the kernel notes' misses, and chapter 05's figures, generated from the
receipts (never typed by hand). One module per kind of block: decode.py (the decode receipt's tables),
targets.py (the named targets), figures.py, pages.py (the other receipts' blocks), generate.py (`generate`'s
tokens/s), layout.py (the README's tree), cli.py.

    python -m lab.report                              # print the decode block for the current decode receipt
    python -m lab.report --results RESULTS.md         # rewrite RESULTS.md's generated blocks (between its markers)
    python -m lab.report --readme README.md           # rewrite the README's layout block (folders and their sizes)
    python -m lab.report --notes notes/kernels.md     # rewrite the kernel notes' table of missed targets

Decode columns come from the receipt's rows: µs per call, the row's read floor (`floor_us`: a kernel that only
reads the row's int4-b32 bytes, timed in the same run; receipts from before the floor lack it and show "–"),
`int4_b32 / floor`, and beside every peer the receipt timed its time over ours (Marlin and llama.cpp's CUDA Q4_0
included where `lab.bench.ggml_peer` merged ggml's timings: by its eager timer and by a rotating harness on
weights of its own, whose rotation the receipt does not record (the ‡ legend, `targets.ROT_LEGEND`), both by host
wall clock). A *recorded*
llama.cpp column (ggml test-backend-ops, data/receipts/anchors/, see PROVENANCE.md there) is shown only beside a
receipt of the card it was recorded on (`same_card`). The targets
have names, defined once by `target_definitions` (RESULTS.md prints them): "GEMV at the floor", "GEMV beside
its peers", "one-token MoE step" and "batched MoE"; each is checked against the receipt: pass, miss, undecided
or not measured.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden, I = expert
intermediate (MoE rows carry N = I, K = H).
"""
from lab.bench.schema import DEFAULT_OUT  # noqa: F401  (the receipt the report reads by default)
from lab.bench.shapes import MODELS  # noqa: F401
from lab.paths import RECEIPTS  # noqa: F401

from .decode import (  # noqa: F401
    ANCHORS, START, END, LLAMA, GEMV_PEERS, MOE_PEERS, load, read, reading, partial_settings, refuse_partial,
    parse_ggml, anchor_rows, same_card, llama_gemv_us, llama_moe_us, gemv_shapes, gemv_table, moe_keys,
    best_impl_moe, best_ours_moe, moe_tile, moe_table, gemv_summary, moe_series, CARDS, card)
from .targets import (  # noqa: F401
    GEMV_FLOOR, GEMV_BESIDE_PEERS, ONE_TOKEN_MOE, BATCHED_MOE, Check, repeat_of, STABLE_PEERS,
    run_to_run, DECIDE_GLOB, paired_ratios, BIG_SHAPES, MOE_FLOOR_LIMIT, MOE_OVER_BF16, BATCH_TOKENS,
    BATCH_FLOOR_LIMIT, BATCH_SPEEDUP, targets, targets_table, target_definitions, misses_table, render,
    ROT_HEADER, ROT_LEGEND, peer_labels, peer_gemv_table, peer_moe_table, peer_tables)
from .figures import (  # noqa: F401
    GEMV_COLORS, MOE_COLORS, GEMV_LABELS, floor_fixed_share, plot_time_over_floor, plot_moe,
    plot_moe_tokens)
from .pages import (  # noqa: F401
    replace_block, rewrite_readme, RESULTS_START, RESULTS_END, train_table, gate_table, pack_table, REALSCALE_START,
    REALSCALE_END, realscale_table, warmup_text, DECODE_STEP_START, DECODE_STEP_END, decode_step_table,
    render_results, TARGETS_START, TARGETS_END, MISSES_START, MISSES_END, LAYOUT_START, LAYOUT_END,
    misses_block)
from .generate import GENERATE_START, GENERATE_END, generate_text, verdicts  # noqa: F401
from .layout import (  # noqa: F401
    LAYOUT, tracked_files, folder_sizes, layout_block)
from .cli import (  # noqa: F401
    Pages, plan, main)
