"""Stale-receipt guard: a GPU receipt that carries a hash of the kernel sources must have measured these ones."""
import int4lab as il
from int4lab.receipts import KERNEL_SOURCES, kernel_sources_hash

DECODE = il.RECEIPTS / "decode_h200.json"


def test_decode_receipt_measured_the_current_kernel_sources():
    rec = il.read_receipt(DECODE)
    measured = rec["provenance"].get("kernel_sources_sha256")
    assert measured is not None, f"{DECODE.name} carries no kernel_sources_sha256: re-run the bench on a GPU"
    assert measured == kernel_sources_hash(), (
        f"{DECODE.name} measured other kernel sources than {KERNEL_SOURCES}/ holds now (receipt {measured[:12]}, "
        f"tree {kernel_sources_hash()[:12]}): re-run `python -m lab.bench` on a GPU when the kernels change, "
        "then `python -m lab.report --results RESULTS.md --notes notes/kernels.md` and notebook 05")


def test_kernel_sources_hash_sees_every_kernel_file(tmp_path):
    """The hash changes when any kernel file changes, is added, or is renamed; the same files give the same hash."""
    src = tmp_path / KERNEL_SOURCES
    src.mkdir(parents=True)
    (src / "a.py").write_text("x = 1\n")
    h0 = kernel_sources_hash(tmp_path)
    assert kernel_sources_hash(tmp_path) == h0
    (src / "a.py").write_text("x = 2\n")
    h1 = kernel_sources_hash(tmp_path)
    (src / "b.py").write_text("")
    h2 = kernel_sources_hash(tmp_path)
    (src / "b.py").rename(src / "c.py")
    h3 = kernel_sources_hash(tmp_path)
    assert len({h0, h1, h2, h3}) == 4
    (src / "notes.txt").write_text("not code")
    assert kernel_sources_hash(tmp_path) == h3


def test_hashed_receipts_name_a_full_sha256():
    """Every receipt that carries the field carries a well-formed one (a typo would silently never match)."""
    hashes = {p.name: il.read_receipt(p).get("provenance", {}).get("kernel_sources_sha256")
              for p in sorted(il.RECEIPTS.glob("*.json"))}
    hashes = {name: h for name, h in hashes.items() if h is not None}
    assert DECODE.name in hashes
    bad = [name for name, h in hashes.items() if len(h) != 64 or any(c not in "0123456789abcdef" for c in h)]
    assert not bad, f"malformed kernel_sources_sha256 in {bad}"
