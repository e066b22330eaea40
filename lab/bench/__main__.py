"""`python -m lab.bench` (the CLI lives in cli.py)."""
import sys

from lab.bench.cli import main

sys.exit(main())
