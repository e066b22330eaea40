"""The GPTQ line under a truncated-depth fit says where the depths' sources sat and what share GPTQ swept."""
import json
from pathlib import Path

from lab.report.realscale_fit import (all_on_gpu, calib_need, command_text, fitted_time, full_text, gptq_swept,
                                     gptq_text, pack_text, swept_text)


def _depths(where="cuda"):
    note = "PASS (GPTQ→RTN fallback: {} of {} experts)"
    st = {"calib_tokens": 16384}
    return {"2": {"gate": {"source_bytes": {where: 1}, "table": ["rtn  PASS", "gptq " + note.format(227, 256)],
                           "settings": st}},
            "1": {"gate": {"source_bytes": {"cuda": 1}, "table": ["gptq " + note.format(111, 128)], "settings": st}},
            "3": {"error": {"error": "AssertionError: parity"}}}


def test_swept_share_and_placement_read_from_the_depths():
    assert gptq_swept(_depths()) == {"1": (17, 17, 128), "2": (29, 29, 256)}
    d = _depths()
    d["2"]["gate"]["table"].append("gptq draw#1 PASS (GPTQ→RTN fallback: 230 of 256 experts)")
    assert gptq_swept(d)["2"] == (26, 29, 256)                      # each draw its own calibration set
    assert all_on_gpu(_depths()) and not all_on_gpu(_depths("cpu")) and not all_on_gpu({})


def test_the_line_prints_each_fit_with_its_own_points():
    fit = lambda *v: {"points": dict(zip("12", v)), "full_depth": 100.0}                     # noqa: E731
    ex = {"full_layers": 48, "fits": {"gptq_sweep_default_s": fit(5.3, 10.3), "gptq_forward_default_s": fit(0.94, 1.7),
                                      "gpu_peak_bytes": {"full_depth": 2e11},
                                      "default_gate_s": {"points": {"1": 150.0, "2": 180.0, "3": 210.0},
                                                         "full_depth": 100.0}},
          "targets": {"gate_s": {"target": 3600.0}},
          "device_map_cap": {"gpu_cap_bytes": 70 * 2 ** 30, "source_gpu_bytes_full_depth": 6.1e10,
                             "source_exceeds_cap": False}}
    text = gptq_text("qwen3_moe", ex, _depths(), 8.5e10, lambda f, k, *a: f"{f[k]['full_depth']:.0f} s",
                     lambda b: f"{b / 2 ** 30:.1f} GiB")
    assert "column sweeps 100 s (points by depth: 1 layer 5.3 s; 2 layers 10.3 s)" in text
    assert "calibration forwards 100 s (points: 1 layer 0.94 s; 2 layers 1.7 s)" in text
    assert "the source alone (56.8 GiB fitted) stays under the GPU's `--max-memory` share (70.0 GiB)" in text
    assert "reaches 186.3 GiB against the card's 79.2 GiB" in text and "17 of 128 experts (13 %) at 1 layer" in text
    assert "no host offload" not in gptq_text("qwen3_moe", ex, _depths("cpu"), 8.5e10, lambda f, k, *a: "x", str)
    # the README-defaults total leads, its target open where the full depth's placement passes the card
    assert text.startswith("The README's command at its defaults") and "which a full-depth run cannot keep" in text
    assert "With 16,384 calibration tokens per draw" in text and "from 32,768 calibration tokens per draw" in text
    ex["fits"]["gpu_peak_bytes"]["full_depth"] = 1e10
    assert "(target ≤ 3600 s: met)" in gptq_text("qwen3_moe", ex, _depths(), 8.5e10,
                                                   lambda f, k, *a: f"{f[k]['full_depth']:.0f} s", str)
    ex["fits"]["default_gate_s"] = fit(150.0, 180.0)                  # through two depths: nothing tests the line
    assert "undecided, a line through two depths is not tested" in gptq_text(
        "qwen3_moe", ex, _depths(), 8.5e10, lambda f, k, *a: f"{f[k]['full_depth']:.0f} s", str)


def test_calibration_tokens_that_reach_every_expert():
    # K = max(H, I) routed rows per expert; even routing gives each expert tokens x k / E of them
    assert calib_need("mixtral") == (14336, 57344) and calib_need("qwen3_moe") == (2048, 32768)
    assert calib_need("olmoe") == (2048, 16384)


def test_full_depth_targets_line():
    g = {"timing": {"forward_s": 100.0, "calibration_forward_s": 20.0}, "settings": {"calib_tokens": 16384},
         "build_s_by_kind": {"rtn": 1.0, "lottery": 19.2}, "arms_by_kind": {"rtn": 2, "lottery": 32},
         "table": ["gptq PASS (GPTQ→RTN fallback: 700 of 1024 experts)"]}
    a = {"full": {"gate_s": 300.0, "phases": {"gptq_sweep_s": 80.0}, "arms": {"rtn": 2, "lottery": 32, "gptq": 6},
                  "gate_over_forwards": 2.5}, "depths": {"16": {"gate": g}}}
    r = {"settings": {"targets": {"gate_s": {"olmoe": 600.0}, "gate_over_forwards": 1.5}}}
    t = full_text("olmoe", a, r)
    assert "the gate 300 s against ≤ 600 s: met" in t and "300 − 120 − 80 = 100 s against the forwards' own 120 s: met" in t
    assert "16 lottery tickets per round-to-nearest arm" in t and "is 2.50 (`TARGET_RATIO` 1.5" in t and "missed" in t
    assert "324 of 1024 experts (32 %)" in t
    assert "a ticket's build (source copy and pack) 0.600 s per arm against round-to-nearest's 0.500 s (1.20×)" in t


def test_a_fit_at_another_calibration_size_says_so():
    d = _depths()
    for L in ("1", "2"):
        d[L]["gate"]["settings"] = {"calib_tokens": 65536}
        d[L]["gate"]["table"] = [f"gptq PASS (GPTQ→RTN fallback: 0 of {128 * int(L)} experts)"]
    text = swept_text("qwen3_moe", d)
    assert "65,536 calibration tokens per draw (not the README's default)" in text
    assert "every expert, so the sweeps' times are GPTQ's for all experts" in text and "fell back" not in text
    assert command_text(d) == " with `--calib-tokens 65536`" and command_text(_depths()) == ""


def test_the_ticket_pack_line():
    row = lambda impl, s: {"N": 14336, "K": 4096, "impl": impl, "seconds": s}     # noqa: E731
    r = {"rows": [row("rtn", 0.002), row("rtn_dithered", 0.0026)], "config": {"repeats": 101}}
    t = pack_text(Path("pack_h100.json"), r, "H100")
    assert "14336×4096: 2.600 against 2.000 ms (1.30×, met)" in t and "median of 101 calls" in t
    r["rows"][1]["seconds"] = 0.0031
    assert "(1.55×, missed)" in pack_text(Path("pack_h100.json"), r, "H100")


def test_a_time_whose_part_is_off_the_line_is_undecided():
    # gate and build contain GPTQ's calibration forwards: a part off the line leaves them open, however straight
    # their own points are (the line's figure shown beside it, a negative one never)
    on = {"fixed": 9.0, "per_layer": 8.7, "full_depth": 286.0}
    fits = {"gate_s": on, "build_s": {**on, "full_depth": 250.0}, "score_s": on, "forward_s": on,
            "calibration_forward_s": {"fixed": -3.2, "per_layer": 3.6, "full_depth": 112.0}}
    assert fitted_time(fits, "gate_s") == ("undecided (contains `calibration_forward_s`, which the line does not "
                                           "describe: a negative slope or fixed part; the line through its own "
                                           "points gives 286 s)")
    assert "gives 250 s" in fitted_time(fits, "build_s") and fitted_time(fits, "score_s") is None
    fits["calibration_forward_s"] = on
    assert fitted_time(fits, "gate_s") is None and fitted_time(fits, "build_s") is None
    fits["gate_s"] = {"fixed": 40.0, "per_layer": -2.0, "full_depth": -56.0, "warning": "per_layer < 0"}
    fits["forward_s"] = {"fixed": -1.0, "per_layer": 1.0, "full_depth": 47.0}
    got = fitted_time(fits, "gate_s")
    assert got == "undecided (the line does not describe `gate_s`, `forward_s`: a negative slope or fixed part)"
    assert fitted_time(fits, "score_s").startswith("undecided (contains `forward_s`")


def test_gptq_over_every_expert_predicted_from_the_swept_rate():
    from lab.report.realscale_fit import gptq_rate_text, one_depth, one_depth_text
    g = {"settings": {"calib_tokens": 65536, "calib_len": 32768}, "arms_by_kind": {"gptq": 2}, "gptq_sweep_s": 12.0,
         "source_bytes": {"cuda": 1}, "table": ["gptq PASS (GPTQ→RTN fallback: 5 of 8 experts)"]}
    depths = {"1": {"gate": g, "defaults": {"gptq": {"arms": 6}}}, "2": {"skipped": "predicted 107 s, 70 s left"}}
    t = gptq_rate_text("mixtral", depths)
    # no log beside the receipt: a batched sweep's cost is not proportional to its experts, so no prediction
    assert "in batches" in t and "no prediction for every expert" in t and "s an expert" not in t
    g["table"] = ["gptq PASS (GPTQ→RTN fallback: 8 of 8 experts)"]
    assert gptq_rate_text("mixtral", depths) == ""                      # nothing swept: no rate
    a = {"depths": depths, "extrapolation": {"fits": {"gate_s": {"fit": "one depth: fixed taken as 0"}}}}
    assert one_depth(a) and not one_depth({"extrapolation": {"fits": {"gate_s": {"fit": "least squares"}}}})
    text = one_depth_text("mixtral", a)
    assert text.startswith("One depth measured (2 layers skipped: predicted 107 s, 70 s left)")
    assert "it ran with `--calib-tokens 65536`" in text and "of which a draw holds" not in text   # 2 whole windows


def test_a_line_through_two_depths_tests_nothing():
    from lab.report.realscale_fit import off_line, two_depths
    two = {"points": {"1": 2.07, "2": 4.18}, "fixed": -0.04, "per_layer": 2.11}
    three = {"points": {"1": 1.0, "2": 2.4, "3": 8.4}, "fixed": -3.2, "per_layer": 3.7}
    assert two_depths(two) and not off_line(two)            # a tiny negative fixed part through two points: no verdict
    assert off_line(three) and not two_depths(three)
    assert off_line({**two, "warning": "per_layer < 0"})     # a falling slope is off the line at any depth count


def test_a_fit_with_min_rows_lowered_sweeps_every_expert():
    d = _depths()
    for L in ("1", "2"):
        d[L]["gate"].update(settings={"calib_tokens": 16384, "min_rows": 1}, arms_by_kind={"gptq": 2},
                            table=["gptq PASS"])
    assert command_text(d) == " with `--min-rows 1`"
    t = swept_text("mixtral", d)
    assert "With `--min-rows 1` and 16,384 calibration tokens per draw" in t and "GPTQ swept every expert" in t
    assert "K = 14336 inputs" in t
    d["1"]["gate"]["settings"]["calib_tokens"] = 65536
    assert command_text(d) == " with `--calib-tokens 65536` and `--min-rows 1`"
    d["1"]["gate"]["settings"] = {"calib_tokens": 16384, "min_rows": "K (max(H, I))"}   # the default's record
    assert command_text(d) == "" and swept_text("mixtral", d) == ""
    d["1"]["gate"]["settings"] = {"calib_tokens": 16384, "min_rows": 1}
    d["1"]["gate"]["table"] = ["gptq PASS (GPTQ→RTN fallback: 1 of 8 experts)"]
    t = swept_text("mixtral", d)
    assert "7 of 8 experts" in t and "the rest had no routed calibration row at all" in t and "K = 14336" not in t


def test_a_log_beside_the_receipt_splits_gptq_by_kind(tmp_path):
    # the stage log's build lines: a warm-up gate's arms are left out, the measured gate's GPTQ arms are split into
    # experts-only (the rate) and experts+attn (their extra over the experts-only arm of the same draw: attention)
    from lab.report.realscale_fit import gptq_rate_text, log_split
    from lab.report.runlog import measured_builds
    log = tmp_path / "realscale_gate_full_olmoe_h100.log"
    log.write_text("built gptq/experts/W4A8 draw#0 in 9.0 s (quantise 9.0 s)\n"
                   "olmoe 16 layers: warm-up gate 57.6 s (not measured)\n"
                   "built rtn/experts/W4A8 in 0.8 s (quantise 0.3 s)\n"
                   "built gptq/experts/W4A8 draw#0 in 8.4 s (quantise 8.0 s)\n"
                   "built gptq/experts/W4A8 draw#1 in 8.0 s (quantise 6.0 s)\n"
                   "built gptq/experts+attn/W4A8 draw#0 in 22.5 s (quantise 20.0 s)\n"
                   "built gptq/experts+attn/W4A8 draw#1 in 26.6 s (quantise 26.0 s)\n"
                   "[16:03:22 + 343.2s] olmoe 16 layers: gate 300.0 s, GPU peak 72.8 GiB, gate / forwards 2.16\n")
    builds = measured_builds(log.read_text())["olmoe"]["16"]
    assert len(builds) == 5 and ("gptq/experts/W4A8 draw#0", 8.0) in builds
    assert log_split(builds) == ([8.0, 6.0], {"draw#0": 12.0, "draw#1": 20.0})
    row = "gptq/experts+attn/W4A8 draw#{} test PASS (GPTQ→RTN fallback: {} of 1024 experts)"
    g = {"s": 300.0, "arms_by_kind": {"gptq": 4}, "gptq_sweep_s": 60.0, "gptq_forward_s": 8.0,
         "table": [row.format(0, 774), row.format(1, 774)]}
    depths = {"16": {"gate": g, "defaults": {"gptq": {"arms": 4}}}}
    t = gptq_rate_text("olmoe", depths, log)
    # 7 s mean over 250 swept = 0.028 s an expert; 1024 experts: 28.7 s an arm, 115 s for 4; + 32 s of attention
    assert "the 2 experts-only GPTQ arms quantised in 7 s each (mean)" in t and "= 0.028 s an expert" in t
    assert "an upper bound for its sweep" in t and "taken for the experts-only arms of the same draws" in t
    assert "took 12, 20 s more than the experts-only arm of the same draw" in t
    assert "115 s for the README's 4 GPTQ arms, plus attention's 32 s: 147 s" in t
    # the gate at the published depth with GPTQ's measured quantising (60 s) replaced by the prediction
    assert "in place of the 60 s the log's GPTQ arms took, a gate of about 387 s" in t
    # no log, or one whose GPTQ arms are not the receipt's: the sweeps' rule, which names the attention it holds
    for other in (None, tmp_path / "absent.log"):
        t = gptq_rate_text("olmoe", depths, other)
        assert "no prediction for every expert" in t and "s an expert" not in t
    (tmp_path / "realscale_gate_olmoe_allexperts_h100.json").write_text("{}")
    assert "`data/receipts/realscale_gate_olmoe_allexperts_h100.json` measures it" in gptq_rate_text(
        "olmoe", depths, tmp_path / "absent.log")
    g["arms_by_kind"]["gptq"] = 6
    assert "build lines" not in gptq_rate_text("olmoe", depths, log)


def test_depths_that_grow_faster_than_a_line_bound_the_full_depth_from_below():
    from lab.report.realscale_fit import step_lines
    fit = {"points": {"1": 166.0, "2": 291.0, "3": 507.0}}
    # steps of 125 and 216 s a layer: lines through (1, 2) and (2, 3) carried to 32 layers
    assert [round(v) for v in step_lines(fit, 32)] == [4041, 6771]
    assert step_lines({"points": {"1": 166.0, "2": 291.0, "3": 380.0}}, 32) == []     # a step shrinks: no bound
    assert step_lines({"points": {"1": 166.0, "2": 291.0}}, 32) == []                  # two depths test nothing
    ex = {"full_layers": 32, "fits": {"default_gate_s": {**fit, "fixed": -19.5, "per_layer": 170.3},
                                      "gptq_sweep_default_s": {"points": {"1": 63.0, "2": 131.0, "3": 304.0},
                                                               "fixed": -75.0, "per_layer": 120.6}},
          "targets": {"gate_s": {"target": 3600.0}}}
    text = gptq_text("mixtral", ex, _depths(), 8.5e10, lambda f, k, *a: "undecided", str)
    assert "every line through two neighbouring depths passes the target, 4041-6771 s: missed if no later" in text
    assert "sweeps undecided (points by depth: 1 layer 63 s; 2 layers 131 s; 3 layers 304 s; each step larger" in text
    ex["targets"]["gate_s"]["target"] = 5000.0
    assert "(target ≤ 5000 s: undecided)" in gptq_text("mixtral", ex, _depths(), 8.5e10,
                                                        lambda f, k, *a: "undecided", str)


def test_each_fit_off_the_line_is_named_under_its_own_reason():
    # a negative slope; a negative fixed part from steps that grow; a negative fixed part whose steps do not grow
    from lab.report.realscale_fit import off_reasons
    fits = {"synth_s": {"points": {"1": 13.1, "2": 7.1, "3": 11.9}, "fixed": 12.0, "per_layer": -0.63,
                        "warning": "per_layer < 0"},
            "gate_s": {"points": {"1": 37.0, "2": 67.1, "3": 130.7}, "fixed": -15.4, "per_layer": 46.8},
            "load_source_s": {"points": {"1": 0.726, "2": 1.655, "3": 2.307}, "fixed": -0.0182, "per_layer": 0.790},
            "score_s": {"points": {"1": 1.7, "2": 2.6, "3": 3.4}, "fixed": 0.88, "per_layer": 0.84},
            "two": {"points": {"1": 2.07, "2": 4.18}, "fixed": -0.04, "per_layer": 2.11}}
    t = off_reasons(fits)
    assert "with a negative slope (a deeper run measured less): `synth_s`;" in t
    assert "each step per layer larger than the last (the depths grow faster than the line): `gate_s`;" in t
    assert "whose steps do not grow, so no faster growth stands behind it" in t
    assert "`load_source_s` (fixed -0.0182 s against 0.79 s a layer)" in t
    assert "score_s" not in t and "`two`" not in t                # on the line, or through two depths: not named
    assert off_reasons({"score_s": fits["score_s"]}) == ""


def test_an_estimated_floor_is_set_beside_the_floors_measured(tmp_path):
    # the README-defaults total's floor part, estimated where the depths ran --no-floor, against the estimate that
    # `default_seconds` gives a run that measured its floor (the same formula on that run's own arms and texts)
    from lab.report.realscale_fit import floor_text, measured_floors
    est = {"floor_s": 0.3, "formulas": {"floor_s": "estimated: 1e-05 s per pass-token x 2 passes x 1000 / 16 tokens"}}
    depths = {"1": {"gate": {"s": 9.0}, "defaults": {"seconds": {**est, "floor_s": 0.25}}},
              "2": {"gate": {"s": 9.0}, "defaults": {"seconds": est}}}
    assert "(0.25-0.3 s at the measured depths)" in floor_text(depths)
    assert "no receipt here measured a floor" in floor_text(depths)
    g = {"timing": {"score_s": 44.0, "floor_s": 3.0, "bootstrap_s": 1.0, "load_source_s": 1.0, "parity_s": 0.0},
         "texts": {"test": {"tokens": 1000, "docs": 20}, "ood": {"tokens": 1000, "docs": 20}}, "groups": [3, 1],
         "arms": 4, "arms_by_kind": {"rtn": 1, "lottery": 2, "gptq": 1},
         "build_s_by_kind": {"rtn": 1.0, "lottery": 2.0, "gptq": 5.0}}
    (tmp_path / "realscale_gate_full_olmoe_h100.json").write_text(json.dumps(
        {"archs": {"olmoe": {"depths": {"16": {"gate": g}}}}}))
    # 44 s over 6 passes of 2000 tokens; the estimate: 2 passes over 2000 / 16 tokens at that cost = 0.917 s
    (name, measured, e), = measured_floors(tmp_path)
    assert name == "realscale_gate_full_olmoe_h100.json" and measured == 3.0 and round(e, 3) == 0.917
    t = floor_text(depths, tmp_path)
    assert "the floor measured in `realscale_gate_full_olmoe_h100.json` took 3× that estimate for its own run" in t
    assert "float32 copy of the source" in t
    depths["2"]["defaults"]["seconds"] = {"floor_s": 2.0, "formulas": {"floor_s": "2 s x 1000 / 100 tokens"}}
    del depths["1"]["defaults"]
    assert floor_text(depths, tmp_path) == ""                     # every depth measured its floor: nothing to say


def test_the_batched_sweep_names_where_its_budget_is_set():
    from lab.report.realscale_fit import gptq_rate_text
    g = {"settings": {"calib_tokens": 16384}, "arms_by_kind": {"gptq": 2}, "gptq_sweep_s": 12.0,
         "table": ["gptq PASS (GPTQ→RTN fallback: 5 of 8 experts)"]}
    t = gptq_rate_text("mixtral", {"1": {"gate": g, "defaults": {"gptq": {"arms": 6}}}})
    assert "`budget_bytes` in `int4lab/quantize/placement.py`" in t and "need not grow in proportion" in t
    from int4lab.quantize.placement import budget_bytes
    assert "a quarter of the free GPU memory, at most 16 GiB" in budget_bytes.__doc__


def test_the_full_depth_stage_writes_the_log_name_the_report_reads():
    # the report reads a full-depth receipt's log as the receipt's path with .log (lab/report/pages.py)
    sh = (Path(__file__).resolve().parents[2] / "lab" / "gpu_run.sh").read_text()
    stage = sh[sh.index("if has gate_full"):sh.index("if has gate_fit")]
    assert '--out "$full.json"' in stage and 'tee -a "$full.log"' in stage and ".gate.txt" not in sh
