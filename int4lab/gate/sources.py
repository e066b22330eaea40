"""Where the gate's documents come from: the shipped corpus, a user's files, or a `datasets` split.

A source is named by one string (`--texts` takes several, `--calib-text` one):
- "test" or "ood": the shipped corpus splits, cut into documents of about 4096 characters (at least 4094 but the
  last; `texts.documents`);
- PATH.txt: UTF-8 plain text, one document per run of lines, documents separated by blank lines;
- PATH.jsonl: UTF-8 JSON Lines, one object per non-blank line, its "text" field one document;
- hf:NAME:SPLIT, hf:NAME:CONFIG:SPLIT or hf:NAME:CONFIG:SPLIT:FIELD (an empty CONFIG, hf:NAME::SPLIT:FIELD,
  means none): a split of a hub dataset through `datasets.load_dataset`, one document per row's FIELD
  (default "text"); needs the datasets package and the hub (or its cache).
Any other file extension is refused. Documents that are empty after stripping whitespace are dropped.

Each source records the sha256 of what was read (the file's bytes; for the corpus the split's UTF-8 text; for
a dataset the documents as UTF-8 JSON), so a receipt names the exact text it scored. A file that is missing,
unreadable, not UTF-8 or empty is refused with a ValueError naming the flag and the file, before any model loads.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..corpus import load_split
from .settings import MIN_DOCS
from .texts import TEXTS, documents

FILE_KINDS = {".txt": "txt", ".jsonl": "jsonl"}
HF_FORM = "hf:NAME:SPLIT, hf:NAME:CONFIG:SPLIT or hf:NAME:CONFIG:SPLIT:FIELD"


@dataclass(frozen=True)
class TextSource:
    name: str                  # the key of this text in the receipt
    spec: str                  # as given on the command line
    kind: str                  # "corpus", "txt", "jsonl" or "hf"
    docs: tuple
    sha256: str
    bytes: int

    def describe(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "documents": len(self.docs), "sha256": self.sha256,
                "bytes": self.bytes}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _read(path: Path, flag: str) -> tuple[str, bytes]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{flag}: cannot read {str(path)!r}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag}: {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not text.strip():
        raise ValueError(f"{flag}: {str(path)!r} is empty: it must hold documents")
    return text, raw


def _jsonl_docs(text: str, path: Path, flag: str) -> list[str]:
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag}: {str(path)!r} line {n} is not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f"{flag}: {str(path)!r} line {n} must be an object with a string \"text\" field")
        docs.append(row["text"])
    return docs


def parse_hf(spec: str, flag: str = "--texts") -> tuple[str, str | None, str, str]:
    """(name, config or None, split, field) of an hf: spec (module doc)."""
    parts = spec[3:].split(":")
    if len(parts) == 2:
        parts = [parts[0], "", parts[1], "text"]
    elif len(parts) == 3:
        parts.append("text")
    if len(parts) != 4 or not parts[0] or not parts[2] or not parts[3]:
        raise ValueError(f"{flag}: {spec!r} must read {HF_FORM}")
    return parts[0], parts[1] or None, parts[2], parts[3]


def _hf_docs(spec: str, flag: str) -> list[str]:
    name, config, split, field = parse_hf(spec, flag)
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{flag}: {spec!r} needs the datasets package (pip install datasets); or save the "
                         "documents as a .txt or .jsonl file") from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:                       # unreachable hub, unknown name, config or split
        raise ValueError(f"{flag}: cannot load {spec!r} ({type(e).__name__}: {e}); without the hub, save the "
                         "documents as a .txt or .jsonl file") from None
    if field not in ds.column_names:
        raise ValueError(f"{flag}: {spec!r}: the split has no field {field!r} (fields: {ds.column_names})")
    return [d for d in ds[field] if isinstance(d, str)]


def read_source(spec: str, flag: str = "--texts") -> TextSource:
    """The documents of one source (module doc); ValueError naming flag and the source when it cannot be used."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{flag}: a source must be a non-empty string, got {spec!r}")
    if spec in TEXTS:
        text = load_split(spec).encode("utf-8")
        return TextSource(spec, spec, "corpus", tuple(documents(spec)), _sha(text), len(text))
    if spec.startswith("hf:"):
        docs = [d for d in (x.strip() for x in _hf_docs(spec, flag)) if d]
        blob = json.dumps(docs, ensure_ascii=False).encode("utf-8")
        return TextSource(spec, spec, "hf", tuple(docs), _sha(blob), len(blob))
    path = Path(spec)
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{flag}: texts must be among {TEXTS}, a .txt or .jsonl file, or {HF_FORM}; "
                         f"got {spec!r}")
    text, raw = _read(path, flag)
    docs = re.split(r"\n\s*\n", text) if kind == "txt" else _jsonl_docs(text, path, flag)
    docs = [d.strip() for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"{flag}: {spec!r} is empty: it holds no document with text")
    return TextSource(path.name, spec, kind, tuple(docs), _sha(raw), len(raw))


def read_sources(specs, flag: str = "--texts") -> dict:
    """{name: TextSource} of several sources (TextSource objects pass through); names must be unique."""
    out = {}
    for s in specs:
        src = s if isinstance(s, TextSource) else read_source(s, flag)
        if src.name in out:
            raise ValueError(f"{flag}: two sources are named {src.name!r} ({out[src.name].spec!r} and "
                             f"{src.spec!r}): rename one file")
        out[src.name] = src
    return out


def check_document_count(sources: dict, max_docs: int | None, flag: str = "--texts") -> None:
    """ValueError naming the source and the rule when one keeps fewer than 2 * MIN_DOCS documents after max_docs:
    every text, the shipped corpus or a user's, is split into development and held-out documents (`split.py`),
    each half keeping MIN_DOCS (`settings`)."""
    need = 2 * MIN_DOCS
    for src in sources.values():
        n = len(src.docs) if max_docs is None else min(len(src.docs), max_docs)
        if n < need:
            where = f"text {src.name!r}" if src.kind == "corpus" else f"{src.spec!r}"
            raise ValueError(f"{flag}: {where} has {n} documents, fewer than the {need} a verdict needs ({MIN_DOCS} "
                             "in each of the development and held-out splits; int4lab.gate.settings)"
                             + ("" if src.kind == "corpus" else "; separate documents by blank lines (.txt) or "
                                                                "give one per line (.jsonl)"))
