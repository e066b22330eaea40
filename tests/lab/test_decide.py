"""bench.decide: the paired re-measurement that settles targets within the run-to-run spread (statistics and
report wiring on the CPU; the timing itself needs CUDA)."""
import json
import random

import pytest
from test_bench import GGML_SAMPLE, _synthetic_receipt

from int4lab.runinfo import device_name
from lab import report
from lab.bench import decide


def test_median_ci_order_statistics():
    med, lo, hi = decide.median_ci(range(15))
    assert (med, lo, hi) == (7, 3, 11)                 # 1 - 2 P(Bin(15, 1/2) <= 3) = 0.965
    assert decide.median_ci([5, 1, 4, 2, 6, 3]) == (3.5, 1, 6)   # n = 6: the extremes (0.969)
    assert decide.median_ci(range(15), level=0.8)[1:] == (4, 10)  # 0.882 (level 0.9 keeps k = 4: 0.965)
    with pytest.raises(ValueError, match="at least 6"):
        decide.median_ci([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="level"):
        decide.median_ci(range(15), level=1.0)


def test_median_ci_covers_the_median_at_least_95_percent():
    rng = random.Random(1)
    trials, n, hits = 3000, 15, 0
    for _ in range(trials):                            # a skewed distribution: exponential, median ln 2
        _, lo, hi = decide.median_ci([rng.expovariate(1.0) for _ in range(n)])
        hits += lo <= 0.6931471805599453 <= hi
    assert 0.95 <= hits / trials <= 0.98               # nominal 0.965; 3000 trials: sd 0.003


def test_parse_spec_and_its_errors():
    assert decide.parse_spec("gemv:14336x4096") == ("gemv", 14336, 4096)
    assert decide.parse_spec("moe:mixtral:1") == ("moe", "mixtral", 1)
    for bad, rule in (("gemv:14336x4095", "multiple of 32"), ("moe:llama:1", "model must be"),
                      ("moe:qwen3:0", "tokens must be"), ("gemv 14336x4096", "must be 'gemv")):
        with pytest.raises(ValueError, match=rule):
            decide.parse_spec(bad)
    assert decide.ratios_of(("gemv", 64, 64)) == [("int4_b32", "floor")]
    assert decide.ratios_of(("moe", "qwen3", 1)) == [("int4_b32_moe", "floor"), ("bf16_loop", "int4_b32_moe")]
    assert ("grouped_mm", "int4_b32_grouped") in decide.ratios_of(("moe", "qwen3", 8))


def test_decided_needs_the_whole_interval_on_one_side():
    assert decide.decided(1.10, 1.14, 1.15, at_most=True) == "pass"
    assert decide.decided(1.16, 1.20, 1.15, at_most=True) == "miss"
    assert decide.decided(1.14, 1.16, 1.15, at_most=True) == "undecided"
    assert decide.decided(4.02, 4.10, 4.0, at_most=False) == "pass"
    assert decide.decided(3.90, 3.99, 4.0, at_most=False) == "miss"
    with pytest.raises(ValueError, match="lo <= hi"):
        decide.decided(1.2, 1.1, 1.15, True)


def test_combine_pairs_rounds_and_takes_the_hull_of_processes():
    key = ("gemv", 64, 64)
    procs = [{"us": {"int4_b32": [10.0 + 0.1 * i for i in range(8)], "floor": [9.0] * 8}},
             {"us": {"int4_b32": [10.5] * 8, "floor": [9.0 + 0.05 * i for i in range(8)]}}]
    (r,) = decide.combine(key, procs)
    ratios0 = [(10.0 + 0.1 * i) / 9.0 for i in range(8)]
    assert r["processes"][0]["ratios"] == ratios0
    assert r["lo"] == min(p["lo"] for p in r["processes"]) and r["hi"] == max(p["hi"] for p in r["processes"])
    assert r["processes"][0]["lo"] == ratios0[0] and r["processes"][0]["hi"] == ratios0[-1]   # n = 8: k = 1
    assert (r["num"], r["den"]) == ("int4_b32", "floor")


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    for argv, match in ((["--rounds", "5"], "--rounds must be >= 6"), (["--replays", "10"], "--replays"),
                        ([], "spec must be")):
        spec = ["--spec", "gemv:64" if not argv else "gemv:64x64"]
        assert decide.main(spec + argv + ["--out", str(tmp_path / "d.json")]) == 2
        assert match in capsys.readouterr().err


def _decide_receipt(path, kernel_hash, lo, hi, device=None):
    path.write_text(json.dumps({
        "provenance": {"kernel_sources_sha256": kernel_hash, "device": device or device_name()},
        "method": {"rounds": 15, "processes": 3},
        "specs": [{"spec": "gemv:14336x4096", "key": ["gemv", 14336, 4096],
                   "ratios": [{"num": "int4_b32", "den": "floor", "median": (lo + hi) / 2, "lo": lo, "hi": hi}]}]}))
    return path


def test_report_settles_an_undecided_target_with_the_paired_interval(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    rec["provenance"]["kernel_sources_sha256"] = "k1"
    anchors = report.parse_ggml(GGML_SAMPLE)
    big = "14336×4096: int4_b32 ≤ 1.15× read floor"                  # 10 / 9 = 1.111: undecided at 5 %
    status = lambda paired: {c.target: c for c in report.targets(rec, anchors, 0.05, paired)}[big]
    assert status({}).status == "undecided" and not status({}).paired
    inside = report.paired_ratios(rec, [_decide_receipt(tmp_path / "a.json", "k1", 1.105, 1.118)])
    assert status(inside).paired and status(inside).status == "pass" and "paired: 1.111× [1.105, 1.118], 15 rounds x 3 processes x 1 run" in \
        status(inside).measured
    assert status(report.paired_ratios(rec, [_decide_receipt(tmp_path / "b.json", "k1", 1.151, 1.16)])).status == "miss"
    assert status(report.paired_ratios(rec, [_decide_receipt(tmp_path / "c.json", "k1", 1.14, 1.16)])).status \
        == "undecided"
    # another kernel's re-measurement settles nothing; nor does one for a target the receipt already decides
    assert report.paired_ratios(rec, [_decide_receipt(tmp_path / "d.json", "k2", 1.105, 1.118)]) == {}
    # nor does a run on another card, same kernels or not
    rec["provenance"]["device"] = "NVIDIA H100 80GB HBM3"
    assert report.paired_ratios(rec, [_decide_receipt(tmp_path / "e.json", "k1", 1.105, 1.118, "NVIDIA H200")]) == {}
    assert report.paired_ratios(rec, [_decide_receipt(tmp_path / "f.json", "k1", 1.105, 1.118, "NVIDIA H100 PCIe")])
    rec["provenance"]["device"] = device_name()
    assert report.paired_ratios(rec, [tmp_path / "none.json"]) == {}
    miss = "4096×14336: int4_b32 ≤ 1.15× read floor"
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.02, inside)}[miss] == "miss"
    block = report.render(rec, anchors, 0.05, inside)
    assert "1 targets within that spread were re-measured in paired rounds" in block
    assert "re-measured" not in report.render(rec, anchors, 0.05)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="bench.decide times kernels on CUDA")
def test_measure_gives_one_median_per_round_and_item():
    out = decide.measure(("gemv", 256, 512), rounds=6)
    assert set(out["us"]) == {"int4_b32", "floor"} and out["floor_bytes"] > 256 * 512 // 2
    assert all(len(v) == 6 and min(v) > 0 for v in out["us"].values())


def test_runs_that_disagree_leave_the_target_undecided(tmp_path):
    """Two runs of the same kernels pool into the hull of their intervals: one run under the limit and one over
    it decide nothing, whatever each says alone."""
    rec = _synthetic_receipt(tmp_path)
    rec["provenance"]["kernel_sources_sha256"] = "k1"
    anchors = report.parse_ggml(GGML_SAMPLE)
    big = "14336×4096: int4_b32 ≤ 1.15× read floor"
    under = _decide_receipt(tmp_path / "s1.json", "k1", 1.105, 1.118)
    over = _decide_receipt(tmp_path / "s2.json", "k1", 1.152, 1.160)
    paired = report.paired_ratios(rec, [under, over])
    d = paired[("gemv", 14336, 4096, "int4_b32", "floor")]
    assert (d["lo"], d["hi"]) == (1.105, 1.160) and "x 2 runs" in d["n"]
    check = {c.target: c for c in report.targets(rec, anchors, 0.05, paired)}[big]
    assert check.status == "undecided" and "run medians 1.111, 1.156" in check.measured
    agree = report.paired_ratios(rec, [under, _decide_receipt(tmp_path / "s3.json", "k1", 1.10, 1.12)])
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.05, agree)}[big] == "pass"


def test_a_stale_run_can_withhold_a_verdict_but_never_grant_one(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    rec["provenance"]["kernel_sources_sha256"] = "k1"
    anchors = report.parse_ggml(GGML_SAMPLE)
    big = "14336×4096: int4_b32 ≤ 1.15× read floor"
    now = _decide_receipt(tmp_path / "now.json", "k1", 1.105, 1.118)
    status = lambda *paths: {c.target: c for c in report.targets(rec, anchors, 0.05,
                                                                 report.paired_ratios(rec, list(paths)))}[big]
    against = status(now, _decide_receipt(tmp_path / "old_over.json", "k0", 1.152, 1.160))
    assert against.status == "undecided" and "earlier run on other kernel sources read 1.156×" in against.measured
    assert status(now, _decide_receipt(tmp_path / "old_under.json", "k0", 1.10, 1.12)).status == "pass"
    assert status(now, _decide_receipt(tmp_path / "old_across.json", "k0", 1.14, 1.16)).status == "pass"
    assert status(_decide_receipt(tmp_path / "only_old.json", "k0", 1.10, 1.12)).status == "undecided"
