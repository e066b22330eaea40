"""lab.report.generate: the `generate` receipts' block, on synthetic receipts (fresh random rounds): tokens/s per
state, the ratios with their intervals and the receipt's own verdicts, greedy stability, what was not measured
(a mode absent, a skipped row, an error row), and the text without a receipt; and the block's place in the pages."""
import json
import random

import pytest

from lab.bench.decide import median_ci
from lab.report import cli
from lab.report.generate import GENERATE_END, GENERATE_START, generate_text, shown, verdict_rule, verdicts


def _row(tps: list[float]) -> dict:
    return {"depths": {"4": {"tokens_per_s": tps, "tokens_per_s_spread": {
        "median": sorted(tps)[len(tps) // 2], "min": min(tps), "max": max(tps)}}}}


def _ratio(per_round: list[float]) -> dict:
    med, lo, hi = median_ci(per_round)
    return {"4": {"per_round": per_round, "median": med, "lo": lo, "hi": hi, "verdict": verdict_rule(lo, hi)}}


def synthetic(rng: random.Random) -> dict:
    """One architecture at 4 layers: eager with bf16 and int4 rows, int4_fused failing in eager (an error row);
    compiled asked for but skipped by the budget."""
    n = 7
    bf = [rng.uniform(40, 60) for _ in range(n)]
    i4 = [b * rng.uniform(0.5, 0.9) for b in bf]             # every round slower: the interval lies below 1
    eager = {"rows": {"bf16": _row(bf), "int4": _row(i4)}, "rounds": n, "skipped": [],
             "errors": {"int4_fused": {"error": "RuntimeError: synthetic failure", "traceback": []}},
             "stable": {"bf16": True, "int4": False}, "ratios": {"int4/bf16": _ratio([y / x for x, y in zip(bf, i4)])}}
    return {"provenance": {"device": "Synthetic GPU 7", "torch": "9.9.9", "commit": "abcdef0123456789",
                           "date": "2031-01-02T03:04:05+00:00"},
            "kind": "generate", "transformers": "8.8.8", "command": "python -m lab.decode_step.generate --layers 4",
            "settings": {"modes": ["eager", "compiled"], "prompt": 16, "new": 8, "rounds": n, "width": "real"},
            "complete": True,
            "archs": {"mixtral": {"depths": [4], "full_layers": 32, "errors": {},
                                  "skipped": [{"what": "compiled", "why": "budget: 3 s left, 60 needed"}],
                                  "modes": {"eager": eager}}}}


@pytest.fixture
def receipts(tmp_path):
    rec = synthetic(random.Random())
    (tmp_path / "generate_mixtral4_x.json").write_text(json.dumps(rec))
    return tmp_path, rec


def test_table_names_the_receipt_its_provenance_and_each_state(receipts):
    d, rec = receipts
    text = generate_text(d)
    assert "`data/receipts/generate_mixtral4_x.json`" in text
    for part in ("Synthetic GPU 7", "torch 9.9.9", "transformers 8.8.8", "`abcdef012345`", "2031-01-02"):
        assert part in text
    row = next(line for line in text.splitlines() if line.startswith("| mixtral"))
    s = rec["archs"]["mixtral"]["modes"]["eager"]["rows"]["bf16"]["depths"]["4"]["tokens_per_s_spread"]
    assert f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})" in row
    assert "4 of 32" in row and "bf16 same; int4 not the same" in row
    r = rec["archs"]["mixtral"]["modes"]["eager"]["ratios"]["int4/bf16"]["4"]
    assert f"{r['median']:.2f}× ({r['lo']:.2f}–{r['hi']:.2f}), int4 slower" in row
    assert row.split(" | ")[6] == "–" and row.split(" | ")[8] == "–"      # int4_fused: no row, no ratio


def test_what_was_not_measured_is_listed(receipts):
    text = generate_text(receipts[0])
    assert "compiled: not in the receipt (budget: 3 s left, 60 needed)" in text
    assert "eager int4_fused2: error: RuntimeError: synthetic failure" in text


def test_a_mode_not_asked_reads_not_run(tmp_path):
    rec = synthetic(random.Random())
    rec["settings"]["modes"], rec["archs"]["mixtral"]["skipped"] = ["eager"], []
    (tmp_path / "generate_a_b.json").write_text(json.dumps(rec))
    assert "mixtral, not measured: compiled: not run; eager int4_fused2: error" in generate_text(tmp_path)


def test_fuse_decode_default_state_is_shown_as_int4_fused2(tmp_path):
    """The receipts' `int4_fused` is `fuse_decode(model)` with its defaults, which the decode-step benchmark calls
    int4_fused2: the block names it so in the headers, the ratios, the stability column and the legend, never as
    the bare receipt name."""
    import re
    rng = random.Random()
    rec = synthetic(rng)
    eager = rec["archs"]["mixtral"]["modes"]["eager"]
    bf = eager["rows"]["bf16"]["depths"]["4"]["tokens_per_s"]
    fu = [b * rng.uniform(1.1, 1.5) for b in bf]
    eager["rows"]["int4_fused"], eager["stable"]["int4_fused"] = _row(fu), True
    eager["ratios"]["int4_fused/bf16"], eager["errors"] = _ratio([y / x for x, y in zip(bf, fu)]), {}
    (tmp_path / "generate_mixtral4_x.json").write_text(json.dumps(rec))
    text = generate_text(tmp_path)
    head = next(line for line in text.splitlines() if line.startswith("| model"))
    assert "tokens/s int4_fused2" in head and "int4_fused2 / bf16" in head
    row = next(line for line in text.splitlines() if line.startswith("| mixtral"))
    assert row.split(" | ")[6] != "–" and "int4_fused2 same" in row
    assert "`fuse_decode(model)` with its defaults (`attention=True, add_norm=True`)" in text
    assert not re.search(r"\bint4_fused\b(?!`)", text.replace("`int4_fused`", ""))     # only quoted as the receipt's
    assert shown("int4_fused/bf16") == "int4_fused2/bf16" and shown("int4_fused2") == "int4_fused2"
    assert shown("int4/bf16") == "int4/bf16"
    from lab.chapters import decode_targets as tg
    why = tg.status(tg.generate_target("mixtral", tmp_path))          # the chapter's target names it so too
    assert "int4_fused2/bf16" in why and "int4_fused/" not in why


def test_verdicts_are_the_receipts_and_follow_the_rule(receipts):
    v = verdicts(receipts[1])
    assert [(x["arch"], x["depth"], x["mode"], x["ratio"]) for x in v] == [("mixtral", 4, "eager", "int4/bf16")]
    assert v[0]["verdict"] == verdict_rule(v[0]["lo"], v[0]["hi"]) == "int4 slower"
    assert verdict_rule(1.01, 2) == "int4 faster" and verdict_rule(0.9, 1.1) == "undecided"


def test_no_receipt_reads_not_yet_measured(tmp_path):
    assert "not yet measured" in generate_text(tmp_path)


def test_a_broken_receipt_is_a_valueerror_naming_it(tmp_path):
    (tmp_path / "generate_bad_x.json").write_text('{"archs": {"olmoe": {"modes": {"eager": {"rows": 3}}}}}')
    with pytest.raises(ValueError, match="generate_bad_x.json"):
        generate_text(tmp_path)


def test_pages_rewrite_fills_the_block(tmp_path):
    assert (GENERATE_START, GENERATE_END, generate_text) in cli.PAGE_BLOCKS      # every --pages page's block
    page = tmp_path / "page.md"
    page.write_text(f"# A\n\n{GENERATE_START}\nold\n{GENERATE_END}\ntail\n")
    pages = cli.Pages()
    pages.put(page, "--pages", generate_text(tmp_path), GENERATE_START, GENERATE_END)
    assert "not yet measured" in pages.text[page] and "old" not in pages.text[page]
    assert pages.text[page].endswith(f"{GENERATE_END}\ntail\n")


def test_chapter_target_reads_the_receipts(receipts, tmp_path):
    from lab.chapters import decode_targets as tg
    d, _ = receipts
    t = tg.generate_target("mixtral", d)              # eager: its one int4 state decided slower -> missed
    assert t["met"] is False and t["modes"] == {"eager": False} and "compiled: not measured" in t["what"]
    assert tg.status(tg.generate_target("olmoe", d)).startswith("not measured")
    rec = synthetic(random.Random())
    r = rec["archs"]["mixtral"]["modes"]["eager"]["ratios"]["int4/bf16"]["4"]
    r.update(lo=0.9, hi=1.2, verdict="undecided")
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "generate_u_x.json").write_text(json.dumps(rec))
    t = tg.generate_target("mixtral", tmp_path / "u")     # undecided eager, compiled not measured -> undecided
    assert t["met"] is None and tg.status(t).startswith("undecided (eager: int4/bf16 undecided")


def test_a_fused_state_decided_faster_counts_for_the_target(tmp_path):
    """The receipt names a ratio's verdict after its state ("int4_fused faster"): the rule gives that name, and the
    chapter's target counts any int4 state decided faster in both modes as met."""
    from lab.chapters import decode_targets as tg
    assert verdict_rule(1.1, 1.3, "int4_fused/bf16") == "int4_fused faster"
    assert verdict_rule(0.7, 0.9, "int4_fused/bf16") == "int4_fused slower"
    rec = synthetic(random.Random())
    eager = rec["archs"]["mixtral"]["modes"]["eager"]
    eager["ratios"]["int4_fused/bf16"] = {"4": {"median": 1.2, "lo": 1.1, "hi": 1.3, "verdict": "int4_fused faster"}}
    rec["archs"]["mixtral"]["modes"]["compiled"] = json.loads(json.dumps(eager))
    (tmp_path / "generate_f_x.json").write_text(json.dumps(rec))
    t = tg.generate_target("mixtral", tmp_path)
    assert t["modes"] == {"eager": True, "compiled": True} and t["met"] is True
