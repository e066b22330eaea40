"""Development and held-out documents: choose a pack on one half of a text, judge it on the other.

Choosing which pack to ship (a GPTQ draw among several, or round-to-nearest) by the same documents that then
give its verdict selects on the test set: of several packs whose intervals scatter, the one that looks best
is partly the luckiest, and its verdict on those documents is biased in its favour. So each text's documents
are split once, deterministically: the choice reads only the development half, the verdict only the
held-out half.

The split: each document's key is sha256 of the split seed, the text's name and the document's own text; documents
sorted by key, the first floor(n / 2) are development, the rest held-out. It depends on no model and no
score, repeats for the same seed and corpus, and a document keeps its key when others are added or removed.
Each half keeps at least MIN_DOCS documents (`settings`), so a text needs 2 * MIN_DOCS.
"""
from __future__ import annotations

import hashlib

import numpy as np

from .score import PerToken
from .settings import MIN_DOCS

SPLIT_SEED = 0
SPLITS = ("dev", "held_out")

SPLIT_RULE = ("Per text, documents sorted by sha256(seed, text name, document text); the first floor(n / 2) are "
              "the development split, the rest the held-out split. A pack is chosen on development documents only; "
              f"every verdict is read on held-out documents only. Each split holds at least {MIN_DOCS} documents.")
CHOICE_RULE = ("Among round-to-nearest and the calibration draws (not the lottery tickets, which measure rounding "
               "luck), ship the arm whose largest upper 95 % bound of the change against the source, over the texts, "
               "is lowest on the development split (first listed on a tie); its verdict is the held-out one.")


def split_documents(docs: list[str], text: str, seed: int = SPLIT_SEED) -> dict:
    """{"dev": [document index], "held_out": [...]} (ascending) of one text's documents (SPLIT_RULE).
    ValueError when either half would hold fewer than MIN_DOCS documents."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if len(docs) < 2 * MIN_DOCS:
        raise ValueError(f"text {text!r} has {len(docs)} documents: a development / held-out split needs at least "
                         f"{2 * MIN_DOCS} ({MIN_DOCS} per split, int4lab.gate.split)")
    key = [hashlib.sha256(f"{seed}\0{text}\0{d}".encode()).hexdigest() for d in docs]
    order = sorted(range(len(docs)), key=lambda i: (key[i], i))
    h = len(docs) // 2
    return {"dev": sorted(order[:h]), "held_out": sorted(order[h:])}


def restrict(p: PerToken, keep) -> PerToken:
    """The tokens of p whose document is in keep (document indices)."""
    m = np.isin(p.doc, np.asarray(keep))
    return PerToken(p.nll[m], p.kl[m], p.top1[m], p.doc[m])


def choose(dev: dict) -> dict:
    """CHOICE_RULE over dev = {arm name: {text: {"rel": {value, lo, hi}}}} (candidates in order):
    {"chosen", "score": {arm: largest dev upper bound over texts}, "rule"}."""
    if not dev:
        raise ValueError("choose needs at least one candidate arm")
    score = {n: max(c["rel"]["hi"] for c in cis.values()) for n, cis in dev.items()}
    return {"chosen": min(score, key=score.get), "score": score, "rule": CHOICE_RULE}
