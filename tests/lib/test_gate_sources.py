"""The gate's document sources (int4lab/gate/sources.py): a user's .txt and .jsonl files, hub datasets refused
clearly where they cannot be read, each source's sha256 in the receipt, and a whole CLI run on user files."""
import hashlib
import json
import sys

import pytest

from int4lab import gate
from int4lab.gate import sources as S
from int4lab.gate.settings import MIN_DOCS, check_settings

from test_gate import tiny_lm


def paragraphs(n, chars=300, split="validation"):
    """n short documents cut from a corpus split (text the tiny models' tokenizer knows)."""
    text = " ".join(gate.documents(split)).split()
    return [" ".join(text[i * 60:(i + 1) * 60])[:chars].strip() for i in range(n)]


def write_txt(path, docs):
    path.write_text("\n\n\n".join(d.replace(" ", "\n", 3) for d in docs) + "\n", encoding="utf-8")
    return path


def write_jsonl(path, docs):
    path.write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)) + "\n\n",
                    encoding="utf-8")
    return path


def test_txt_and_jsonl_documents_and_their_sha(tmp_path):
    docs = paragraphs(12)
    t = S.read_source(str(write_txt(tmp_path / "a.txt", docs)))
    j = S.read_source(str(write_jsonl(tmp_path / "b.JSONL", docs)))
    assert [d.replace("\n", " ") for d in t.docs] == docs and list(j.docs) == docs
    assert t.kind == "txt" and j.kind == "jsonl" and (t.name, j.name) == ("a.txt", "b.JSONL")
    assert t.sha256 == hashlib.sha256((tmp_path / "a.txt").read_bytes()).hexdigest()
    assert j.describe() == {"spec": str(tmp_path / "b.JSONL"), "kind": "jsonl", "documents": 12,
                            "sha256": hashlib.sha256((tmp_path / "b.JSONL").read_bytes()).hexdigest(),
                            "bytes": (tmp_path / "b.JSONL").stat().st_size}
    c = S.read_source("ood")
    assert c.kind == "corpus" and list(c.docs) == gate.documents("ood")


def test_bad_files_are_refused_naming_the_file_and_the_rule(tmp_path):
    cases = {
        "missing.txt": (None, "cannot read"),
        "empty.txt": (b"\n \n\n", "is empty"),
        "latin1.txt": ("caf\u00e9 ol\u00e9\n\nna\u00efve".encode("latin-1"), "is not UTF-8 text"),
        "few.txt": ("\n\n".join(paragraphs(MIN_DOCS - 1)).encode(), f"has {MIN_DOCS - 1} documents, fewer than the "
                                                                    f"{2 * MIN_DOCS}"),
        "notjson.jsonl": (b'{"text": "a"}\n{text: b}\n', "line 2 is not JSON"),
        "nofield.jsonl": (b'{"body": "a"}\n', 'line 1 must be an object with a string "text" field'),
        "docs.csv": (b"a,b\n", "a .txt or .jsonl file"),
    }
    for name, (data, msg) in cases.items():
        p = tmp_path / name
        if data is not None:
            p.write_bytes(data)
        with pytest.raises(ValueError, match=msg) as e:
            check_settings(texts=[str(p)])
        assert str(e.value).startswith("--texts: ") and name in str(e.value)
    ok = write_txt(tmp_path / "ok.txt", paragraphs(2 * MIN_DOCS))
    check_settings(texts=[str(ok), "ood"])
    with pytest.raises(ValueError, match="has 9 documents"):
        S.check_document_count(S.read_sources([str(ok)]), 9)      # the first max_docs count
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="two sources are named 'ok.txt'"):
        S.read_sources([str(ok), str(write_txt(tmp_path / "d" / "ok.txt", paragraphs(2 * MIN_DOCS)))])


def test_hf_specs_parse_and_refuse_clearly(monkeypatch):
    assert S.parse_hf("hf:wikitext:wikitext-2-raw-v1:test") == ("wikitext", "wikitext-2-raw-v1", "test", "text")
    assert S.parse_hf("hf:org/set:train") == ("org/set", None, "train", "text")
    assert S.parse_hf("hf:org/set::validation:body") == ("org/set", None, "validation", "body")
    for bad in ("hf:", "hf:name", "hf:a:b:c:d:e", "hf::test"):
        with pytest.raises(ValueError, match="must read hf:NAME:SPLIT"):
            S.parse_hf(bad)
    monkeypatch.setitem(sys.modules, "datasets", None)              # not installed
    with pytest.raises(ValueError, match="needs the datasets package"):
        S.read_source("hf:wikitext:wikitext-2-raw-v1:test")

    class Unreachable:
        @staticmethod
        def load_dataset(*a, **k):
            raise ConnectionError("hub unreachable")
    monkeypatch.setitem(sys.modules, "datasets", Unreachable)
    with pytest.raises(ValueError, match=r"--calib-text: cannot load 'hf:x:test' \(ConnectionError: hub unreachable"):
        S.read_source("hf:x:test", "--calib-text")


def test_hf_rows_become_documents(monkeypatch):
    docs = paragraphs(11)

    class Split:
        column_names = ["body"]

        def __getitem__(self, field):
            return docs + ["  ", None]

    class Datasets:
        @staticmethod
        def load_dataset(name, config, split):
            assert (name, config, split) == ("org/set", None, "test")
            return Split()
    monkeypatch.setitem(sys.modules, "datasets", Datasets)
    src = S.read_source("hf:org/set::test:body")
    assert list(src.docs) == docs and src.kind == "hf" and src.name == "hf:org/set::test:body"
    with pytest.raises(ValueError, match="the split has no field 'text'"):
        S.read_source("hf:org/set:test")


def test_cli_gate_on_user_files(tmp_path, tok, capsys):
    ckpt = tmp_path / "ckpt"
    tiny_lm("olmoe").save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    a = write_txt(tmp_path / "mine.txt", paragraphs(2 * MIN_DOCS, split="test"))
    b = write_jsonl(tmp_path / "more.jsonl", paragraphs(2 * MIN_DOCS + 2, split="ood"))
    cal = write_txt(tmp_path / "calib.txt", paragraphs(40, chars=2000, split="train"))
    out = tmp_path / "r.json"
    rc = gate.main(["--model", str(ckpt), "--texts", str(a), str(b), "--calib-text", str(cal),
                    "--scheme", "rtn", "gptq", "--lottery", "1", "--calib-draws", "1", "--calib-tokens", "256",
                    "--calib-len", "32", "--min-rows", "8", "--window", "32", "--max-docs", "20", "--boot", "200",
                    "--parity-steps", "0", "--no-floor", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    r = json.loads(out.read_text())
    assert list(r["texts"]) == ["mine.txt", "more.jsonl"] and r["settings"]["texts"] == ["mine.txt", "more.jsonl"]
    for name, path in (("mine.txt", a), ("more.jsonl", b)):
        t = r["texts"][name]
        assert t["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert t["docs"] == 2 * MIN_DOCS and t["domain"] == "user"
        sp = r["split"]["texts"][name]                      # user texts are split as the corpus is
        assert len(sp["dev"]) == len(sp["held_out"]) == MIN_DOCS and not set(sp["dev"]) & set(sp["held_out"])
    assert r["settings"]["calib_text"]["sha256"] == hashlib.sha256(cal.read_bytes()).hexdigest()
    assert r["settings"]["calib_split"] is None
    assert {a["kind"] for a in r["arms"].values()} == {"rtn", "lottery", "gptq"}
    assert r["arms"]["gptq/experts/W4A8 draw#0"]["quant_report"]["calib_tokens"] == 256



def test_the_readme_own_documents_command_runs(tmp_path, capsys, monkeypatch):
    """The README's own-documents command, as printed (its files made here), with quick settings appended."""
    import shlex
    from lab.paths import ROOT
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                if ln.startswith("python -m int4lab.gate") and "--texts" in ln and "--calib-text" in ln)
    argv = shlex.split(line)[3:]
    monkeypatch.chdir(tmp_path)
    write_txt(tmp_path / "my_docs.txt", paragraphs(2 * MIN_DOCS, split="test"))
    write_jsonl(tmp_path / "my_docs.jsonl", paragraphs(2 * MIN_DOCS, split="ood"))
    write_txt(tmp_path / "calib.txt", paragraphs(40, chars=2000, split="train"))
    rc = gate.main(argv + ["--lottery", "1", "--calib-draws", "1", "--calib-tokens", "256", "--calib-len", "32",
                           "--min-rows", "8", "--window", "32", "--max-docs", "20", "--boot", "200",
                           "--parity-steps", "0", "--no-floor", "--quiet", "--out", str(tmp_path / "r.json")])
    assert rc == 0, capsys.readouterr().err
    r = json.loads((tmp_path / "r.json").read_text())
    assert list(r["texts"]) == ["my_docs.txt", "my_docs.jsonl"] and r["settings"]["calib_text"]["sha256"]

def test_cli_refuses_bad_sources_before_loading(tmp_path, capsys):
    few = write_txt(tmp_path / "few.txt", paragraphs(3))
    assert gate.main(["--model", "olmoe", "--texts", str(few)]) == 2
    assert f"--texts: {str(few)!r} has 3 documents, fewer than the {2 * MIN_DOCS}" in capsys.readouterr().err
    assert gate.main(["--model", "olmoe", "--calib-text", str(tmp_path / "none.txt"), "--scheme", "gptq"]) == 2
    assert "--calib-text: cannot read" in capsys.readouterr().err
    assert gate.main(["--model", "olmoe", "--calib-text", str(few)]) == 2
    assert "--calib-text: calibration text is read by GPTQ only" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tok():
    from int4lab.models.tokenizer import load_tokenizer
    return load_tokenizer()
