"""The GPU checks of a commit, attached to that commit's decode receipt: compute-sanitizer's summary lines, the
graph-replay check and the CUDA suite's outcome, each read from the file `lab/gpu_run.sh` (stage `checks`) wrote.

    python -m lab.bench.checks data/receipts/decode_h100.json --sanitizer OUT/sanitizer_h100.txt \
        --replay OUT/replay_check.json --cuda-tests data/receipts/cuda_tests_h100.txt --cuda-tests-commit SHA

The receipt's own provenance is kept (it measured the kernels); the replay check brings its own, which must name
the same commit and kernel sources. The sanitizer ran in the replay check's call, over the same commit. The CUDA
suite may come from a later commit whose kernel sources git shows equal to the receipt's.
"""
import argparse
import json
import re
import subprocess
from pathlib import Path

from int4lab.files import write_text_atomic

from lab.paths import ROOT
from lab.provenance import read_receipt

KERNEL_SOURCES = "int4lab/kernels"   # the kernel files a bench receipt's kernel_sources_sha256 covers

SANITIZERS = ("memcheck", "racecheck", "synccheck", "initcheck")


def cuda_tests_outcome(text: str) -> dict:
    """pytest -rfE output -> its summary line and the ids of the failed tests (None: no summary line)."""
    summary = [ln.strip("= ") for ln in text.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    failed = re.findall(r"^FAILED (\S+)", text, flags=re.M)
    return {"summary": summary[-1] if summary else None, "failed": failed}


def attach(receipt: Path, sanitizer: Path, replay: Path, cuda_tests: Path, cuda_tests_commit: str) -> dict:
    rec = read_receipt(receipt)
    rep = read_receipt(replay)
    mine, theirs = rec["provenance"], rep["provenance"]
    for key in ("commit", "kernel_sources_sha256", "device"):
        if mine[key] != theirs[key]:
            raise ValueError(f"replay: its {key} {theirs[key]!r} is not the receipt's {mine[key]!r}")
    if cuda_tests_commit != mine["commit"]:      # another commit's suite speaks for these kernels only if they are equal
        same = subprocess.run(["git", "diff", "--quiet", mine["commit"], cuda_tests_commit, "--", KERNEL_SOURCES],
                              cwd=ROOT, capture_output=True)
        if same.returncode != 0:
            raise ValueError(f"cuda_tests_commit: {KERNEL_SOURCES} differ between {cuda_tests_commit[:12]} and the "
                             f"receipt's commit {mine['commit'][:12]} (or git cannot tell)")
    lines = [ln for ln in Path(sanitizer).read_text().splitlines() if ln.split(" ", 1)[0] in SANITIZERS]
    if not lines:
        raise ValueError(f"sanitizer: {sanitizer} holds no line of {SANITIZERS}")
    rec["replay_check"] = rep
    rec["sanitizer"] = lines
    rec["cuda_tests"] = {"file": Path(cuda_tests).name, "commit": cuda_tests_commit,
                         **cuda_tests_outcome(Path(cuda_tests).read_text())}
    rec.pop("sanitizer_note", None)              # an earlier run's prose about its checks: these replace it
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.checks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("receipt", type=Path)
    ap.add_argument("--sanitizer", type=Path, required=True)
    ap.add_argument("--replay", type=Path, required=True)
    ap.add_argument("--cuda-tests", type=Path, required=True)
    ap.add_argument("--cuda-tests-commit", required=True, help="the commit the CUDA suite ran at")
    args = ap.parse_args(argv)
    rec = attach(args.receipt, args.sanitizer, args.replay, args.cuda_tests, args.cuda_tests_commit)
    write_text_atomic(args.receipt, json.dumps(rec, indent=1) + "\n")
    print(f"{args.receipt}: sanitizer {len(rec['sanitizer'])} tools, replay all_pass {rec['replay_check']['all_pass']}, "
          f"CUDA tests: {rec['cuda_tests']['summary']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
