"""`python -m int4lab.bench` (the CLI lives in cli.py)."""
import sys

from .cli import main

sys.exit(main())
