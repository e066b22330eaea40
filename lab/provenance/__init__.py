"""Provenance of the lab's receipts: the commit (git.py), the hash of the code measured (hashing.py), the receipt
written with both (receipt.py), and receipts recorded before that hash existed, re-hashed at their commit
(legacy.py)."""
from .git import git_commit
from .hashing import METHOD, canonical_tree, code_hash, imported_files
from .receipt import (is_current, kernel_sources_hash, measured_sources, portable_command, provenance,
                      read_receipt, stamp, write_receipt)

__all__ = ["METHOD", "canonical_tree", "code_hash", "git_commit", "imported_files", "is_current",
           "kernel_sources_hash", "measured_sources", "portable_command", "provenance", "read_receipt", "stamp",
           "write_receipt"]
