"""The tree a reader takes in: every receipt is read or cited by something, the pages name files and commands that
exist, the README stays short and its layout block current."""
import fnmatch
import importlib.util
import re
import subprocess

import pytest

from lab import report
from lab.paths import RECEIPTS, ROOT

PAGES = ("README.md", "RESULTS.md", "notes/kernels.md", "notes/realscale.md")
# A receipt's name in text, or a pattern that reads several: glob("gate_*.json"), f"llamacpp_{a}.json",
# decide_h200_<commit>.json.
NAME = re.compile(r"[A-Za-z0-9_\-.*{}<>]+\.(?:json|txt|csv\.gz)")


def _tracked_text() -> dict[str, str]:
    """{path: text} of the tracked text files outside data/receipts/ (this file excluded)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    texts = {}
    for rel in out.split("\0"):
        path = ROOT / rel
        if not rel or rel.startswith("data/receipts/") or rel == "tests/repo/test_tree.py" or not path.is_file():
            continue
        if path.stat().st_size > 8 * 2**20:
            continue
        try:
            texts[rel] = path.read_text()
        except UnicodeDecodeError:
            continue
    return texts


def _patterns(texts) -> set[str]:
    """Globs over receipt names found in the text: {...} and <...> read as *, at least 4 literal characters first."""
    out = set()
    for text in texts.values():
        for token in NAME.findall(text):
            glob = re.sub(r"\{[^}]*\}|<[^>]*>", "*", token)
            if "*" in glob and len(glob.split("*")[0]) >= 4:
                out.add(glob)
    return out


def test_every_receipt_is_read_or_cited():
    """A receipt that no code, chapter, page or note names (by file name, stem or a pattern that reads it) is
    clutter: delete it (git keeps it) or cite it where its number is used."""
    texts = _tracked_text()
    blob = "\n".join(texts.values())
    patterns = _patterns(texts)
    receipts = sorted(p for p in RECEIPTS.iterdir() if p.is_file())      # anchors/ carries its own PROVENANCE.md
    assert receipts, f"no receipts under {RECEIPTS}"
    orphans = [p.name for p in receipts
               if p.name not in blob and p.name.split(".")[0] not in blob
               and not any(fnmatch.fnmatch(p.name, g) for g in patterns)]
    assert not orphans, f"receipts nothing reads or cites: {orphans}"


def test_receipt_names_carry_no_journal_tags():
    tagged = [p.name for p in RECEIPTS.rglob("*") if p.is_file() and re.search(r"(?:^|_)v\d+[a-z]?(?:_|\.)", p.name)]
    assert not tagged, f"name receipts for what they hold, not by a version tag: {tagged}"


@pytest.mark.parametrize("page", PAGES)
def test_pages_name_files_and_modules_that_exist(page):
    """Backticked paths and receipt names in the pages exist, in the tree or at the commit a `git show COMMIT:PATH`
    on the same page names; every `python -m` module they run can be found."""
    text = (ROOT / page).read_text()
    shown = {}                                          # path -> commit, for files the page reads from git history
    for commit, path in re.findall(r"git show ([0-9a-f]{7,40}):([^`\s]+)", text):
        if subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True).returncode:
            pytest.fail(f"{page}: `git show {commit}:{path}` names no file of that commit")
        shown[path] = commit
    names = {p.rsplit("/", 1)[-1] for p in shown}
    missing = []
    for path in re.findall(r"`((?:int4lab|lab|notes|tests|notebooks|data|figures|scripts)/[^`\s]+?)[`:]", text):
        if not re.search(r"[*<>{}]|…", path) and not (ROOT / path.rstrip("/.,;")).exists() and path not in shown:
            missing.append(path)
    for name in re.findall(r"`([A-Za-z0-9\-.]+_[A-Za-z0-9_\-.]+\.(?:json|txt|csv\.gz))`", text):   # receipt-like
        if not list(RECEIPTS.rglob(name)) and not (ROOT / name).exists() and name not in names:
            missing.append(name)
    for module in re.findall(r"python -m ([A-Za-z_][\w.]*)", text):
        if module not in ("pytest", "pip") and importlib.util.find_spec(module) is None:
            missing.append(f"python -m {module}")
    assert not missing, f"{page} names what does not exist: {missing}"


def test_generated_blocks_are_in_place():
    results = (ROOT / "RESULTS.md").read_text()
    for start, end in ((report.TARGETS_START, report.TARGETS_END), (report.START, report.END),
                       (report.REALSCALE_START, report.REALSCALE_END), (report.RESULTS_START, report.RESULTS_END)):
        assert start in results and end in results, f"RESULTS.md lost the block {start}"
    assert report.MISSES_START in (ROOT / "notes/kernels.md").read_text()
    assert report.LAYOUT_START in (ROOT / "README.md").read_text()


def test_readme_is_short_and_its_layout_current():
    """At most 200 hand-written lines; the layout block lists every folder of report.LAYOUT with sizes within 20 %
    of the checkout's (refresh: python -m lab.report --readme README.md)."""
    text = (ROOT / "README.md").read_text()
    head, rest = text.split(report.LAYOUT_START)
    block, tail = rest.split(report.LAYOUT_END)
    # hand-written: everything outside the generated blocks (<!-- name:start --> ... <!-- name:end -->)
    hand = len(re.sub(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", "", text, flags=re.S).splitlines())
    assert hand <= 200, f"README.md has {hand} hand-written lines (at most 200): tables belong in RESULTS.md"
    sizes = report.folder_sizes()
    rows = block.split("```text\n")[-1].split("```")[0].splitlines()          # one row per LAYOUT folder, in order
    assert len(rows) == len(report.LAYOUT), "README.md's layout block has other folders than report.LAYOUT"
    stale = []
    for (folder, _), row in zip(report.LAYOUT, rows):
        name = "  " * folder.rstrip("/").count("/") + folder.rstrip("/").split("/")[-1] + "/"
        if not row.startswith(name + " "):
            stale.append(f"{folder} missing")
            continue
        got = [int(v.replace(",", "")) for v in re.findall(r"([\d,]+) (?:files|lines)", row)]
        want = [v for v in sizes[folder] if v]
        if len(got) != len(want) or any(abs(g - w) > max(2, 0.2 * w) for g, w in zip(got, want)):
            stale.append(f"{folder} says {got}, the checkout has {want}")
    assert not stale, f"README.md's layout is stale ({stale}): run python -m lab.report --readme README.md"
