"""lab/interpreter.py: the lightened Triton interpreter the CPU tests and chapters run under keeps its checks."""
import os

import pytest
import torch
import triton
import triton.language as tl

from lab.interpreter import lighten

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")


@triton.jit
def _times(x_ptr, y_ptr, F: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, tl.load(x_ptr + i) * F)


@triton.jit
def _square_plus(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(y_ptr + i, _helper_square(x) + tl.sum(x, 0))       # a helper of ours and one of triton.language's


@triton.jit
def _helper_square(x):
    return x * x


def test_lightened_in_this_run_and_idempotent():
    assert lighten() and lighten()


def test_the_first_launch_of_a_kernel_checks_int32_overflow():
    x, y = torch.full((4,), 70_000, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
    with pytest.raises(Exception, match="int32 overflow detected for operation mul"):
        _times[(1,)](x, y, F=70_000, N=4)                  # 70 000² > 2³¹: the assert fires (debug on)
    _times[(1,)](x, y, F=70_000, N=4)                      # later launches skip the check: the product wraps
    assert torch.equal(y, x * 70_000)                      # as torch's int32 product does


def test_helpers_give_the_same_values_launch_after_launch():
    for n in (4, 8, 4):
        x = torch.randint(-50, 50, (n,), dtype=torch.int32)
        y = torch.empty_like(x)
        _square_plus[(1,)](x, y, N=n)
        assert torch.equal(y, x * x + x.sum())
