"""The chapter-07 checks that read a decode-step receipt: which models' MoE step overlaps its two GEMVs (PDL), and
which eager slopes another case of the same configuration contradicts."""
import copy
import json

import pytest

from lab.chapters import decode_step as ch
from lab.chapters import decode_targets as tg
from lab.paths import RECEIPTS

REC = RECEIPTS / "decode_step_h100.json"
pytestmark = pytest.mark.skipif(not REC.exists(), reason="no decode-step receipt")


@pytest.fixture(scope="module")
def rec():
    return json.loads(REC.read_text())


def test_moe_pdl_by_shape(rec):
    pdl = {m: tg.moe_pdl(rec, a) for m, a in rec["archs"].items()}
    assert all(v in (True, False) for v in pdl.values())
    assert pdl.get("mixtral") is False                      # the widest experts: no overlap launched
    assert any(pdl.values())


def test_moe_pdl_unknown_device(rec):
    other = copy.deepcopy(rec)
    other["provenance"]["device"] = "NVIDIA A100-SXM4-80GB"
    assert all(tg.moe_pdl(other, a) is None for a in other["archs"].values())


def _comparable_rows(rec):
    return [(a, r) for a in rec["archs"].values() for r in a["rows"] if ch.comparable(a, r)]


def test_contradicted_flags_a_slope_below_a_smaller_case(rec):
    pairs = _comparable_rows(rec)
    assert pairs, "the receipt holds comparable eager rows"
    a, row = pairs[0]
    lo, hi = ch.slope_range(row)
    # a copy of the row at a larger case whose slope lies wholly below the original's: contradicts it both ways
    a2 = copy.deepcopy(a)
    big = copy.deepcopy(row)
    big["batch"], big["context"] = row["batch"] * 1000, row["context"] * 1000
    d_lo, d_hi = sorted(big["samples_us"], key=int)[0], sorted(big["samples_us"], key=int)[-1]
    x = max(big["samples_us"][d_lo])                         # every sample at the shallow depth the same, and a
    big["samples_us"][d_lo] = [x] * len(big["samples_us"][d_lo])    # slope of half the original's lowest
    big["samples_us"][d_hi] = [x + lo / 2 * (int(d_hi) - int(d_lo))] * len(big["samples_us"][d_hi])
    a2["rows"].append(big)
    if not ch.comparable(a2, big):
        pytest.skip("the shifted copy is not comparable (its range reached zero or its graphed layer)")
    assert (big["batch"], big["context"]) in [(b, c) for b, c, _, _ in ch.contradicted(a2, row)]
    assert (row["batch"], row["context"]) in [(b, c) for b, c, _, _ in ch.contradicted(a2, big)]


def test_contradicted_leaves_a_consistent_pair(rec):
    a, row = _comparable_rows(rec)[0]
    a2 = copy.deepcopy(a)
    twin = copy.deepcopy(row)
    twin["batch"] = row["batch"] * 1000                      # same samples at a larger case: not contradicted
    a2["rows"].append(twin)
    assert (twin["batch"], twin["context"]) not in [(b, c) for b, c, _, _ in ch.contradicted(a2, row)]


def test_contradicted_empty_for_a_graphed_row(rec):
    a = next(iter(rec["archs"].values()))
    g = next(r for r in a["rows"] if r["run"] != "eager")
    assert ch.contradicted(a, g) == []
