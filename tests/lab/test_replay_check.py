"""lab.tune.replay_check's replay comparison, run without a GPU: a stand-in capture reruns fn eagerly (the
kernels through Triton's interpreter), so what is tested is the alternation of input sets, the poisoning and
the per-set references, and that a stale read of the previous call's partial is caught."""
import pytest
import torch

from int4lab.format import pack_int4_b32
from int4lab.kernels import int4_linear
from int4lab.kernels.plan import gemv_plan
from lab.tune.replay_check import replays_match


def _eager_capture(fn):
    out = fn()

    def replay():
        out.copy_(fn())
    return replay, out


def test_split_k_gemv_replays_match_their_own_inputs():
    N, K = 40, 512
    g = torch.Generator().manual_seed(5)
    p, s = pack_int4_b32(torch.randn(N, K, generator=g))
    x = torch.empty(1, K, dtype=torch.bfloat16)
    sets = [[torch.randn(1, K, generator=g).bfloat16()] for _ in range(2)]
    plan = gemv_plan(N, K, 1, "cpu", split_k=4)
    res = replays_match(lambda: int4_linear(x, p, s, plan=plan), [x], sets, 3, capture=_eager_capture)
    assert res == {"replays_identical": True, "inputs_differ": True}


def test_a_stale_partial_read_is_caught_only_when_inputs_alternate():
    work = torch.zeros(8)                       # a workspace slot that outlives the call, like launch.WORKSPACES

    def stale(x):                               # reads the slot, then stores this call's partial: the race lost
        out = work.clone()
        work.copy_(2 * x)
        return out + 0 * x

    x = torch.empty(8)
    a, b = torch.randn(8), torch.randn(8)
    fn = lambda: stale(x)                                               # noqa: E731
    caught = replays_match(fn, [x], [[a], [b]], 4, capture=_eager_capture)
    assert caught["replays_identical"] is False
    work.copy_(2 * a)                           # after a warm-up call on the same input
    same = replays_match(fn, [x], [[a], [a.clone()]], 4, capture=_eager_capture)
    assert same == {"replays_identical": True, "inputs_differ": False}     # same inputs: the stale read is invisible


def test_replays_match_refuses_one_input_set():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="at least 2 input sets"):
        replays_match(lambda: x + 1, [x], [[x]], 2, capture=_eager_capture)


def test_the_receipt_records_the_command_that_made_it(tmp_path, monkeypatch):
    """The recorded command carries --out and the other flags, so it re-runs (and parses) as written."""
    import json

    from lab.tune import replay_check
    monkeypatch.setattr(replay_check, "run", lambda replays, small: {"rows": [], "all_pass": True})
    out = tmp_path / "r.json"
    assert replay_check.main(["--out", str(out), "--replays", "3", "--small"]) == 0
    command = json.loads(out.read_text())["provenance"]["command"]
    assert command == "python -m lab.tune.replay_check --out …/r.json --replays 3 --small"
