"""Tools for tuning the decode kernels on a GPU, kept apart from the kernels themselves:

    sweep       time launch-plan variants with the bench's timer (`python -m lab.tune.sweep`)
    resources   registers, spills and SASS instruction counts per variant, compiled without a GPU
                (`TRITON_INTERPRET=0 python -m lab.tune.resources`)
    variants    a kernel's source rewritten by asserted substitutions and loaded beside the tree's (the probes)
"""
