"""lab.decode_step: the whole-model decode benchmark, exercised end to end on the CPU at tiny width (graph
capture, the floor kernel and the profiler's device kernels need CUDA; everything else runs here)."""
import json

import pytest
import torch

from lab.decode_step import bench, cli, profile
from lab.decode_step import model as M
from lab.decode_step import step as S


@pytest.fixture(scope="module")
def tiny():
    return M.build("olmoe", 2, "tiny", "cpu", torch.float32)


def test_static_cache_step_gives_generates_tokens(tiny):
    """The benchmark's step (static cache, 4-D mask built from the position tensor) decodes what generate does."""
    prompt = torch.randint(0, 4096, (2, 5))
    with torch.no_grad():
        ref = tiny.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)[:, 6:]
    got = S.greedy(tiny, prompt, 5, graphed=False)
    assert torch.tensor(got).T.tolist() == ref.tolist()


def test_depth_runs_the_first_layers_and_restores(tiny):
    ids = torch.randint(0, 4096, (1, 4))
    with torch.no_grad():
        with M.depth(tiny, 1):
            assert len(tiny.model.layers) == 1 and tiny.config.num_hidden_layers == 1
            one = tiny(ids).logits
        two = tiny(ids).logits
    assert len(tiny.model.layers) == 2 and tiny.config.num_hidden_layers == 2
    assert not torch.equal(one, two)


def test_layer_bytes_count_the_modules_tensors(tiny):
    from int4lab.quantize import quantize_model
    import copy
    q, _ = quantize_model(copy.deepcopy(tiny), "rtn", "experts+attn", progress=False)
    c = tiny.config
    H, I, E, D = c.hidden_size, c.intermediate_size, c.num_experts, c.hidden_size // c.num_attention_heads
    kv = 2 * 3 * c.num_key_value_heads * D * 100 * 4                      # float32 cache, batch 3, 100 positions
    b = M.layer_bytes(q, 3, 100, 5.0)
    int4 = lambda n, k: n * k // 2 + n * k // 32 * 2                      # noqa: E731  packs + fp16 scales
    assert b["attn_proj"] == 4 * int4(H, H)
    assert b["experts"] == 5 * (int4(2 * I, H) + int4(H, I))
    assert b["router"] == E * H * 4 and b["kv_cache"] == kv
    assert b["norms"] == (2 * H + 2 * H) * 4                               # layer norms + OLMoE's q/k norms (H)
    assert b["total"] == sum(b[k] for k in ("attn_proj", "experts", "router", "norms", "kv_cache"))


def test_extrapolation_writes_its_arithmetic():
    r = bench.extrapolate({1: 300.0, 2: 450.0}, 16, 4)
    assert r["per_layer_us"] == 150.0 and r["fixed_us"] == 150.0
    assert r["full_step_us"] == 150.0 + 16 * 150.0
    assert r["tokens_per_s"] == pytest.approx(4e6 / 2550.0)
    assert "150.00 + 16 x 150.00 = 2550.00" in r["formula"]


def test_modules_carry_the_breakdown_categories(tiny):
    cats = {profile.module_category(n, m) for n, m in tiny.named_modules()} - {None}
    assert cats == {"attn_proj", "experts", "router", "attention", "norm", "glue"}
    assert profile.module_category("model.norm", tiny.model.norm) is None           # the final norm is fixed


def test_kernels_take_the_innermost_range_and_map_onto_replays():
    ranges = [("glue", 0, 100), ("attention", 10, 50), ("attn_proj", 12, 20), ("experts", 60, 90)]
    launches = {1: 15, 2: 30, 3: 70, 4: 95, 5: 120}
    kernels = [("gemv", 200, 2.0, 1), ("sdpa", 210, 3.0, 2), ("moe", 220, 5.0, 3), ("add", 230, 1.0, 4),
               ("argmax", 240, 1.0, 5), ("memset", 250, 0.5, 99)]
    got = profile.attribute(ranges, launches, kernels)
    assert [c for _, c, _ in got] == ["attn_proj", "attention", "experts", "glue", "fixed", "unattributed"]
    replay = [(n, d * 2) for n, _, d in got]
    mapped, how = profile.map_categories(got, replay)
    assert how == "position" and [c for _, c, _ in mapped] == [c for _, c, _ in got]
    mapped, how = profile.map_categories(got, replay[:-1][::-1])
    assert how == "name" and dict((n, c) for n, c, _ in mapped)["sdpa"] == "attention"
    one = profile.sums(got)
    two = profile.sums(got + [(n, c, d) for n, c, d in got if c not in ("fixed", "unattributed")])
    pl = profile.per_layer(one, two, step_one_us=20.0, step_two_us=35.0)
    assert pl["attn_proj"] == 2.0 and pl["experts"] == 5.0 and pl["busy"] == 11.0
    assert pl["gaps"] == (35.0 - two["busy"]) - (20.0 - one["busy"]) and pl["step"] == 15.0


def test_cli_runs_end_to_end(tmp_path):
    out = tmp_path / "d.json"
    rc = cli.main(["--arch", "mixtral", "--width", "tiny", "--contexts", "64", "--batches", "1", "2",
                   "--impls", "batched_mm", "--runs", "eager", "compiled", "--compile-backend", "eager",
                   "--greedy-steps", "3", "--prompt", "4", "--eager-steps", "2", "--eager-warmup", "1",
                   "--eager-samples", "1", "--out", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["kind"] == "decode_step" and rec["card"] == cli.card() and "provenance" in rec
    a = rec["archs"]["mixtral"]
    assert not a["errors"], a["errors"]
    got = {(r["state"], r["impl"], r["run"], r["batch"]) for r in a["rows"]}
    assert a["states"] == ["bf16", "int4", "int4_fused", "int4_fused2"]
    for st in a["states"]:
        impl = "batched_mm" if st == "bf16" else None
        assert (st, impl, "eager", 1) in got and (st, impl, "eager", 2) in got
        compiled = {(s, r, b) for s, _, r, b in got if r == "compiled"}       # bf16's: its fastest impl, timed
        assert ((st, "compiled", 1) in compiled) == (st in ("bf16", "int4"))  # --compile-states: bf16 int4
    assert all(set(r["step_us"]) == {"1", "2"} and "formula" in r for r in a["rows"])
    assert a["bytes"]["int4 B1 C64"]["distinct_experts"] == 2.0                  # Mixtral routes top-2
    assert a["bytes"]["int4 B2 C64"]["total"] < a["bytes"]["bf16 B2 C64"]["total"]
    assert len(a["greedy"]["tokens_eager"]) == 3 and a["greedy"]["equal"] is None
    assert set(a["greedy"]["states"]) == {"int4", "int4_fused2"}
    assert set(a["summary"]) == {"B1 C64", "B2 C64"}
    assert "int4_eager_over_default_bf16_eager" in a["summary"]["B1 C64"] or "int4_eager_over_best_bf16_eager" in \
        a["summary"]["B1 C64"]


def test_default_receipt_goes_to_runs_and_keeps_other_archs(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    assert cli.main(["--arch", "olmoe", "--layers", "1"]) == 2                    # bad depths: refused first
    assert not (tmp_path / "runs").exists()

    class Fake:
        def __init__(self, arch, args, save, log, deadline, prior=None):
            self.rec = {"arch": arch, "greedy": {"equal": True}, "prior": prior is not None}

        def run(self):
            return self.rec
    monkeypatch.setattr(bench, "Run", Fake)
    assert cli.main(["--arch", "olmoe"]) == 0
    out = tmp_path / "runs" / f"decode_step_{cli.card()}.json"         # 'cpu' here, 'h100' on an H100
    assert set(json.loads(out.read_text())["archs"]) == {"olmoe"}
    assert cli.main(["--arch", "mixtral"]) == 0                                   # a second call adds its arch
    assert set(json.loads(out.read_text())["archs"]) == {"olmoe", "mixtral"}
    assert cli.main(["--arch", "olmoe"]) == 0                                     # and hands a measured one its past
    assert json.loads(out.read_text())["archs"]["olmoe"]["prior"] is True


def test_a_split_run_keeps_the_earlier_calls_rows():
    args = cli.parser().parse_args(["--width", "tiny"])
    prior = {"width": "tiny", "depths": [1, 2], "rows": [{"state": "bf16", "run": "graphed"}], "greedy": {"x": 1},
             "errors": {"old": 1, "retried": 2}, "skipped": ["compile bf16", "time int4 - compiled B1 C8"]}
    r = bench.Run("olmoe", args, lambda: None, print, 0.0, prior=prior)
    assert r.rec["rows"] == prior["rows"] and r.rec["greedy"] == {"x": 1}
    assert r.rec["errors"] == {"old": 1, "retried": 2} and r.rec["skipped"] == prior["skipped"]  # kept: the receipt
    r.deadline = float("inf")                                                     # says what no call measured
    r.part("retried", lambda: 1)
    r.part("time int4 - compiled B1 C8", lambda: 1)
    assert r.rec["errors"] == {"old": 1} and r.rec["skipped"] == ["compile bf16"]  # a part tried again: its own
    assert prior["skipped"] == ["compile bf16", "time int4 - compiled B1 C8"]     # the prior is not mutated
    other = bench.Run("olmoe", cli.parser().parse_args(["--width", "tiny", "--layers", "1", "3"]), lambda: None,
                      print, 0.0, prior=prior)
    assert other.rec["rows"] == [] and "greedy" not in other.rec                  # other depths: a fresh record


def test_chapter_rules_undecided_eager_and_names_our_kernels():
    """An eager slope whose samples reach zero is undecided; our kernels (no launch record) are named per layer
    with the module range that opens at them."""
    from lab.chapters import decode_step as ch
    row = lambda st, s1, s2: {"state": st, "impl": None, "run": "eager", "batch": 1, "context": 8,  # noqa: E731
                              "samples_us": {"1": s1, "2": s2}, "per_layer_us": min(s2) - min(s1),
                              "fixed_us": 2 * min(s1) - min(s2), "tokens_per_s": 1.0}
    a = {"default_experts_impl": None, "rows": [row("int4", [10.0, 11.0], [20.0, 21.0]),
                                                row("bf16", [10.0, 30.0], [25.0, 26.0])]}
    assert ch.slope_range(a["rows"][0]) == (9.0, 11.0) and ch.fixed_range(a["rows"][0]) == (-1.0, 2.0)
    assert not ch.decided(a["rows"][0]) and "fixed undecided" in ch.row_text(a["rows"][0])
    e = ch.eager_ratio(a, "int4", 1, 8)
    assert e["decided"] is False and ch.eager_text(e).startswith("undecided (spread")
    # a ratio is decided only where both rows are: each slope's and each fixed part's sample range above zero
    a = {"default_experts_impl": "grouped_mm", "rows": [row("int4", [10.0, 11.0], [20.0, 21.0]),
         {**row("bf16", [30.0, 31.0], [50.0, 51.0]), "impl": "grouped_mm"}]}
    e = ch.eager_ratio(a, "int4", 1, 8)
    assert ch.slope_range(a["rows"][0])[0] > 0 and ch.fixed_range(a["rows"][0])[0] < 0 and ch.decided(a["rows"][1])
    assert e["decided"] is False and ch.eager_text(e) == ("undecided (fixed part: int4 from below zero to 2 µs; "
                                                          "bf16 9 to 12 µs)")
    # a fixed range entirely below zero: every 2-layer sample more than twice every 1-layer one, the line fails
    a["rows"][0] = row("int4", [10.0, 11.0], [25.0, 26.0])
    assert ch.line_fails(a["rows"][0]) and not ch.line_fails(a["rows"][1])
    assert "fixed entirely below zero: the 2-layer step's samples (25–26 us) are all more than 2× the 1-layer " \
           "step's (10–11 us), so the two-depth line fails" in ch.row_text(a["rows"][0])
    assert ch.eager_text(ch.eager_ratio(a, "int4", 1, 8)).startswith(
        "undecided (fixed part: int4 entirely below zero (the two-depth line fails); bf16 9 to 12 µs)")
    a = {"default_experts_impl": "grouped_mm", "rows": [row("int4", [30.0, 31.0], [50.0, 51.0]),
         {**row("bf16", [50.0, 51.0], [90.0, 91.0]), "impl": "grouped_mm"},
         {**row("bf16", [30.0, 31.0], [50.0, 51.0]), "impl": "batched_mm"}]}
    # bf16 is the default experts impl, or the fastest eager one, named
    assert ch.eager_ratio(a, "int4", 1, 8)["impl"] == "grouped_mm" and ch.eager_ratio(a, "int4", 1, 8)["value"] == 0.5
    f = ch.eager_ratio(a, "int4", 1, 8, fastest=True)
    assert f["impl"] == "batched_mm" and f["value"] == 1.0 and f["decided"] and f["range"] == (19 / 21, 21 / 19)
    # a lower eager slope whose samples reach zero (here below it) is no candidate for the fastest: the decided one is
    a["rows"][2] = {**row("bf16", [30.0, 31.0], [20.0, 29.0]), "impl": "batched_mm"}
    assert ch.slope_range(a["rows"][2])[0] < 0 and a["rows"][2]["per_layer_us"] < a["rows"][1]["per_layer_us"]
    f = ch.eager_ratio(a, "int4", 1, 8, fastest=True)
    assert f["impl"] == "grouped_mm" and f["decided"] and ch.best_row(a, "bf16", "eager", 1, 8)["impl"] == "grouped_mm"
    from lab.report.pages import eager_bf16_text
    a["summary"] = {"B1 C8": {}}
    a["rows"] = [{**r, "state": "int4_fused2"} if r["state"] == "int4" else r for r in a["rows"]]
    text = eager_bf16_text({"archs": {"olmoe": a}})
    assert "slower eager" not in text and text.endswith("no candidate (it shows no implementation faster): olmoe at "
                                                        "batch 1, context 8 (batched_mm)")
    ks = lambda n: [["gemv_dp4a_kernel", "unattributed", 3.0], ["cat:attn_proj", "unattributed", 3.0],  # noqa: E731
                    ["gemv_dp4a_kernel", "unattributed", 5.0], ["cat:experts", "unattributed", 9.0],
                    ["gemv_dp4a_kernel", "unattributed", 4.0], ["glue_op", "glue", 1.0]] * n
    bd = {"state": "s", "per_layer_us": {}, "depths": {"1": {"eager_kernels": ks(1)}, "2": {"eager_kernels": ks(2)}}}
    assert ch.our_kernels({"breakdown": [bd]}, "s") == {"gemv_dp4a_kernel @ attn_proj": [1, 3.0],
                                                        "gemv_dp4a_kernel @ experts": [2, 9.0]}


def test_an_eager_slope_below_its_graphed_layer_is_no_layers_cost():
    """Slope and fixed part above zero, the slope under its graphed layer: no candidate, its ratios undecided."""
    from lab.chapters import decode_step as ch
    from lab.report.pages import eager_bf16_text
    row = lambda st, impl, run, s1, s2: {"state": st, "impl": impl, "run": run, "batch": 1, "context": 8,  # noqa: E731
                                         "samples_us": {"1": s1, "2": s2}, "per_layer_us": s2[0] - s1[0],
                                         "fixed_us": 2 * s1[0] - s2[0], "tokens_per_s": 1.0}
    a = {"default_experts_impl": "batched_mm", "summary": {"B1 C8": {}}, "rows": [
        row("int4_fused2", None, "eager", [50.0, 51.0], [80.0, 81.0]), row("bf16", "batched_mm", "eager", [90.0, 91.0],
        [100.0, 101.0]), row("bf16", "batched_mm", "graphed", [40.0], [80.0]), row("bf16", "grouped_mm", "eager",
        [40.0, 41.0], [80.0, 81.0])]}
    assert ch.decided(a["rows"][1]) and ch.below_graphed(a, a["rows"][1]) == 40.0
    assert ch.below_graphed(a, a["rows"][3]) is None and ch.best_row(a, "bf16", "eager", 1, 8)["impl"] == "grouped_mm"
    e = ch.eager_ratio(a, "int4_fused2", 1, 8)
    assert not e["decided"] and ch.eager_text(e).startswith("undecided (bf16 batched_mm's eager slope, 9–11 µs, lies "
                                                            "below its own graphed layer, 40 µs: not one layer's cost")
    assert "context 8 (batched_mm, its slope 9–11 µs below its graphed layer, 40 µs)" in eager_bf16_text(
        {"archs": {"olmoe": a}})


def _target_rec(compiled: bool, rows=(), summary=None, floors=None, skipped=()) -> dict:
    """A one-model receipt for chapter 07's targets: int4_fused2 and bf16 graphed at batch 1, context 256."""
    def row(st, impl, run, us, tps):
        return {"state": st, "impl": impl, "run": run, "batch": 1, "context": 256, "per_layer_us": us,
                "samples_us": {"1": [us, us], "2": [2 * us, 2 * us]}, "fixed_us": 0.0, "tokens_per_s": tps,
                "full_layers": 16}
    base = [row("int4_fused2", None, "graphed", 10.0, 400.0), row("bf16", "grouped_mm", "graphed", 40.0, 100.0)]
    s = {"best_bf16": {"impl": "grouped_mm", "run": "graphed", "tokens_per_s": 100.0}}
    if compiled:
        base.append(row("bf16", "grouped_mm", "compiled", 20.0, 200.0))
        s = {"best_bf16": {"impl": "grouped_mm", "run": "compiled", "tokens_per_s": 200.0},
             "bf16_compiled_per_layer_us": 20.0}
    a = {"rows": base + list(rows), "summary": {"B1 C256": s, **(summary or {})}, "skipped": list(skipped),
         "errors": {}, "greedy": {"steps": 4, "states": {}},
         "floors": {"int4 B1 C256": {"us": 5.0}, "bf16 B1 C256": {"us": 20.0}, **(floors or {})}}
    return {"card": "h100", "archs": {"olmoe": a}}


def test_tokens_target_is_undecided_without_compiled_bf16():
    """The tokens/s target against the fastest transformers bf16 measured is decided only where bf16 was compiled;
    without a compiled bf16 row it is undecided, with the reason, and the graphed comparison is its own (lower)
    target."""
    from lab.chapters import decode_targets as tg
    from lab.paths import RECEIPTS
    best = f"B1 C256: int4 tokens/s >= 3x {tg.BF16_FASTEST}"
    graphed = "B1 C256: int4 tokens/s >= 3x bf16 graphed (none compiled)"
    t = {x["target"]: x for x in tg.targets(_target_rec(False))}
    assert t[best]["met"] is None and t[best]["undecided"] and t[graphed]["met"] is True
    assert tg.status(t[best]).startswith("undecided (compiled bf16 not measured")
    t = {x["target"]: x for x in tg.targets(_target_rec(True))}
    assert t[best]["met"] is False and t[best]["undecided"] is None and graphed not in t
    # the generate target is read from the generate receipts, not from this record
    assert tg.status(t[best]) == "missed" and tg.status(t[tg.GENERATE]) == tg.status(tg.generate_target("olmoe"))
    assert tg.status(tg.generate_target("olmoe", RECEIPTS / "none")).startswith("not measured")
    assert tg.run_to_run(_target_rec(True), RECEIPTS / "decode_step_none.json") == {}      # in no version
    assert t[best]["rows"] == ["olmoe int4_fused2 - graphed B1 C256", "olmoe bf16 grouped_mm compiled B1 C256"]


def test_tokens_verdict_takes_the_range_of_the_extrapolated_steps():
    """A tokens/s ratio is decided by the range its steps at the published depth allow (each step's samples at
    opposite ends, `step_range`), not by the per-layer spread, which a step of many layers dilutes."""
    from lab.chapters import decode_step as ch, decode_targets as tg
    row = lambda s1, s2: {"run": "compiled", "full_layers": 10, "samples_us": {"1": s1, "2": s2}}  # noqa: E731
    num, den = row([10.0, 11.0], [20.0, 20.5]), row([30.0, 31.0], [60.0, 60.5])
    # step(10) = step(1) + 9 x per layer: the lowest pairs max step(1) with min step(2), -8 x 11 + 9 x 20 = 92
    assert ch.step_range(num) == (92.0, 104.5) and ch.step_range(den) == (292.0, 304.5)
    assert tg._step_verdict(num, den, 2.5) == (True, None)                       # 292 / 104.5 = 2.79 > 2.5
    assert tg._step_verdict(num, den, 3.0) == (None, "spread: the samples allow 2.79–3.31, reaching the bound 3")
    assert tg._step_verdict(num, den, 3.5) == (False, None)


def test_run_to_run_names_the_rows_the_older_version_lacks(monkeypatch):
    """Against an older version of the receipt: per kind the largest relative change over the rows both hold, their
    count, and this receipt's rows the older one lacks (not measured again there), never counted as unchanged;
    `earlier_runs` finds such a row in still older versions of the same setup, saying whether their kernel sources
    hash alike."""
    from lab.chapters import decode_targets as tg, history
    prov = {"provenance": {"device": "H100", "torch": "2"}, "transformers": "5"}
    new = {**_target_rec(True), **prov}
    old = {**_target_rec(False), **prov}
    old["archs"]["olmoe"]["rows"][0] = {**old["archs"]["olmoe"]["rows"][0], "per_layer_us": 8.0}
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: old)
    moves = tg.run_to_run(new, None)
    assert moves["graphed"] == (abs(10.0 / 8.0 - 1), 2, []) and moves["floor"] == (0.0, 2, [])
    assert moves["compiled"] == (0.0, 0, ["olmoe bf16 grouped_mm compiled B1 C256"])
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: {**old, "transformers": "4"})
    assert tg.run_to_run(new, None) == {}                                   # another setup: not the same run
    name = "olmoe bf16 grouped_mm compiled B1 C256"
    hashed = lambda r, k: {**r, "provenance": {**r["provenance"], "kernel_sources_sha256": k}}      # noqa: E731
    older = hashed({**_target_rec(True), **prov}, "b")
    older["archs"]["olmoe"]["rows"][-1] = {**older["archs"]["olmoe"]["rows"][-1], "per_layer_us": 21.0}
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: older if commit == "c1" else old)
    got = lambda k, commits: [(c, r["per_layer_us"], same) for c, r, same in      # noqa: E731
                              tg.earlier_runs(hashed(new, k), None, [name], commits)[name]]
    assert got("a", ("c1", "c2")) == [("c1", 21.0, False)] and got("b", ("c1",)) == [("c1", 21.0, True)]
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: {**older, "transformers": "4"})
    assert tg.earlier_runs(new, None, [name], ("c1",)) == {name: []}         # another setup: not counted


def test_replicated_pairs_targets_on_the_same_rows_and_the_greedy_target_names_its_model(monkeypatch):
    """A target is measured again where the older version of the same setup decides it from the same rows (its value
    is returned, with whether the kernel sources hash alike); a target whose rows differ there is not. The greedy
    target names the batch and the depth of the model it decoded."""
    from lab.chapters import decode_targets as tg, history
    def prov(k):
        return {"provenance": {"device": "H100", "torch": "2", "kernel_sources_sha256": k}, "transformers": "5"}
    new, old = {**_target_rec(True), **prov("a")}, {**_target_rec(False), **prov("a")}
    old["archs"]["olmoe"]["rows"][0] = {**old["archs"]["olmoe"]["rows"][0], "per_layer_us": 8.0}
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: old)
    again, same = tg.replicated(new, None)
    floor = ("olmoe", "B1 C256: int4 at its best <= 2.5x its read floor")
    assert same and again[floor] == 8.0 / 5.0
    assert ("olmoe", "B1 C256: int4 at its best below bf16's read floor") in again
    assert not [k for k in again if "tokens/s" in k[1]]                 # bf16 compiled here, graphed there
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: {**old, **prov("b")})
    assert tg.replicated(new, None)[1] is False
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: {**old, "transformers": "4"})
    assert tg.replicated(new, None) == ({}, False)                      # another setup: not the same run
    a = new["archs"]["olmoe"]
    a["depths"] = [1, 2]
    a["greedy"] = {"steps": 4, "batch": 1, "states": {"int4": {"equal": True, "first_mismatch": None}}}
    greedy, = [t for t in tg.targets(new) if t["kind"] == "greedy"]
    assert greedy["target"].endswith("(batch 1, 2-layer random-weight model)") and greedy["met"] is True


def test_eager_run_to_run_pairs_the_ratios_decided_in_both(monkeypatch):
    """The eager ratios over bf16's default experts implementation, this receipt's beside the older version's, for
    the states decided in both; each range from its own run's samples; {} for another setup."""
    from lab.chapters import decode_targets as tg, history

    def eager(st, impl, s1, s2):
        return {"state": st, "impl": impl, "run": "eager", "batch": 1, "context": 256, "per_layer_us": min(s2) - min(s1),
                "samples_us": {"1": s1, "2": s2}, "fixed_us": 0.0, "tokens_per_s": 1.0, "full_layers": 16}
    prov = {"provenance": {"device": "H100", "torch": "2"}, "transformers": "5"}
    new = {**_target_rec(True, rows=[eager("int4", None, [30.0, 31.0], [50.0, 51.0]),
                                     eager("int4_fused2", None, [10.0, 40.0], [20.0, 21.0]),
                                     eager("int4_fused", None, [10.0, 11.0], [20.0, 21.0]),
                                     eager("bf16", "grouped_mm", [60.0, 61.0], [110.0, 111.0])]), **prov}
    old = {**_target_rec(True, rows=[eager("int4", None, [10.0, 11.0], [15.0, 16.0]),
                                     eager("int4_fused2", None, [10.0, 11.0], [15.0, 16.0]),
                                     eager("int4_fused", None, [10.0, 11.0], [15.0, 16.0]),
                                     eager("bf16", "grouped_mm", [60.0, 61.0], [110.0, 111.0])]), **prov}
    for rec in (new, old):
        rec["archs"]["olmoe"]["default_experts_impl"] = "grouped_mm"
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: old)
    pairs = tg.eager_run_to_run(new, None)
    # int4_fused2's new slope reaches zero; int4_fused's new fixed part reaches zero (10 - 11 < 0)
    assert list(pairs) == [("olmoe", "B1 C256", "int4")]
    (e, f), = pairs.values()
    assert e["value"] == 0.4 and e["range"] == (19.0 / 51.0, 21.0 / 49.0)      # bf16's slope above its graphed 40
    assert f["value"] == 0.1 and f["range"] == (4.0 / 51.0, 6.0 / 49.0)
    monkeypatch.setattr(history, "receipt_at", lambda path, commit: {**old, "transformers": "4"})
    assert tg.eager_run_to_run(new, None) == {}


def test_targets_say_not_measured_and_undecided_where_the_receipt_cannot_decide():
    """A case the run skipped is "not measured" with the skipped parts named; a slope whose samples' range reaches
    zero, or a value within its samples' spread of the bound, is undecided, never a verdict."""
    from lab.chapters import decode_targets as tg
    key = "B16 C4096"
    rec = _target_rec(True, summary={key: {"best_bf16": {"impl": "grouped_mm", "run": "graphed"}}},
                      floors={f"bf16 {key}": {"us": 30.0}}, skipped=[f"time int4_fused2 - graphed {key}",
                                                                     f"floors {key}"])
    t = {x["target"]: x for x in tg.targets(rec)}
    for name in ("int4 at its best below bf16's read floor", "int4 graphed <= 2x its read floor"):
        st = tg.status(t[f"{key}: {name}"])
        assert st.startswith("not measured (skipped") and f"floors {key}" in st
    # a graphed row whose 2-layer and 1-layer samples overlap: its slope may be zero
    flat = {"state": "int4_fused2", "impl": None, "run": "graphed", "batch": 16, "context": 4096, "per_layer_us": 1.0,
            "samples_us": {"1": [10.0, 12.0], "2": [11.0, 13.0]}, "fixed_us": 9.0, "tokens_per_s": 1.0}
    rec = _target_rec(True, rows=[flat], summary={key: {"best_bf16": {"impl": "grouped_mm", "run": "graphed"}}},
                      floors={f"bf16 {key}": {"us": 30.0}, f"int4 {key}": {"us": 5.0}})
    t = {x["target"]: x for x in tg.targets(rec)}
    assert t[f"{key}: int4 graphed <= 2x its read floor"]["met"] is None
    assert tg.status(t[f"{key}: int4 graphed <= 2x its read floor"]).startswith("undecided (spread: per layer")
    assert tg._verdict(2.05, "<=", 2.0, [dict(flat, samples_us={"1": [1.0, 1.05], "2": [3.0, 3.0]},
                                              per_layer_us=2.0)]) == (None, "spread: 2.05 ± 2.5% reaches the bound 2")


def test_receipt_at_reads_a_committed_version_or_gives_none():
    from lab.chapters.history import receipt_at
    from lab.paths import RECEIPTS
    path = RECEIPTS / "decode_step_h100.json"
    assert receipt_at(path, "0" * 40) is None                        # a commit this checkout does not hold
    assert receipt_at(RECEIPTS / "decode_step_none.json", "HEAD") is None
    head = receipt_at(path, "HEAD")
    assert head is None or head["kind"] == json.loads(path.read_text())["kind"]   # None only without git


def test_attention_launch_splits_at_the_receipts_shapes(monkeypatch):
    """The decode attention launch at the decode-step receipt's shapes on an H100's 132 SMs (what the notes state):
    at batch 1, context 256, 2 splits of 128 slots on every model (batch x KV heads x splits = 32 / 8 / 16
    programs); at batch 16, context 256, OLMoE's 256 batch x KV-head programs run unsplit."""
    from int4lab.kernels import attention
    from lab.paths import RECEIPTS
    rec = json.loads((RECEIPTS / "decode_step_h100.json").read_text())
    monkeypatch.setattr(attention, "_sms", lambda dev: 132)
    hkv = {m: a["config"]["num_key_value_heads"] for m, a in rec["archs"].items()}
    cpu = torch.device("cpu")
    assert {m: attention.plan_splits(1, h, 256, cpu) for m, h in hkv.items()} == {m: (2, 128) for m in hkv}
    assert [h * attention.plan_splits(1, h, 256, cpu)[0] for h in hkv.values()] == [32, 8, 16]
    assert attention.plan_splits(16, hkv["olmoe"], 256, cpu) == (1, 256)
