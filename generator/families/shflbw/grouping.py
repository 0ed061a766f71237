"""Shfl-BW groups of a sparse matrix: rows permuted so that each group of V
consecutive rows shares one column support.

The matrix fits when its rows split into groups of exactly V rows with
identical support (one partial group of M % V rows allowed, placed last);
the recovered permutation is returned.  Otherwise a greedy grouping by
support similarity (Jaccard) gives the permutation and the zeros it would
store (the union of each group's supports).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...analysis import stats
from ...matrix import SparseMatrix


def _group_unions(matrix: SparseMatrix, perm: np.ndarray, v: int):
    """For groups of v consecutive rows of W[perm]: (supports, stored) where
    supports[g] is the sorted union of the group's columns and stored =
    sum(|support| * rows in group)."""
    m, k = matrix.shape
    pos = np.empty(m, dtype=np.int64)
    pos[perm] = np.arange(m)
    group_of_row = pos // v
    n_groups = -(-m // v)
    mark = np.zeros((n_groups, k), dtype=bool)
    mark[group_of_row[matrix.row_ids()], matrix.indices] = True
    counts = mark.sum(axis=1)
    cols = np.nonzero(mark)[1].astype(np.int32)
    supports = np.split(cols, np.cumsum(counts)[:-1]) if n_groups else []
    sizes = np.full(n_groups, v, dtype=np.int64)
    if n_groups and m % v:
        sizes[-1] = m % v
    return supports, int((counts * sizes).sum())


def _row_keys(matrix: SparseMatrix) -> list[bytes]:
    ip, idx = matrix.indptr, matrix.indices
    return [idx[ip[i]:ip[i + 1]].tobytes() for i in range(matrix.rows)]


def _exact_classes(matrix: SparseMatrix) -> list[list[int]]:
    """Rows grouped by identical support, classes in order of first row."""
    classes: dict[bytes, list[int]] = {}
    for i, key in enumerate(_row_keys(matrix)):
        classes.setdefault(key, []).append(i)
    return list(classes.values())


class _SupportIndex:
    """Column -> rows index for fast support intersections."""

    def __init__(self, matrix: SparseMatrix):
        self.m = matrix.rows
        self.matrix = matrix
        order = np.argsort(matrix.indices, kind="stable")
        self.col_rows = matrix.row_ids()[order]
        self.col_ptr = np.zeros(matrix.cols + 1, dtype=np.int64)
        np.cumsum(np.bincount(matrix.indices, minlength=matrix.cols), out=self.col_ptr[1:])
        self.row_nnz = matrix.row_nnz()

    def intersections(self, row: int) -> np.ndarray:
        """|S_r & S_row| for every row r."""
        ip = self.matrix.indptr
        cols = self.matrix.indices[ip[row]:ip[row + 1]]
        starts, ends = self.col_ptr[cols], self.col_ptr[cols + 1]
        lens = ends - starts
        total = int(lens.sum())
        if total == 0:
            return np.zeros(self.m, dtype=np.int64)
        offs = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
        return np.bincount(self.col_rows[offs + np.arange(total)], minlength=self.m)


def _greedy_order(matrix: SparseMatrix, rows: np.ndarray, v: int) -> np.ndarray:
    """Order `rows` so that consecutive chunks of v have similar supports:
    seed each group with the remaining row of most nonzeros, fill it with
    the v - 1 remaining rows of highest Jaccard similarity to the seed."""
    index = _SupportIndex(matrix)
    free = np.zeros(matrix.rows, dtype=bool)
    free[rows] = True
    nnz = index.row_nnz
    out = []
    # seeds by decreasing nnz, then by row
    seed_order = rows[np.lexsort((rows, -nnz[rows]))]
    si = 0
    remaining = len(rows)
    while remaining >= v:
        while not free[seed_order[si]]:
            si += 1
        seed = int(seed_order[si])
        free[seed] = False
        cand = np.flatnonzero(free)
        inter = index.intersections(seed)[cand]
        union = nnz[cand] + nnz[seed] - inter
        jac = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        pick = cand[np.lexsort((cand, -jac))[:v - 1]]
        free[pick] = False
        out.append(seed)
        out.extend(sorted(pick.tolist()))
        remaining -= v
    out.extend(np.flatnonzero(free).tolist())
    return np.asarray(out, dtype=np.int64)


@dataclass
class ShflbwFit:
    v: int
    fits: bool
    method: str            # "identity", "given", "recovered" or "greedy"
    perm: np.ndarray       # original row at each position
    n_groups: int
    extra_zeros: int       # zeros stored (union supports) under perm
    cost: float            # extra_zeros / nnz
    width_mean: float      # columns per group
    width_max: int
    width_cv: float        # imbalance across groups

    @property
    def identity(self) -> bool:
        return bool(np.array_equal(self.perm, np.arange(self.perm.size)))


def shflbw_fit(matrix: SparseMatrix, v: int) -> tuple[ShflbwFit, list[np.ndarray]]:
    if v <= 0:
        raise ValueError(f"group size V must be positive, got {v}")
    m = matrix.rows
    candidates: list[tuple[str, np.ndarray]] = []
    if matrix.perm is not None:
        candidates.append(("given", matrix.perm))
    candidates.append(("identity", np.arange(m, dtype=np.int64)))

    best = None
    for method, perm in candidates:
        sup, stored = _group_unions(matrix, perm, v)
        if best is None or stored < best[2]:
            best = (method, perm, stored, sup)
        if stored == matrix.nnz:
            break
    if best[2] != matrix.nnz:
        classes = _exact_classes(matrix)
        rem = [c for c in classes if len(c) % v]
        if not rem or (len(rem) == 1 and len(rem[0]) % v == m % v):
            # exact: full groups class by class, the partial group last
            order = [r for c in classes if len(c) % v == 0 for r in c]
            if rem:
                order = [r for c in classes if len(c) % v == 0 for r in c] + rem[0]
            perm = np.asarray(order, dtype=np.int64)
            sup, stored = _group_unions(matrix, perm, v)
            best = ("recovered", perm, stored, sup)
        else:
            # zero-cost full groups from identical rows, greedy for the rest
            full, left = [], []
            for c in classes:
                n_full = len(c) // v * v
                full.extend(c[:n_full])
                left.extend(c[n_full:])
            left = np.asarray(sorted(left), dtype=np.int64)
            perm = np.concatenate([np.asarray(full, dtype=np.int64), _greedy_order(matrix, left, v)])
            sup, stored = _group_unions(matrix, perm, v)
            if stored < best[2]:
                best = ("greedy", perm, stored, sup)
    method, perm, stored, sup = best
    widths = np.array([s.size for s in sup], dtype=np.int64)
    _, wmean, wmax, wcv = stats(widths)
    extra = stored - matrix.nnz
    fit = ShflbwFit(v, extra == 0, method, perm, len(sup), extra,
                    extra / matrix.nnz if matrix.nnz else 0.0, wmean, int(wmax), wcv)
    return fit, sup


def shflbw_groups(matrix: SparseMatrix, v: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(perm, group_supports) for the shflbw family with group size v.

    perm[i] is the original row at position i; group g holds positions
    g*v .. min((g+1)*v, M) - 1 and group_supports[g] is its sorted int32
    column list.  For a matrix that fits exactly (see fits_shflbw) every row
    of a group has exactly that support; otherwise the support is the union
    of the group's rows and the family stores explicit zeros.  A permutation
    already on the matrix is kept when it fits (or is best)."""
    fit, sup = shflbw_fit(matrix, v)
    return fit.perm, sup


def fits_shflbw(matrix: SparseMatrix, v: int) -> bool:
    return shflbw_fit(matrix, v)[0].fits

