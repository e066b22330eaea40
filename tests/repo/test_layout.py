"""The layout a reader relies on: `int4lab/` is the library, `lab/` the tooling beside it.

The lab imports the library, never the reverse, and no library module grows past one screenful of a few
hundred lines (a reader takes a module in at once, as in gpt-fast)."""
import ast
import re
from pathlib import Path

from lab import paths

LIBRARY = paths.ROOT / "int4lab"
MAX_LINES = 400


def _imports(path: Path):
    """(line, module) of every import in a file, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = list(path.relative_to(paths.ROOT).with_suffix("").parts)[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = pkg[:len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            yield node.lineno, mod
            if not node.module:
                for a in node.names:
                    yield node.lineno, f"{mod}.{a.name}"


def test_library_never_imports_the_lab():
    bad = [f"{p.relative_to(paths.ROOT)}:{line} imports {mod}" for p in sorted(LIBRARY.rglob("*.py"))
           for line, mod in _imports(p) if mod == "lab" or mod.startswith("lab.")]
    assert not bad, "the library must not import the lab:\n" + "\n".join(bad)


def test_library_knows_nothing_of_receipts():
    """Receipts, their sources hash, the bench's shapes and the figures' folder are the lab's (lab.provenance,
    lab.paths, lab.bench.shapes); the library imports none of them and has no module of that name."""
    gone = {"int4lab.receipts", "int4lab.paths", "int4lab.shapes"}
    bad = [f"{p.relative_to(paths.ROOT)}:{line} imports {mod}" for p in sorted(LIBRARY.rglob("*.py"))
           for line, mod in _imports(p) if mod in gone or re.search(r"(^|\.)(receipts|provenance)(\.|$)", mod)]
    assert not bad, "the library must not know of receipts:\n" + "\n".join(bad)
    assert not [m for m in gone if (paths.ROOT / (m.replace(".", "/") + ".py")).exists()]


def test_import_scan_sees_relative_and_absolute_imports(tmp_path, monkeypatch):
    """The scan above is not vacuous: it resolves `from ..x import` and sees `import lab.y`."""
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    f = tmp_path / "int4lab" / "gate" / "m.py"
    f.parent.mkdir(parents=True)
    f.write_text("from ..format import BLOCK\nimport lab.bench\nfrom . import score\n")
    mods = [m for _, m in _imports(f)]
    assert mods == ["int4lab.format", "lab.bench", "int4lab.gate", "int4lab.gate.score"]


def test_no_library_module_over_the_limit():
    long = {str(p.relative_to(paths.ROOT)): n for p in sorted(LIBRARY.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"library modules over {MAX_LINES} lines (split them by what they hold): {long}"
