"""generator.prune: target sparsity, fit to each family, magnitude kept,
the Shfl-BW permutation search, and errors."""
import os

import numpy as np
import pytest

from sparseforge.generator import io
from sparseforge.generator.families import bsr, nm24, shflbw
from sparseforge.generator.prune import PruneStats, prune


@pytest.fixture
def w(rng):
    return rng.standard_normal((128, 96)).astype(np.float32)


def shuffled_structure(rng, m=256, k=128, v=16, width=16, noise=0.1):
    """Rows in groups of v whose large weights share `width` columns, plus
    small noise everywhere; rows then shuffled."""
    d = rng.standard_normal((m, k)).astype(np.float32) * noise
    for g in range(m // v):
        cols = rng.choice(k, width, replace=False)
        d[g * v:(g + 1) * v, cols] += rng.standard_normal((v, width)).astype(np.float32) * 2
    order = rng.permutation(m)
    return d[order], order


@pytest.mark.parametrize("sparsity", [0.5, 0.9, 0.97])
def test_csr(w, sparsity):
    m, st = prune(w, "csr", sparsity)
    target = round((1 - sparsity) * w.size)
    assert m.nnz == target and st.nnz == target
    assert st.density == pytest.approx(target / w.size)
    a = np.abs(w)
    kept = a[m.mask()]
    assert kept.min() >= a[~m.mask()].max()   # the largest magnitudes
    np.testing.assert_array_equal(m.to_dense()[m.mask()], w[m.mask()])
    assert st.kept_l1 == pytest.approx(kept.sum() / a.sum())
    assert st.kept_l2 == pytest.approx((kept ** 2).sum() / (a ** 2).sum())
    assert m.perm is None and not st.permuted


def test_csr_keeps_no_zeros(w):
    w = w.copy()
    w[:, ::2] = 0
    m, st = prune(w, "csr", 0.2)         # asks for more than the nonzeros
    assert m.nnz == np.count_nonzero(w) and np.all(m.values != 0)
    assert st.kept_l1 == pytest.approx(1.0)


@pytest.mark.parametrize("br,bc,sparsity", [(16, 16, 0.75), (32, 32, 0.9), (16, 8, 0.6), (24, 40, 0.8)])
def test_bsr(w, br, bc, sparsity):
    m, st = prune(w, f"bsr:{br}x{bc}", sparsity)
    target = (1 - sparsity) * w.size
    assert abs(m.nnz - target) <= br * bc / 2 + 1e-9       # within half a block
    indptr, cols = bsr.block_structure(m, br, bc)
    nb = int(indptr[-1])
    # whole blocks (edge blocks clipped to the matrix) and nothing else
    mask = np.kron(np.zeros((-(-128 // br), -(-96 // bc)), bool), np.ones((br, bc), bool))
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    for r, c in zip(rows, cols):
        mask[r * br:(r + 1) * br, c * bc:(c + 1) * bc] = True
    np.testing.assert_array_equal(m.mask(), mask[:128, :96])
    if 128 % br == 0 and 96 % bc == 0:
        assert bsr.fits_bsr(m, br, bc)
        assert nb == round(target / (br * bc))
    # the kept blocks have the largest Frobenius norms
    e = np.zeros((-(-128 // br), -(-96 // bc)))
    for i in range(e.shape[0]):
        for j in range(e.shape[1]):
            e[i, j] = (w[i * br:(i + 1) * br, j * bc:(j + 1) * bc] ** 2).sum()
    kept = np.zeros(e.shape, bool)
    kept[rows, cols] = True
    if 128 % br == 0 and 96 % bc == 0:
        assert e[kept].min() >= e[~kept].max()


@pytest.mark.parametrize("v,sparsity", [(16, 0.9), (32, 0.75), (64, 0.5), (48, 0.8)])
def test_shflbw_fits_and_target(w, v, sparsity):
    m, st = prune(w, f"shflbw:{v}", sparsity)
    assert abs(m.nnz - (1 - sparsity) * w.size) <= v / 2 + 1e-9   # within half a vector
    assert m.perm is not None and sorted(m.perm.tolist()) == list(range(128))
    assert shflbw.fits_shflbw(m, v)
    perm, sup = shflbw.shflbw_groups(m, v)
    np.testing.assert_array_equal(perm, m.perm)   # the pruner's own order is kept
    mask = m.mask()
    for g, cols in enumerate(sup):
        rows = m.perm[g * v:(g + 1) * v]
        assert np.all(mask[rows][:, cols]) and mask[rows].sum() == rows.size * cols.size
    assert st.identity_kept_l2 is not None
    assert st.kept_l2 >= st.identity_kept_l2 - 1e-12


def test_shflbw_permutation_beats_identity(rng):
    d, order = shuffled_structure(rng)
    m, st = prune(d, "shflbw:16", 1 - 16 / 128)
    assert st.permuted and shflbw.fits_shflbw(m, 16)
    assert st.kept_l2 > st.identity_kept_l2 + 0.2
    # the planted structure is found: as much as identity keeps on the unshuffled rows
    _, unshuffled = prune(d[np.argsort(order)], "shflbw:16", 1 - 16 / 128)
    assert not unshuffled.permuted
    assert st.kept_l2 == pytest.approx(unshuffled.kept_l2, rel=1e-9)
    assert st.kept_l2 > 0.97


def test_shflbw_identity_when_no_structure(rng):
    d = np.ones((64, 32), np.float32)
    m, st = prune(d, "shflbw:16", 0.5)
    assert not st.permuted
    np.testing.assert_array_equal(m.perm, np.arange(64))
    assert st.kept_l2 == pytest.approx(st.identity_kept_l2)


@pytest.mark.parametrize("k", [96, 10])
def test_nm24(rng, k):
    w = rng.standard_normal((32, k)).astype(np.float32)
    m, st = prune(w, "nm24", 0.5)
    assert nm24.fits_nm24(m)
    mask = m.mask()
    full = k // 4 * 4
    g = mask[:, :full].reshape(32, -1, 4)
    assert np.all(g.sum(axis=2) == 2)
    a = np.abs(w[:, :full]).reshape(32, -1, 4)
    kept = np.where(g, a, np.inf).min(axis=2)
    dropped = np.where(~g, a, -np.inf).max(axis=2)
    assert np.all(kept >= dropped)
    if k % 4 == 0:
        assert st.density == 0.5
    with pytest.raises(ValueError, match="nm24 keeps 2 of every 4 weights: sparsity must be 0.5, got 0.75"):
        prune(w, "nm24", 0.75)


def test_dtypes_and_stats(rng, tmp_path):
    w = rng.standard_normal((64, 64)).astype(np.float16)
    m, st = prune(w, "shflbw:16", 0.75)
    assert m.dtype == "fp16"
    np.testing.assert_array_equal(m.values, w.astype(np.float32)[m.mask()])
    b, _ = prune(w.astype(np.float32), "csr", 0.5, dtype="bf16")
    assert b.dtype == "bf16"
    assert isinstance(st, PruneStats) and st.seconds >= 0
    line = st.format()
    assert line.startswith("shflbw:16: sparsity 0.7500 (target 0.7500)") and "|W|^2" in line
    assert st.to_dict()["sparsity"] == pytest.approx(0.75)
    # the pruned matrix survives a save/load with its permutation
    io.save(tmp_path / "p.safetensors", [("w", m)])
    [(_, back)] = io.load(tmp_path / "p.safetensors")
    np.testing.assert_array_equal(back.perm, m.perm)
    np.testing.assert_array_equal(back.to_dense(), m.to_dense())


def test_seed_breaks_ties():
    w = np.ones((16, 16), np.float32)
    a, _ = prune(w, "csr", 0.5, seed=1)
    b, _ = prune(w, "csr", 0.5, seed=1)
    c, _ = prune(w, "csr", 0.5, seed=2)
    assert a.nnz == 128
    np.testing.assert_array_equal(a.mask(), b.mask())
    assert not np.array_equal(a.mask(), c.mask())


@pytest.mark.parametrize("args,match", [
    ((np.ones((2, 2, 2)), "csr", 0.5), "expected a 2-D matrix"),
    ((np.ones((4, 4)), "csr", 1.5), "sparsity must be in \\[0, 1\\]"),
    ((np.ones((4, 4)), "coo", 0.5), "unknown pattern 'coo'; expected one of: bsr:RxC"),
    ((np.ones((4, 4)), "bsr:ax2", 0.5),
     "pattern 'bsr:ax2': the block's rows must be a whole number from 1 to 256, got 'a'"),
    ((np.ones((4, 4)), "shflbw", 0.5), "shflbw needs a group size"),
    ((np.ones((4, 4)), "shflbw:0", 0.5), "the group size V must be from 1 to 256, got 0"),
    ((np.array([[1, np.nan], [0, 1]]), "csr", 0.5), "NaN or infinity \\(first at row 0, col 1\\)"),
    ((np.array([["a"]]), "csr", 0.5), "unsupported dtype"),
])
def test_errors(args, match):
    with pytest.raises(ValueError, match=match):
        prune(*args)


def test_prune_many_in_workers_gives_the_matrices_in_order_as_one_process_does(rng):
    """Worker processes (spawned) prune each matrix as prune() does in this
    process: the same values, columns and permutation, in input order, each
    with its own seed; a worker's error is raised for its matrix."""
    from sparseforge.generator.prune import auto_jobs, prune_many
    ws = [rng.standard_normal((64 + 16 * i, 48)).astype(np.float32) for i in range(3)]
    here = list(prune_many(iter(ws), "shflbw:16", 0.75, seed=[5, 6, 7], jobs=1))
    there = list(prune_many(iter(ws), "shflbw:16", 0.75, seed=[5, 6, 7], jobs=2))
    assert [m.shape for m, _ in there] == [w.shape for w in ws]
    for (a, sa), (b, sb), w, s in zip(here, there, ws, [5, 6, 7]):
        ref, _ = prune(w, "shflbw:16", 0.75, seed=s)
        for m in (a, b):
            assert np.array_equal(m.indptr, ref.indptr) and np.array_equal(m.indices, ref.indices)
            assert np.array_equal(m.values, ref.values) and np.array_equal(m.perm, ref.perm)
        assert sa.nnz == sb.nnz and sa.kept_l2 == sb.kept_l2
    bad = [ws[0], np.full((8, 8), np.nan, dtype=np.float32)]
    with pytest.raises(ValueError, match="NaN or infinity"):
        list(prune_many(iter(bad), "csr", 0.5, jobs=2))
    assert auto_jobs(200, 2) == 1 and auto_jobs(1 << 24, 1) == 1
    assert auto_jobs(1 << 22, 3) == min(3, os.cpu_count() or 1)


@pytest.mark.parametrize("m,v", [(256, 16), (250, 16), (7, 16), (130, 64)])
def test_shflbw_group_scores_are_the_zero_padded_sums(rng, m, v):
    """The group sums equal, bit for bit, those of the zero-padded copy
    they replaced (a short last group included)."""
    from sparseforge.generator.families.shflbw.prune import group_scores
    sq = rng.standard_normal((m, 40)) ** 2
    perm = rng.permutation(m)
    g = -(-m // v)
    pad = np.zeros((g * v, 40))
    pad[:m] = sq[perm]
    assert np.array_equal(group_scores(sq, perm, v), pad.reshape(g, v, 40).sum(axis=1))


def test_prune_many_names_a_worker_that_died(rng, monkeypatch):
    """A worker killed mid-matrix (here by os._exit, as the kernel's OOM
    killer would) is an error that says what happened and how to prune
    without workers, not a pool's traceback."""
    from sparseforge.generator import prune as pr

    class Dies:
        def __reduce__(self):   # unpickled in the worker: it exits there
            import os
            return (os._exit, (3,))

    with pytest.raises(RuntimeError, match=r"worker process died while matrix 0.*--jobs 1"):
        list(pr.prune_many(iter([Dies()]), "csr", 0.5, jobs=2))
