"""The whole-model decode step: int4 against transformers' bf16 (eager, graphed, compiled) and the read floor.

    python -m lab.decode_step --out data/receipts/decode_step_h100.json --budget-s 420      # a GPU
    python -m lab.decode_step --width tiny --contexts 64 --batches 1 2 --out /tmp/d.json   # a CPU (no graphs)

    model.py    the models (published configurations, truncated depth), bytes per layer, routing census
    step.py     one greedy step with a static KV cache: eager, one CUDA graph, compiled layers; greedy tokens
    profile.py  the per-layer breakdown of a graphed step by category (kernels attributed to modules)
    bench.py    the measurements per architecture and the summary the chapter asserts on
    cli.py      the command line and the receipt
"""
