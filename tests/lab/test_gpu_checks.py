"""Chapter 03's reader of the GPU check receipts (lab/chapters/gpu_checks.py)."""
import pytest

from lab.chapters import gpu_checks

HEAD = ("# lab/gpu_run.sh, stage checks (TESTS_S=240 SANITIZERS='racecheck initcheck' SANITIZER_S=45), commit "
        + "ab" * 20 + ", NVIDIA H100 80GB HBM3, 580.1, torch 2.11.0, triton 3.6.0, 2026-12-07")


def write(tmp_path, sanitizer_lines, suite_tail):
    (tmp_path / "sanitizer_h100.txt").write_text("\n".join([HEAD, *sanitizer_lines]) + "\n")
    (tmp_path / "cuda_tests_h100.txt").write_text(HEAD + "\n..F.s\n" + suite_tail)


def test_header_fields():
    h = gpu_checks.read_header(HEAD)
    assert h["settings"] == {"TESTS_S": "240", "SANITIZERS": "racecheck initcheck", "SANITIZER_S": "45"}
    assert (h["stage"], h["commit"], h["card"]) == ("checks", "ab" * 20, "NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="not a lab/gpu_run.sh receipt header"):
        gpu_checks.read_header("# something else")


def test_tools_suite_and_a_checkout_without_git(tmp_path):
    write(tmp_path, ["racecheck rc=124 ", "initcheck rc=0 ========= ERROR SUMMARY: 0 errors", "",
                     HEAD, "racecheck rc=124 ", "initcheck rc=0 ========= ERROR SUMMARY: 0 errors"],
          "FAILED tests/a.py::test_x - SystemExit: 143\nSKIPPED [2] tests/b.py:262: why\n"
          "1 failed, 3 passed, 2 skipped in 9.00s\n")
    out = gpu_checks.read_checks("h100", tmp_path, root=tmp_path)
    assert out["tools"] == {"racecheck": {"rc": 124, "summary": None},
                            "initcheck": {"rc": 0, "summary": "========= ERROR SUMMARY: 0 errors"}}
    assert out["not_run"] == ["memcheck", "synccheck"] and out["replay_receipt"] is False
    assert out["suite"]["failed"] == ["tests/a.py::test_x"] and out["suite"]["skipped"] == ["tests/b.py"]
    assert out["suite"]["reasons"] == {"tests/a.py::test_x": "SystemExit: 143"}
    assert out["kernels_same"] is None                      # no git history at that root: cannot tell


def test_a_tool_reported_twice_differently_is_refused(tmp_path):
    write(tmp_path, ["initcheck rc=0 ========= ERROR SUMMARY: 0 errors",
                     "initcheck rc=9 ========= ERROR SUMMARY: 1 error"], "1 passed in 1.00s\n")
    with pytest.raises(ValueError, match="initcheck twice, differently"):
        gpu_checks.read_checks("h100", tmp_path, root=tmp_path)


def test_committed_receipts_read():
    out = gpu_checks.read_checks("h100")
    assert out["sanitizer"]["commit"] == out["suite"]["commit"] and out["tools"]
    assert out["kernels_same"] in (True, False, None)
