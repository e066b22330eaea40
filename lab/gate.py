"""`python -m lab.gate ARGS`: `python -m int4lab.gate ARGS` writing a publishable receipt: the library's result
file with the commit and the code measured (lab.provenance.stamp) in its provenance block, e.g.

    python -m lab.gate --model mixtral --scheme rtn gptq --threads 1 --quiet --out data/receipts/gate_mixtral.json
"""
import sys

from int4lab.gate.cli import main as gate_main

from lab.provenance import stamp


def main(argv=None) -> int:
    return gate_main(argv, stamp=stamp, prog="python -m lab.gate")


if __name__ == "__main__":
    sys.exit(main())
