"""The hash of the code a receipt measured: each source file's syntax tree with docstrings removed (comments are not
in the tree), so editing prose stales nothing and editing code stales every receipt that imported it.

Method "ast-v1": for each file, sorted by its path relative to the repository root, sha256 is fed
'path\\0tree\\0', where tree is `canonical_tree` of the file's source. A file that does not parse is hashed as its
bytes (it was not code the measurement ran).
"""
from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path

METHOD = "ast-v1"
PACKAGES = ("int4lab", "lab")          # the repository's importable code


def _is_docstring(node) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _dump(node) -> str:
    """A node as text: its class and every field that is set, recursively, without line numbers. Unset fields
    (None, []) are left out, so Python versions that add optional fields dump the same tree alike."""
    if isinstance(node, ast.AST):
        parts = []
        for name in node._fields:
            value = getattr(node, name, None)
            if name == "body" or name == "orelse" or name == "finalbody":
                value = [n for n in value if not _is_docstring(n)] if isinstance(value, list) else value
            if value is None or value == []:
                continue
            parts.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(n) for n in node) + "]"
    return f"{type(node).__name__}:{node!r}"


def canonical_tree(source: str | bytes) -> str:
    """`source`'s syntax tree as text, without docstrings, comments, line numbers or formatting.
    Any statement that is only a string constant counts as a docstring: it has no effect."""
    return _dump(ast.parse(source))


def code_hash(files, read) -> str:
    """sha256 (hex) of the files (paths relative to the root, as posix strings) by method "ast-v1";
    read(path) returns a file's bytes, or None for a file that does not exist (hashed as missing)."""
    h = hashlib.sha256()
    for rel in sorted(set(files)):
        data = read(rel)
        if data is None:
            body = b"<missing>"
        else:
            try:
                body = canonical_tree(data).encode()
            except SyntaxError:
                body = b"<bytes>" + data
        h.update(rel.encode() + b"\0" + body + b"\0")
    return h.hexdigest()


def tree_reader(root):
    """read(path) for code_hash over the working tree at `root`."""
    root = Path(root)

    def read(rel):
        p = root / rel
        return p.read_bytes() if p.is_file() else None
    return read


def imported_files(root, modules=None) -> list[str]:
    """The repository's source files among the imported modules (default sys.modules): paths relative to `root`
    of every module file under root/int4lab or root/lab, sorted."""
    root = Path(root).resolve()
    out = set()
    for mod in list((sys.modules if modules is None else modules).values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        p = Path(f).resolve()
        if p.is_relative_to(root) and p.relative_to(root).parts[0] in PACKAGES:
            out.add(p.relative_to(root).as_posix())
    return sorted(out)
