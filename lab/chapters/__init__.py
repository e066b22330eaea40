"""What the chapters compute, kept out of the notebooks so that each chapter holds the story and the calls:

    format_variants.py  chapter 01: block sizes, Q4_0's signed scale, NF4, paired confidence intervals
    calib.py            chapter 02: activation regimes, per-layer Hessians, output error through H
    gptq_study.py       chapter 02: effective rank, the correlation x skew map, in-sample vs held out
    accuracy.py         chapter 03: each kernel against a float64 reference
    gpu_checks.py       chapter 03: the CUDA suite's and compute-sanitizer's receipts, read
    decode_step.py      chapter 07: the decode-step receipt's tables, bars, breakdown and eager ratios
    decode_targets.py   chapter 07: each target against that receipt, the reason behind it, run-to-run noise
    history.py          chapters 05 and 07: a receipt as an earlier commit holds it
"""
