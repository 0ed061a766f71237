"""Pattern analysis: each family's fit (bsr block structure, Shfl-BW
permutation recovery, 2:4), the report over the registry, and the DLMC
subset."""
import json

import numpy as np
import pytest

from sparseforge.generator import analysis, io
from sparseforge.generator.families import bsr, nm24, shflbw
from sparseforge.generator.families.shflbw import grouping
from sparseforge.generator.matrix import SparseMatrix


def planted_shflbw(rng, m, k, v, width, shuffle=True):
    """A matrix whose rows, in groups of v (the last one partial), share a
    random support of `width` columns; rows shuffled.  Returns (matrix,
    group label of each row)."""
    dense = np.zeros((m, k), np.float32)
    labels = np.arange(m) // v
    for g in range(-(-m // v)):
        cols = rng.choice(k, width, replace=False)
        rows = np.flatnonzero(labels == g)
        dense[np.ix_(rows, cols)] = rng.uniform(0.5, 2.0, (rows.size, width))
    order = rng.permutation(m) if shuffle else np.arange(m)
    return SparseMatrix.from_dense(dense[order]), labels[order]


# =========================================================================
# bsr
# =========================================================================
def test_block_structure():
    d = np.zeros((5, 7), np.float32)
    d[0, 0] = d[1, 1] = 1       # block (0, 0)
    d[0, 6] = 2                 # block (0, 3) (edge, 1 column wide)
    d[4, 3] = 3                 # block (2, 1) (edge, 1 row high)
    m = SparseMatrix.from_dense(d)
    indptr, cols = bsr.block_structure(m, 2, 2)
    np.testing.assert_array_equal(indptr, [0, 2, 2, 3])
    np.testing.assert_array_equal(cols, [0, 3, 1])
    assert cols.dtype == np.int32
    assert not bsr.fits_bsr(m, 2, 2)
    b = bsr.block_fit(m, 2, 2)
    assert (b.n_blocks, b.extra_zeros, b.fill) == (3, 8, 4 / 12)
    assert b.cost == 2.0 and not b.fits


def test_bsr_exact_fit(rng):
    kb = rng.random((4, 6)) < 0.4
    kb[0, 0] = True
    d = np.kron(kb, np.ones((16, 8))).astype(np.float32) * rng.uniform(1, 2, (64, 48)).astype(np.float32)
    m = SparseMatrix.from_dense(d)
    assert bsr.fits_bsr(m, 16, 8)
    indptr, cols = bsr.block_structure(m, 16, 8)
    assert indptr[-1] == kb.sum()
    r, c = np.nonzero(kb)
    np.testing.assert_array_equal(cols, c)
    np.testing.assert_array_equal(np.diff(indptr), kb.sum(axis=1))
    fit = bsr.block_fit(m, 16, 8)
    assert fit.fits and fit.cost == 0 and fit.fill == 1.0
    assert not bsr.block_fit(m, 32, 16).fits


# =========================================================================
# shflbw
# =========================================================================
@pytest.mark.parametrize("m,v", [(256, 16), (200, 32), (96, 64), (64, 128)])
def test_shflbw_recovers_planted_groups(rng, m, v):
    mat, labels = planted_shflbw(rng, m, 96, v, 12)
    assert shflbw.fits_shflbw(mat, v)
    perm, sup = shflbw.shflbw_groups(mat, v)
    assert sorted(perm.tolist()) == list(range(m))
    assert len(sup) == -(-m // v)
    dense = mat.to_dense()
    for g, cols in enumerate(sup):
        rows = perm[g * v:(g + 1) * v]
        # each recovered group is exactly one planted group
        assert len(set(labels[rows].tolist())) == 1
        assert rows.size == (v if g < len(sup) - 1 or m % v == 0 else m % v)
        assert cols.dtype == np.int32 and cols.size == 12
        np.testing.assert_array_equal(np.flatnonzero(dense[rows].any(axis=0)), cols)
        assert np.all(dense[rows][:, cols] != 0)
    fit = shflbw.shflbw_fit(mat, v)[0]
    assert fit.fits and fit.cost == 0 and fit.method in ("recovered", "identity")


def test_shflbw_identity_and_given_perm(rng):
    mat, _ = planted_shflbw(rng, 128, 64, 16, 8, shuffle=False)
    fit = shflbw.shflbw_fit(mat, 16)[0]
    assert fit.fits and fit.method == "identity" and fit.identity
    shuffled, _ = planted_shflbw(rng, 128, 64, 16, 8)
    perm, _ = shflbw.shflbw_groups(shuffled, 16)
    # a permutation already on the matrix is kept when it fits
    other = np.concatenate([perm[16:], perm[:16]])
    shuffled.perm = other
    p2, _ = shflbw.shflbw_groups(shuffled, 16)
    np.testing.assert_array_equal(p2, other)
    assert shflbw.shflbw_fit(shuffled, 16)[0].method == "given"


def test_shflbw_same_support_in_several_groups(rng):
    """Two planted groups with one support: 2v identical rows, still exact."""
    d = np.zeros((48, 20), np.float32)
    d[:32, :5] = 1
    d[32:, 5:9] = 2
    mat = SparseMatrix.from_dense(d[rng.permutation(48)])
    assert shflbw.fits_shflbw(mat, 16)
    assert shflbw.fits_shflbw(mat, 32)  # one full group of A rows, the partial one of B rows
    d = np.zeros((48, 20), np.float32)
    d[:24, :5] = 1
    d[24:, 5:9] = 2
    mat = SparseMatrix.from_dense(d[rng.permutation(48)])
    assert shflbw.fits_shflbw(mat, 8) and shflbw.fits_shflbw(mat, 24)
    assert not shflbw.fits_shflbw(mat, 16)  # two classes of 24 rows: a group mixes them


def test_shflbw_greedy_for_non_fitting(rng):
    mat, labels = planted_shflbw(rng, 128, 64, 16, 10)
    # perturb: drop one entry in each of a few rows
    d = mat.to_dense()
    for r in rng.choice(128, 5, replace=False):
        d[r, np.flatnonzero(d[r])[0]] = 0
    mat = SparseMatrix.from_dense(d)
    assert not shflbw.fits_shflbw(mat, 16)
    perm, sup = shflbw.shflbw_groups(mat, 16)
    assert sorted(perm.tolist()) == list(range(128))
    stored = 0
    for g, cols in enumerate(sup):
        rows = perm[g * 16:(g + 1) * 16]
        # every row's support lies in its group's support (union)
        assert set(np.flatnonzero(d[rows].any(axis=0)).tolist()) == set(cols.tolist())
        stored += cols.size * rows.size
    fit = shflbw.shflbw_fit(mat, 16)[0]
    assert fit.extra_zeros == stored - mat.nnz == 5  # the greedy finds the planted groups
    assert fit.cost == pytest.approx(5 / mat.nnz)
    assert not fit.fits and fit.method == "greedy"


def test_shflbw_random_matrix_costs(rng):
    d = (rng.random((96, 80)) < 0.1).astype(np.float32)
    mat = SparseMatrix.from_dense(d)
    for v in (16, 32):
        fit = shflbw.shflbw_fit(mat, v)[0]
        _, stored = grouping._group_unions(mat, fit.perm, fit.v)
        assert fit.extra_zeros == stored - mat.nnz > 0
        # never worse than the identity order
        _, ident = grouping._group_unions(mat, np.arange(96), fit.v)
        assert stored <= ident


# =========================================================================
# nm24
# =========================================================================
def test_nm24():
    d = np.array([[1, 0, 2, 0, 0, 3, 4, 0, 5],
                  [0, 0, 0, 0, 1, 1, 0, 0, 1]], np.float32)
    m = SparseMatrix.from_dense(d)
    assert nm24.fits_nm24(m)
    fit = nm24.nm24_fit(m)
    assert fit.fits and fit.dropped_l1 == 0 and not fit.k_multiple_of_4
    d[0, 1] = -0.5       # group (0, 0) now has 3 nonzeros: 1, -0.5, 2
    d[1, 6] = 3          # group (1, 1) now has 1, 1, 3: drops one 1
    m = SparseMatrix.from_dense(d)
    assert not nm24.fits_nm24(m)
    fit = nm24.nm24_fit(m)
    assert fit.violating_groups == 2
    assert fit.dropped_l1 == pytest.approx(1.5 / np.abs(d).sum())
    assert fit.dropped_nnz == pytest.approx(2 / m.nnz)


# =========================================================================
# the report
# =========================================================================
def test_report_format_and_dict(rng):
    mat, _ = planted_shflbw(rng, 64, 48, 16, 6)
    mat.name = "planted"
    rep = analysis.analyze(mat)
    assert rep.shape == (64, 48) and rep.nnz == 64 * 6
    assert rep.row_nnz_min == rep.row_nnz_max == 6 and rep.row_nnz_cv == 0
    text = rep.format()
    for word in ("planted: 64 x 48", "csr", "bsr16x16", "shflbw16", "shflbw128", "nm24",
                 "permutation recovered", "fits exactly: csr, "):
        assert word in text, text
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["shape"] == [64, 48] and {"csr", "shflbw16"} <= set(d["exact_fits"])
    assert not {"shflbw32", "bsr16x16"} & set(d["exact_fits"])
    assert "perm" not in d["shflbw"][0]
    assert [f["pattern"] for f in d["shflbw"]] == ["shflbw:16", "shflbw:32", "shflbw:64",
                                                  "shflbw:128"]
    assert d["csr"][0]["fits"] and d["nm24"][0]["fits"] == ("nm24" in d["exact_fits"])


def test_empty_and_tiny_matrices():
    for d in (np.zeros((0, 4)), np.zeros((3, 5)), np.eye(1)):
        rep = analysis.analyze(SparseMatrix.from_dense(d))
        assert rep.format()
        json.dumps(rep.to_dict())


def test_dlmc_subset_analyzed(dlmc_files):
    assert len(dlmc_files) == 18
    for f in dlmc_files:
        [(name, m)] = io.load(f)
        rep = analysis.analyze(m)
        assert rep.nnz == m.nnz and rep.fits["csr"][0].fits
        assert [len(rep.fits[f]) for f in ("bsr", "nm24", "shflbw")] == [3, 1, 4]
        # magnitude-pruned unstructured patterns fit no structured family
        assert rep.exact_fits() == ["csr"]
        for v in shflbw.ANALYZED:
            s, _ = shflbw.shflbw_fit(m, v)
            assert sorted(s.perm.tolist()) == list(range(m.rows))
            assert s.cost > 0
        assert "values drawn from a seeded normal generator" in rep.format()
