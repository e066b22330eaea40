"""Stale-receipt guard: every current receipt names the kind of sources it measured (int4lab.receipts.SOURCES, the
one declaration), carries their hash, and was made from a clean commit; the hash must equal the tree's."""
import json

import pytest

import int4lab as il
from lab.provenance import SOURCES, STALE, source_files, sources_hash

# The receipts the README, RESULTS.md and the chapters read, by kind: each must match the tree's sources.
CURRENT = {"gate": "gate_*.json", "llamacpp": "llamacpp_*.json", "realscale": "realscale_h*.json",
           "realscale_gate": "realscale_gate_*.json",
           "decode_step": "decode_step_*.json", "prefill": "prefill_*.json"}


def _current():
    from lab.bench.schema import DEFAULT_OUT
    out = [(kind, p) for kind, pat in CURRENT.items() for p in sorted(il.RECEIPTS.glob(pat))]
    return out + [("kernels", DEFAULT_OUT)]


@pytest.mark.parametrize("kind,path", _current(), ids=lambda v: getattr(v, "name", v))
def test_current_receipt_measured_the_tree_it_describes(kind, path):
    prov = json.loads(path.read_text())["provenance"]
    src = prov.get("sources")
    if src is None and path.name in STALE:    # measured before receipts named their sources: the kernel hash
        src = {"kind": "kernels", "sha256": prov.get("kernel_sources_sha256")}
    assert src is not None, (f"{path.name} names no measured sources: regenerate it with the command in its "
                             f"provenance ({prov.get('command')})")
    assert src["kind"] == kind, f"{path.name} measured {src['kind']!r} sources, expected {kind!r}"
    if path.name in STALE:                    # acknowledged, and printed beside its numbers: it must really be stale
        assert src["sha256"] != sources_hash(kind), f"{path.name} is current again: remove it from receipts.STALE"
        assert len(STALE[path.name]) > 40, f"receipts.STALE[{path.name!r}] must say what changed since"
        return
    assert src["sha256"] == sources_hash(kind), (
        f"{path.name} is stale: it measured other {kind} sources than the tree holds ({src['sha256'][:12]} vs "
        f"{sources_hash(kind)[:12]}; files: {list(SOURCES[kind])}). Regenerate it: {prov.get('command')}")
    commit = prov.get("commit", "unknown")
    assert commit != "unknown" and not commit.endswith("+dirty"), \
        f"{path.name} was made from commit {commit!r}: regenerate it at a clean, committed tree"


def test_sources_hash_sees_every_change(tmp_path, monkeypatch):
    """The hash changes when a declared file changes, is added or renamed; other files do not move it."""
    monkeypatch.setitem(SOURCES, "probe", ("pkg/*.py", "lab/x.py"))
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    h0 = sources_hash("probe", tmp_path)
    assert sources_hash("probe", tmp_path) == h0
    (src / "a.py").write_text("x = 2\n")
    h1 = sources_hash("probe", tmp_path)
    (src / "b.py").write_text("")
    h2 = sources_hash("probe", tmp_path)
    (src / "b.py").rename(src / "c.py")
    h3 = sources_hash("probe", tmp_path)
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "x.py").write_text("y = 1\n")
    h4 = sources_hash("probe", tmp_path)
    assert len({h0, h1, h2, h3, h4}) == 5
    (src / "notes.txt").write_text("not code")
    (tmp_path / "lab" / "other.py").write_text("")
    assert sources_hash("probe", tmp_path) == h4


def test_every_declared_pattern_matches_files():
    """A typo in SOURCES would hash nothing and never go stale."""
    for kind, patterns in SOURCES.items():
        for pattern in patterns:
            assert any(il.ROOT.glob(pattern)), f"SOURCES[{kind!r}] pattern {pattern!r} matches no file"
        assert source_files(kind)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="sources must be one of"):
        sources_hash("gates")
