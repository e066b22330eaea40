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


def _group(item) -> str:
    """A test file whose tests share a module- or class-scoped fixture is one group (built once, in one process);
    any other test is a group of its own, free to run on either worker."""
    defs = getattr(item, "_fixtureinfo", None)
    shared = defs is not None and any(d.scope in ("class", "module", "package")
                                      for ds in defs.name2fixturedefs.values() for d in ds)
    return item.nodeid.split("::")[0] if shared else item.nodeid


@pytest.hookimpl(tryfirst=True)          # before xdist reads the groups
def pytest_collection_modifyitems(items):
    # make test runs two workers (-n 2 --dist loadgroup) over these groups; the chapters' quick runs, the longest
    # tests, go first, so that neither worker is left with one at the end
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    items.sort(key=lambda item: item.get_closest_marker("notebook") is None)     # stable: the rest keep their order


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
