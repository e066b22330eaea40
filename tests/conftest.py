"""Shared test setup. Importing int4lab first turns on TRITON_INTERPRET=1 when there is no CUDA device,
before any test module imports triton; on a GPU machine the same tests run on CUDA."""
import int4lab  # noqa: F401  (must precede any triton import)
import zlib

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs per test, reproducible per test name: a failure can be replayed.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (or a sentinel for integer dtypes) so unwritten elements show."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(-123 if t.dtype.is_signed else 0xAB)
