"""Shared fixtures for the Python tests."""
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _dlmc_dir() -> Path:
    env = os.environ.get("SPARSEFORGE_DLMC")
    return Path(env) if env else REPO.parent / "shared" / "data" / "dlmc"


@pytest.fixture(scope="session")
def dlmc_dir() -> Path:
    """The read-only DLMC subset (never write into it); skips if absent."""
    d = _dlmc_dir()
    if not d.is_dir():
        pytest.skip(f"DLMC subset not found at {d} (set SPARSEFORGE_DLMC)")
    return d


@pytest.fixture(scope="session")
def dlmc_files(dlmc_dir) -> list:
    return sorted(dlmc_dir.rglob("*.smtx"))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def same_matrix():
    """assert_same(a, b): equal shape, dtype, pattern, values and perm."""
    def check(a, b, pattern=True):
        assert a.shape == b.shape
        assert a.dtype == b.dtype
        if pattern:
            np.testing.assert_array_equal(a.indptr, b.indptr)
            np.testing.assert_array_equal(a.indices, b.indices)
            np.testing.assert_array_equal(a.values, b.values)
        else:
            np.testing.assert_array_equal(a.to_dense(), b.to_dense())
        if a.perm is None or b.perm is None:
            assert a.perm is None and b.perm is None
        else:
            np.testing.assert_array_equal(a.perm, b.perm)
    return check


@pytest.fixture(scope="session")
def nvrtc():
    """compile(source, arch, name="kernel.cu", options=()) -> sparseforge.native.Binary,
    raising native.CompileError (with .log) on failure: the library's own NVRTC
    path, which works without a GPU."""
    from sparseforge import native
    ctx = native.Context(0)

    def compile_(source, arch, name="kernel.cu", options=()):
        return ctx.compile(source, arch=arch, name=name, options=options)

    yield compile_
    ctx.close()


@pytest.fixture
def assert_no_spills(nvrtc):
    """check(configs, make, arch, name): builds make(config) (a generated
    Kernel) for each configuration, compiles them in parallel with ptxas's
    report, and fails on any configuration whose kernel spills."""
    import re
    from concurrent.futures import ThreadPoolExecutor

    def check(configs, make, arch, name):
        def build(cfg):
            return nvrtc(make(cfg).source, arch, name, options=("--ptxas-options=-v",)).log

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            logs = list(pool.map(build, configs))
        for cfg, log in zip(configs, logs):
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
            assert spills and all(sp == ("0", "0") for sp in spills), (cfg, log)
    return check
