"""The helpers chapter 03 is built on: plan evaluation without a GPU, the old activation rounding, source excerpts."""
import pytest
import torch

import int4lab as il
from lab.chapters import accuracy
from int4lab.kernels import plan as plan_mod
from int4lab.kernels.quant import quant_blocks


@pytest.mark.parametrize("N,K,R", [(14336, 4096, 1), (512, 2048, 2), (2048, 768, 8), (40, 4096, 1)])
def test_plan_on_the_interpreter_is_gemv_plan(N, K, R):
    assert accuracy.plan_on("interp", plan_mod.num_sms("cpu"), N, K, R) == plan_mod.gemv_plan(N, K, R, "cpu")


def test_plan_on_sm90_uses_the_h200_rows_and_the_waves_rule():
    big = accuracy.plan_on("sm90", 132, 14336, 4096, 1)
    assert (big.block_n, big.block_k, big.split_k) == (16, 2048, 1)
    small = accuracy.plan_on("sm90", 132, 512, 2048, 2)            # 16 tiles x 2 rows < 0.25 * 132 programs
    assert (small.block_n, small.split_k) == (32, 2)
    assert accuracy.plan_on("sm90", 1000, 512, 8192, 2).split_k == 8   # more SMs: more slices (<= K tiles)
    assert plan_mod.generation("cpu") == "interp"                   # the patch does not outlive the call


def test_moe_path_on_sm90_follows_the_mean_rows_and_the_experts_size():
    mixtral, olmoe = (8, 2, 4096, 14336), (64, 8, 2048, 1024)                # experts, top-k, H, I
    # Mixtral: 2 mean rows from 8 tokens, dp4a grouped below 4 mean rows (>= 32 Mi weights), mma from 16 tokens
    assert [accuracy.moe_path_on("sm90", 132, t, mixtral[1], mixtral[0], *mixtral[2:]) for t in (1, 4, 8, 16)] == [
        "routed", "routed", "grouped dp4a", "grouped mma"]
    # OLMoE: 2 mean rows from 16 tokens, and small experts go straight to the tensor-core tile
    assert [accuracy.moe_path_on("sm90", 132, t, olmoe[1], olmoe[0], *olmoe[2:]) for t in (8, 16)] == [
        "routed", "grouped mma"]
    # the 32 Mi row applies to each grouped GEMM's N x K, and gate_up holds 2 H I weights: for experts of 16 Mi to
    # 32 Mi weights per projection the two plans differ in block_m from 2 to 8 mean rows, and the step is refused
    for I in (4064, 4096, 8160, 8192):
        assert [accuracy.moe_path_on("sm90", 132, t, 2, 8, 4096, I) for t in (4, 8, 16, 24, 32)] == [
            "routed", *{4064: ["grouped mma"] * 3, 8192: ["grouped dp4a"] + ["grouped mma"] * 2}.get(
                I, ["refused (block_m 1/8)", "refused (block_m 16/8)", "refused (block_m 16/8)"]), "grouped mma"]
    step = accuracy.moe_step_on("sm90", 132, 8, 2, 8, 4096, 6144)
    assert "must share block_m" in step["refused"] and [p.block_m for p in step["plans"]] == [1, 8]
    assert accuracy.moe_step_on("sm90", 132, 32, 2, 8, 4096, 6144)["refused"] is None
    with pytest.raises(ValueError, match="multiples of 32"):
        accuracy.moe_step_on("sm90", 132, 8, 2, 8, 4096, 4095)
    assert accuracy.moe_path_on("interp", 4, 1, 2, 4, 64, 128) == "routed"
    assert accuracy.moe_path_on("interp", 4, 4, 2, 4, 64, 128) == "grouped dp4a"   # the interpreter's grouped row
    assert plan_mod.generation("cpu") == "interp"


def test_floor_rounding_differs_from_rint_only_at_ties():
    x = torch.randn(16, 256) * torch.logspace(-2, 2, 256)
    new, s_new = il.quant_x_rows_ref(x)
    old, s_old = accuracy.quant_x_rows_floor_ref(x)
    assert torch.equal(s_new, s_old) and int((new.int() - old.int()).abs().max()) <= 1
    tie = torch.zeros(1, 32)
    tie[0, :3] = torch.tensor([127.0, 2.5, -3.5])                   # s = 1: exact halves
    assert il.quant_x_rows_ref(tie)[0][0, :3].tolist() == [127, 2, -4]
    assert accuracy.quant_x_rows_floor_ref(tie)[0][0, :3].tolist() == [127, 3, -3]
    near = torch.zeros(1, 32)
    near[0, :2] = torch.tensor([127.0, 0.5 - 2.0 ** -25])            # no tie, x / s = x * (1/s); + 0.5 rounds to 1
    assert il.quant_x_rows_ref(near)[0][0, :2].tolist() == [127, 0]
    assert accuracy.quant_x_rows_floor_ref(near)[0][0, :2].tolist() == [127, 1]


def test_grouped_case_leaves_a_middle_expert_without_rows():
    torch.manual_seed(3)
    row = accuracy.grouped_case(9, 8, 64, 3, "cpu", block_m=2)
    assert row["empty_experts"] >= 1 and row["unwritten"] == 0 and row["rel_err"] <= accuracy.TOLERANCE
    with pytest.raises(ValueError, match="E must be"):
        accuracy.grouped_case(4, 8, 64, 1, "cpu")


def test_moe_grouped_with_plans_of_two_tile_heights_stops_at_down():
    gu, dn = accuracy.moe_step_on("sm90", 132, 8, 2, 8, 4096, 6144)["plans"]       # dp4a block_m 1, mma block_m 8
    assert accuracy.moe_grouped_with((gu, dn), "cpu") == "plan.block_m (8) must equal tiles.block_m (1)"
    assert accuracy.moe_grouped_with((gu, gu), "cpu") is None


def test_grouped_case_runs_the_tensor_core_kernel():
    row = accuracy.grouped_case(9, 8, 64, 3, "cpu", block_m=4, kind="mma")
    assert row["kernel"].endswith("mma") and row["empty_experts"] >= 1 and row["unwritten"] == 0
    assert row["rel_err"] <= accuracy.TOLERANCE
    with pytest.raises(ValueError, match="kind must be"):
        accuracy.grouped_case(4, 8, 64, 3, "cpu", kind="wmma")


def test_excerpt_cuts_between_markers_and_names_a_missing_one():
    text = accuracy.excerpt(quant_blocks, "amax =", "inv =")
    lines = text.splitlines()
    assert len(lines) == 3 and "amax =" in lines[0] and "inv =" in lines[-1]
    assert accuracy.excerpt(quant_blocks, "q = rint").splitlines()[-1].strip().startswith("return")
    with pytest.raises(ValueError, match="first="):
        accuracy.excerpt(quant_blocks, "no such line")
    with pytest.raises(ValueError, match="last="):
        accuracy.excerpt(quant_blocks, "amax =", "no such line")


def test_bits_and_ulps():
    a = torch.tensor([1.0, -2.0, 3.0], dtype=torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[2] += 1
    assert accuracy.ulps_apart(a, a) == 0 and accuracy.ulps_apart(a, b) == 1
    assert accuracy.bits(a).dtype == torch.int16


def test_bf16_once_rounds_float64_once_where_torch_rounds_twice():
    # 1 + 2^-8 is a bf16 tie; the 2^-40 above it is lost in float32, so float64 -> float32 -> bf16 goes to 1.0
    x = torch.tensor([1 + 2 ** -8 + 2 ** -40, -(1 + 2 ** -8 + 2 ** -40), 1 + 2 ** -8, 1 + 3 * 2 ** -8, 0.0],
                     dtype=torch.float64)
    assert accuracy.bf16_once(x).tolist() == [1 + 2 ** -7, -(1 + 2 ** -7), 1.0, 1 + 2 ** -6, 0.0]
    assert x[0].to(torch.bfloat16).item() == 1.0
    g = torch.Generator().manual_seed(0)
    y = torch.randn(10_000, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-8, 8, (10_000,), generator=g)
    once, lo = accuracy.bf16_once(y), y.float().bfloat16()
    assert (once.double() - y).abs().le((lo.double() - y).abs()).all()      # never farther than torch's cast


def test_fused_quant_case_compares_the_one_launch_gemv_with_the_same_fold():
    # the dense two-launch path folds the block columns as the one-launch GEMV does: the same bits on any draw
    # in the interpreter; the routed gemv_int4_b32 folds them in another order
    c = accuracy.fused_quant_case(2, 16, 512, "cpu")
    assert c["ulps"] == 0 and c["counters_zero"] and c["shape"] == "R2 16x512 split_k=1"
    assert isinstance(c["ulps_routed"], int)
