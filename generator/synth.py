"""Random sparse matrices of each family at a target density, from a fixed
seed: the patterns the benchmark suites and sweeps run on.  Each family
draws its own pattern (Family.synth); values are standard normal (rounded
to the dtype) -- say so where results are reported.
"""
from __future__ import annotations

import numpy as np

from .matrix import SparseMatrix


def random_matrix(pattern: str, m: int, k: int, density: float, dtype: str = "fp16",
                  seed: int = 0) -> SparseMatrix:
    """A random matrix of `pattern` (any registered family's, e.g. csr,
    bsr:RxC, shflbw:V, nm24) with density `density` (of whole blocks or
    vectors for the block families; a fixed-density pattern such as nm24
    keeps its own)."""
    from .families import family_of
    fam, params = family_of(pattern)
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    rng = np.random.default_rng(seed)
    mask, perm = fam.synth(params, m, k, density, rng)
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1))])
    values = rng.standard_normal(rows.size).astype(np.float32)
    values[values == 0] = 1.0
    out = SparseMatrix(mask.shape, indptr, cols, values, "fp32",
                       name=f"random {fam.spec(params)} d={density:g}").astype(dtype)
    out.perm = perm
    return out
