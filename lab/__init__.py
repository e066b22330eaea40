"""The lab beside the library: what measures, tunes, checks and reports int4lab, and the chapters' helpers.

It imports `int4lab`; `int4lab` never imports it (tests/repo/test_layout.py fails on an import the other way).
Run its tools from the repository root, e.g. `python -m lab.bench`, `python -m lab.report`.

    bench/      the GPU timing harness: kernels beside their peers and the read floor (`python -m lab.bench`);
                pack time of GPTQ beside round-to-nearest (`python -m lab.bench.pack`); scoring forwards through
                the decode kernels and the prefill path (`python -m lab.bench.prefill`)
    tune/       launch-plan sweeps, compiler resource reports, graph-replay determinism
    chapters/   the experiments the chapters narrate (design choices, GPTQ study, calibration, accuracy)
    report.py   README / RESULTS.md tables and chapter 05's figures, from the receipts
    realscale.py  the real-checkpoint path at the published widths, on synthetic checkpoints
    synth.py    synthetic checkpoints with the published configurations
    train.py    trains the small models in data/models/
    llamacpp.py llama.cpp as an outside judge of exported GGUF files
    notebooks.py   executes the chapters (`make notebooks`)
"""
