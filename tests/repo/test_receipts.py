"""Receipts (lab.provenance): each names the repository files its measuring process imported and their hash by
syntax tree, so prose edits stale nothing and code edits stale what imported them. Every receipt is current, no
page cites a stale one, and every receipt's recorded command still parses in this tree."""
import argparse
import fnmatch
import importlib
import json
import re
import shlex
import subprocess

import pytest

from lab.paths import NOTEBOOKS, RECEIPTS, ROOT
from lab.provenance import METHOD, canonical_tree, code_hash, imported_files, is_current, read_receipt, write_receipt
from lab.chapters.history import changed_since
from lab.provenance.git import commit_reader
from lab.provenance.hashing import tree_reader

RECEIPT_FILES = sorted(RECEIPTS.glob("*.json"))          # anchors/ are recordings of others, with PROVENANCE.md
NAME = re.compile(r"[A-Za-z0-9_\-.*{}<>]+\.json")


def _sources(path):
    return read_receipt(path)["provenance"].get("sources") or {}


def _changed(path) -> list[str]:
    """The files of a receipt whose syntax tree differs today from the recorded commit's (or that are gone)."""
    return changed_since(read_receipt(path))


@pytest.mark.parametrize("path", RECEIPT_FILES, ids=lambda p: p.name)
def test_receipt_is_current(path):
    """Re-measure (its command) or remove a receipt whose measured code changed; never annotate it."""
    if is_current(read_receipt(path)):
        return
    try:
        why = _changed(path)
    except (ValueError, subprocess.CalledProcessError):
        why = "its commit is not in this checkout"
    pytest.fail(f"{path.name} is stale: code it measured changed since ({why}). Re-measure it with "
                f"`{read_receipt(path)['provenance']['command']}` or remove it with what cites it")


@pytest.mark.parametrize("path", [p for p in RECEIPT_FILES if "rehashed" in _sources(p)], ids=lambda p: p.name)
def test_rehashed_receipt_matches_its_commit(path):
    """A receipt recorded with the earlier byte hash carries the syntax-tree hash of the same files at its commit."""
    src = _sources(path)
    try:
        read = commit_reader(ROOT, src["rehashed"]["at_commit"])
    except ValueError:
        pytest.skip("the receipt's commit is not in this checkout")
    assert code_hash(src["files"], read) == src["sha256"]


def _page_texts() -> dict[str, str]:
    pages = {p: (ROOT / p).read_text() for p in ("README.md", "RESULTS.md")}
    pages |= {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "notes").glob("*.md"))}
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        pages[str(nb.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells)
    return pages


def _cites(text: str, name: str) -> bool:
    """Whether text names the receipt, by file name or by a pattern that reads it (gate_*.json, llamacpp_{a}.json)."""
    if name in text:
        return True
    globs = {re.sub(r"\{[^}]*\}|<[^>]*>", "*", t) for t in NAME.findall(text)}
    return any("*" in g and len(g.split("*")[0]) >= 4 and fnmatch.fnmatch(name, g) for g in globs)


def test_no_page_cites_a_stale_receipt():
    stale = [p.name for p in RECEIPT_FILES if not is_current(read_receipt(p))]
    cited = {f"{page} cites {name}" for page, text in _page_texts().items() for name in stale if _cites(text, name)}
    assert not cited, "pages citing stale receipts (re-measure or remove them):\n" + "\n".join(sorted(cited))


class _Parsed(Exception):
    pass


def _command_args(command: str):
    """(module or None, script or None, args) of a recorded command: `python -m M ARGS` or `python S.py ARGS`."""
    words = shlex.split(command)
    if len(words) >= 3 and re.fullmatch(r"python3?", words[0]) and words[1] == "-m":
        return words[2], None, words[3:]
    if len(words) >= 2 and re.fullmatch(r"python3?", words[0]) and words[1].endswith(".py"):
        return None, words[1], words[2:]
    return None, None, words


@pytest.mark.parametrize("path", RECEIPT_FILES, ids=lambda p: p.name)
def test_recorded_command_parses_in_this_tree(path, monkeypatch):
    """The receipt's command names a module (or script) of this tree whose argument parser accepts the recorded
    arguments: the parse is intercepted before anything runs."""
    command = read_receipt(path)["provenance"].get("command") or ""
    module, script, args = _command_args(command)
    assert module or script, f"{path.name}: {command!r} is no `python -m MODULE` or `python SCRIPT.py` command"
    if script:
        assert (ROOT / script).is_file(), f"{path.name}: the script {script} is not in the tree"
        return
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin and spec.origin.startswith(str(ROOT)), \
        f"{path.name}: the module {module} is not in the tree"
    entry = importlib.import_module(module + ".cli" if spec.submodule_search_locations and
                                    importlib.util.find_spec(module + ".cli") else module)
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        original(self, argv, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    try:
        entry.main(args)
    except _Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"{path.name}: `{command}` no longer parses (exit {e.code})")
    pytest.fail(f"{path.name}: {module}.main returned without parsing arguments")


def test_hash_ignores_docstrings_and_comments_but_sees_code(tmp_path):
    pkg = tmp_path / "lab"
    pkg.mkdir()
    f = pkg / "m.py"
    f.write_text('"""Module."""\nimport os\n\n\ndef g(x):\n    """Doc."""\n    return x + 1  # one\n')
    files, read = ["lab/m.py"], tree_reader(tmp_path)
    h0 = code_hash(files, read)
    f.write_text('"""Another module docstring."""\nimport os\n\n\ndef g(x):\n    """Other doc,\n    two lines."""\n'
                 '    # why\n    return (x\n            + 1)\n')
    assert code_hash(files, read) == h0                        # docstrings, comments and layout: the same code
    f.write_text('"""Module."""\nimport os\n\n\ndef g(x):\n    """Doc."""\n    return x + 2\n')
    h1 = code_hash(files, read)
    assert h1 != h0                                            # a code edit
    (pkg / "n.py").write_text("y = 1\n")
    assert code_hash(files, read) == h1                        # a file the measurement did not import
    f.rename(pkg / "k.py")
    assert code_hash(files, read) != h1                        # the measured file gone
    assert code_hash(["lab/k.py"], read) != h1                 # the same code under another name


def test_imported_files_are_the_repository_modules():
    files = imported_files(ROOT)
    assert "lab/provenance/hashing.py" in files and "int4lab/__init__.py" in files
    assert all(f.split("/")[0] in ("int4lab", "lab") and f.endswith(".py") for f in files)


def test_written_receipt_is_current_and_names_its_commit(tmp_path):
    path = write_receipt(tmp_path / "r.json", {"x": 1}, command="python -m lab.bench --quick")
    r = read_receipt(path)
    p = r["provenance"]
    assert r["x"] == 1 and p["command"] == "python -m lab.bench --quick" and p["commit"]
    assert p["sources"]["method"] == METHOD and "lab/provenance/receipt.py" in p["sources"]["files"]
    assert is_current(r)


def test_gate_result_is_the_library_s_and_lab_gate_stamps_it(tmp_path, monkeypatch):
    """`python -m int4lab.gate` writes device, versions, date and command, nothing of commits or receipts;
    `python -m lab.gate` writes the same run stamped with the commit and the code it imported."""
    from int4lab.gate import cli as gate_cli
    from lab import gate as lab_gate
    monkeypatch.setattr(gate_cli, "run_gate", lambda *a, **k: {"model": "olmoe"})
    monkeypatch.setattr(gate_cli, "format_table", lambda p: "table")
    assert gate_cli.main(["--model", "olmoe", "--out", str(tmp_path / "a.json")]) == 0
    lib = read_receipt(tmp_path / "a.json")["provenance"]
    assert {"device", "torch", "python", "date", "command"} <= set(lib) and not {"commit", "sources"} & set(lib)
    assert lib["command"].startswith("python -m int4lab.gate --model olmoe")
    assert lab_gate.main(["--model", "olmoe", "--out", str(tmp_path / "b.json")]) == 0
    pub = read_receipt(tmp_path / "b.json")
    assert pub["model"] == "olmoe" and pub["provenance"]["command"].startswith("python -m lab.gate --model olmoe")
    assert "int4lab/gate/cli.py" in pub["provenance"]["sources"]["files"] and pub["provenance"]["commit"]
    assert is_current(pub)
