"""Random sparse matrices of each family at a target density, from a fixed
seed: the patterns the benchmark suites and sweeps run on.  Values are
standard normal (rounded to the dtype); say so where results are reported.
"""
from __future__ import annotations

import numpy as np

from .kernel import parse_pattern
from .matrix import SparseMatrix


def _from_mask(mask: np.ndarray, rng: np.random.Generator, dtype: str, **kw) -> SparseMatrix:
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1))])
    values = rng.standard_normal(rows.size).astype(np.float32)
    values[values == 0] = 1.0
    m = SparseMatrix(mask.shape, indptr, cols, values, "fp32", **kw)
    return m.astype(dtype)


def random_matrix(pattern: str, m: int, k: int, density: float, dtype: str = "fp16",
                  seed: int = 0) -> SparseMatrix:
    """A random matrix of `pattern` (csr, bsr:RxC, shflbw:V, nm24) with
    density `density` (nm24: always 0.5; bsr/shflbw: of whole blocks/vectors)."""
    family, params = parse_pattern(pattern)
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    rng = np.random.default_rng(seed)
    if family == "csr":
        mask = rng.random((m, k)) < density
        return _from_mask(mask, rng, dtype, name=f"random {pattern} d={density:g}")
    if family == "nm24":
        if k % 4:
            raise ValueError(f"nm24 needs K divisible by 4, got {k}")
        keys = rng.random((m, k // 4, 4))
        order = np.argsort(keys, axis=2)
        mask = np.zeros((m, k // 4, 4), dtype=bool)
        np.put_along_axis(mask, order[:, :, :2], True, axis=2)
        return _from_mask(mask.reshape(m, k), rng, dtype, name="random nm24")
    if family == "bsr":
        br, bc = params["br"], params["bc"]
        gm, gk = -(-m // br), -(-k // bc)
        nblocks = int(round(density * gm * gk))
        chosen = rng.choice(gm * gk, size=nblocks, replace=False)
        bmask = np.zeros(gm * gk, dtype=bool)
        bmask[chosen] = True
        mask = np.kron(bmask.reshape(gm, gk), np.ones((br, bc), dtype=bool))[:m, :k].astype(bool)
        return _from_mask(mask, rng, dtype, name=f"random {pattern} d={density:g}")
    if family == "shflbw":
        v = params["v"]
        perm = rng.permutation(m)
        width = int(round(density * k))
        mask = np.zeros((m, k), dtype=bool)
        for g in range(0, m, v):
            cols = rng.choice(k, size=width, replace=False)
            rows = perm[g:g + v]
            mask[np.ix_(rows, cols)] = True
        out = _from_mask(mask, rng, dtype, name=f"random {pattern} d={density:g}")
        out.perm = perm
        return out
    raise ValueError(f"unknown pattern {pattern!r}")
