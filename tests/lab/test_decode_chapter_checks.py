"""The chapter-07 checks that read a decode-step receipt: which models' MoE step overlaps its two GEMVs (PDL), which
path and launches the MoE step takes at each batch, which eager slopes another case of the same configuration
contradicts; and the `generate` block's line on the greedy streams its ratios were fed."""
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


def test_moe_path_by_shape(rec):
    """Batch 1 is routed on every model (the two expert GEMVs); at batch 16 a model takes the grouped path exactly
    where its routed rows average at least 2 per expert (on sm_90), five launches in place of two."""
    for m, a in rec["archs"].items():
        one = tg.moe_path(rec, a, 1)
        assert one["path"] == "routed" and one["launches"] == ["gemv_dp4a_kernel"] * 2, m
        p = tg.moe_path(rec, a, 16)
        assert (p["path"] == "grouped") == (p["rows_per_expert"] >= 2), m
        assert p["launches"] == (["route_tiles_kernel", "quant_rows_kernel", "grouped_kernel", "quant_rows_kernel",
                                  "grouped_kernel"] if p["path"] == "grouped" else ["gemv_dp4a_kernel"] * 2), m
    assert tg.moe_path(rec, rec["archs"]["mixtral"], 16)["path"] == "grouped"      # 32 rows over 8 experts


def test_moe_path_unknown_device(rec):
    other = copy.deepcopy(rec)
    other["provenance"]["device"] = "NVIDIA A100-SXM4-80GB"
    assert all(tg.moe_path(other, a, 16) is None for a in other["archs"].values())


def test_generate_streams_line_counts_the_steps_fed_the_same_id():
    """The kept (last-round) streams: two int4 states the same, each fed bf16's id in one of 3 decode steps (a
    4-token call's steps are fed its first 3 tokens), bf16's stream not the same in every round."""
    from lab.report.generate import _streams
    m = {"tokens": {"bf16": [1, 1, 2, 5], "int4": [2, 2, 2, 2], "int4_fused": [2, 2, 2, 2]},
         "stable": {"bf16": False, "int4": True, "int4_fused": True}}
    line = _streams("olmoe", "eager", m)
    assert "int4 and int4_fused2 the same" in line and line.count("in 1 of its 3 decode steps") == 2
    assert "not the same in every round: bf16, whose other rounds' ids are not recorded" in line
    assert _streams("olmoe", "eager", {"tokens": {"int4": [2]}, "stable": {"int4": True}}) is None


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
