"""The GPTQ line under a truncated-depth fit says where the depths' sources sat and what share GPTQ swept."""
from lab.report.realscale_fit import all_on_gpu, gptq_swept, gptq_text


def _depths(where="cuda"):
    note = "PASS (GPTQ→RTN fallback: {} of {} experts)"
    return {"2": {"gate": {"source_bytes": {where: 1}, "table": ["rtn  PASS", "gptq " + note.format(227, 256)]}},
            "1": {"gate": {"source_bytes": {"cuda": 1}, "table": ["gptq " + note.format(111, 128)]}},
            "3": {"error": {"error": "AssertionError: parity"}}}


def test_swept_share_and_placement_read_from_the_depths():
    assert gptq_swept(_depths()) == {"1": (17, 128), "2": (29, 256)}
    assert all_on_gpu(_depths()) and not all_on_gpu(_depths("cpu")) and not all_on_gpu({})


def test_the_line_prints_each_fit_with_its_own_points():
    fit = lambda *v: {"points": dict(zip("12", v)), "full_depth": 100.0}                     # noqa: E731
    ex = {"full_layers": 48, "fits": {"gptq_sweep_default_s": fit(5.3, 10.3), "gptq_forward_default_s": fit(0.94, 1.7),
                                      "gpu_peak_bytes": {"full_depth": 2e11}},
          "device_map_cap": {"gpu_cap_bytes": 70 * 2 ** 30, "source_gpu_bytes_full_depth": 6.1e10,
                             "source_exceeds_cap": False}}
    text = gptq_text(ex, _depths(), 8.5e10, lambda f, k: f"{f[k]['full_depth']:.0f} s",
                     lambda b: f"{b / 2 ** 30:.1f} GiB")
    assert "column sweeps 100 s (points by depth: 1 layer 5.3 s; 2 layers 10.3 s)" in text
    assert "calibration forwards 100 s (points: 1 layer 0.94 s; 2 layers 1.7 s)" in text
    assert "the source alone (56.8 GiB fitted) stays under the GPU's `--max-memory` share (70.0 GiB)" in text
    assert "reaches 186.3 GiB against the card's 79.2 GiB" in text and "17 of 128 experts (13 %) at 1 layer" in text
    assert "no host offload" not in gptq_text(ex, _depths("cpu"), 8.5e10, lambda f, k: "x", str)
