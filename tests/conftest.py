"""Shared test setup. Importing int4lab first turns on TRITON_INTERPRET=1 when there is no CUDA device,
before any test module imports triton; on a GPU machine the same tests run on CUDA."""
import int4lab  # noqa: F401  (must precede any triton import)
import os
import zlib

import pytest
import torch

from lab.interpreter import lighten

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _one_thread_per_worker():
    # pytest-xdist runs one process per core (make test: -n 2 on two cores); torch's default of one OpenMP
    # thread per core in every worker oversubscribes the machine and the idle threads spin. The variable
    # reaches the processes the tests start (the chapters' kernels).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_one_thread_per_worker()
lighten()                       # the Triton interpreter without two costs the tests do not need (lab/interpreter.py)


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
