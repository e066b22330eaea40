"""The decode receipt's schema: implementation names, row keys and the validators the bench runs before
writing and the report runs after reading (`DEFAULT_OUT`, the current decode receipt).

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens); MoE rows carry N = I
(one expert's intermediate width), K = H (hidden), layer "moe".

A row: model, layer, N, K, E, topk, rows, impl, us, GBps (required); bytes, p10_us, p90_us, replays, late
(samples the host queued too late for the timer's prefill, bench.timing), copies, rel_err, setup_s, n_active
(MoE) and floor_us / floor_bytes (the read floor of the row's int4-b32 bytes, measured in the same run;
receipts from before the floor lack them) are optional but checked when present.
"""
from __future__ import annotations

import math

from lab.paths import RECEIPTS



def published_decode_receipt(receipts=RECEIPTS):
    """The published decode receipt: decode_<card>.json in `receipts` (the newest card's name sorts last when two
    cards' receipts are there); decode_h100.json when there is none."""
    found = sorted(receipts.glob("decode_h[0-9]00.json"))
    return found[-1] if found else receipts / "decode_h100.json"


DEFAULT_OUT = published_decode_receipt()          # the current decode receipt (its card in the name)

GEMV_IMPLS = ("int4_b32", "w4a16_cutlass", "bf16", "tinygemm", "gemlite", "marlin")
MOE_IMPLS = ("int4_b32_moe", "bf16_loop", "grouped_mm", "int4_b32_grouped")
OURS_MOE = ("int4_b32_moe", "int4_b32_grouped")
IMPLS = GEMV_IMPLS + MOE_IMPLS
# Rows merged in from llama.cpp's CUDA backend, never scheduled by the bench (lab/bench/ggml_peer.py): dense
# MUL_MAT, and ("_moe") a one-token MoE layer's MUL_MAT_IDs; timed by ggml's test-backend-ops perf (eager stream,
# the same weights re-read) or ("_rot") by a harness over ggml that the merge labels with the bench's method
# (rotated copies, CUDA graphs): ggml_peer's fixed label, not a record of the run.
LLAMACPP_IMPLS = tuple(f"llamacpp_{t}{way}{moe}" for t in ("q4_0", "q4_K") for way in ("", "_rot")
                       for moe in ("", "_moe"))
ROW_IMPLS = IMPLS + LLAMACPP_IMPLS

ROW_KEYS = ("model", "layer", "N", "K", "E", "topk", "rows", "impl", "us", "GBps")
_INT_KEYS = ("N", "K", "E", "topk", "rows")


def _positive_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def validate_row(row: dict) -> None:
    """Raise ValueError unless `row` has every schema key with the right type and a sane value."""
    if not isinstance(row, dict):
        raise ValueError(f"row must be a dict, got {type(row).__name__}")
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"row is missing keys {missing}: {row}")
    if row["impl"] not in ROW_IMPLS:
        raise ValueError(f"row impl must be one of {ROW_IMPLS}, got {row['impl']!r}")
    for k in ("model", "layer"):
        if not isinstance(row[k], str) or not row[k]:
            raise ValueError(f"row {k} must be a non-empty string, got {row[k]!r}")
    for k in _INT_KEYS:
        if not _positive_int(row[k]):
            raise ValueError(f"row {k} must be a positive int, got {row[k]!r}")
    for k in ("us", "GBps") + tuple(k for k in ("floor_us",) if k in row):
        if not _positive_number(row[k]):
            raise ValueError(f"row {k} must be a positive finite number, got {row[k]!r}")
    for k in ("floor_bytes", "bytes", "n_active"):
        if k in row and not _positive_int(row[k]):
            raise ValueError(f"row {k} must be a positive int, got {row[k]!r}")
    if "late" in row and not (isinstance(row["late"], int) and not isinstance(row["late"], bool)
                              and 0 <= row["late"] <= row.get("replays", row["late"])):
        raise ValueError(f"row late must be an int in [0, replays], got {row['late']!r}")
    if ("floor_us" in row) != ("floor_bytes" in row):
        raise ValueError(f"row floor_us and floor_bytes come together, got {sorted(set(row) & {'floor_us', 'floor_bytes'})}")


def validate_floor(entry: dict) -> None:
    """Raise ValueError unless `entry` is a read-floor measurement: bytes, us and the winning launch config."""
    if not isinstance(entry, dict) or not _positive_int(entry.get("bytes")) or not _positive_number(entry.get("us")):
        raise ValueError(f"a floor entry needs a positive int 'bytes' and a positive 'us', got {entry!r}")
    if not isinstance(entry.get("cfg"), str) or not entry["cfg"]:
        raise ValueError(f"a floor entry names its launch configuration in 'cfg', got {entry!r}")


def validate_receipt(rec: dict) -> None:
    """Raise ValueError unless `rec` is a decode receipt: provenance, valid rows, a reason for every skip, and
    (when present) a positive copy bandwidth and valid read-floor entries (`floor`, and `launch`: the floor
    kernel over one word, i.e. what one launch costs in a graph)."""
    if not isinstance(rec, dict):
        raise ValueError(f"receipt must be a dict, got {type(rec).__name__}")
    for k in ("provenance", "rows", "skipped"):
        if k not in rec:
            raise ValueError(f"receipt is missing '{k}'")
    if not isinstance(rec["rows"], list):
        raise ValueError("receipt rows must be a list")
    for row in rec["rows"]:
        validate_row(row)
    for s in rec["skipped"]:
        if not isinstance(s, dict) or not s.get("reason"):
            raise ValueError(f"every skipped entry needs a non-empty 'reason', got {s!r}")
    if "copy" in rec:
        gbps = rec["copy"].get("GBps") if isinstance(rec["copy"], dict) else None
        if not _positive_number(gbps):
            raise ValueError(f"receipt copy.GBps must be a positive number, got {gbps!r}")
    for entry in rec.get("floor", []) + ([rec["launch"]] if "launch" in rec else []):
        validate_floor(entry)
