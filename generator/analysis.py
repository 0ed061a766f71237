"""Pattern analysis: how well a sparse matrix fits each kernel family, and
what converting it would cost.

Costs are in one unit across families: explicit zeros a family would have
to store, as a fraction of the matrix's nonzeros (0 = fits exactly), except
`nm24`, which cannot store extra entries and must drop some instead (its cost
is the fraction of |W| (L1) that 2:4 pruning removes).

- csr: always fits; imbalance = coefficient of variation of row lengths.
- bsr BRxBC: the nonzero blocks (edge blocks padded); fill = nnz / stored
  elements; fits exactly when fill is 1.
- shflbw V: rows are permuted so that each group of V consecutive rows
  shares one column support.  The matrix fits when its rows split into
  groups of exactly V rows with identical support (one partial group of
  M % V rows allowed, placed last); the recovered permutation is returned.
  Otherwise a greedy grouping by support similarity (Jaccard) gives the
  permutation and the zeros it would store (the union of each group's
  supports).
- nm24: fits when every row has at most 2 nonzeros in every aligned group
  of 4 columns.

Functions the families call: block_structure, fits_bsr, shflbw_groups,
fits_shflbw, fits_nm24.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from .matrix import SparseMatrix


def _stats(a: np.ndarray) -> tuple[float, float, float, float]:
    """(min, mean, max, cv) of a vector; cv = std / mean (0 for mean 0)."""
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return 0.0, 0.0, 0.0, 0.0
    mean = float(a.mean())
    cv = float(a.std() / mean) if mean > 0 else 0.0
    return float(a.min()), mean, float(a.max()), cv


# =========================================================================
# bsr
# =========================================================================
def block_structure(matrix: SparseMatrix, br: int, bc: int) -> tuple[np.ndarray, np.ndarray]:
    """(block_indptr, block_cols): the blocks of br x bc holding at least one
    stored entry, in CSR form over block rows (ceil(M / br) of them), block
    columns sorted within each block row.  Edge blocks may reach past the
    matrix; a family pads them with zeros."""
    if br <= 0 or bc <= 0:
        raise ValueError(f"block size must be positive, got {br}x{bc}")
    m, k = matrix.shape
    nbr, nbc = -(-m // br), -(-k // bc)
    mark = np.zeros((nbr, nbc), dtype=bool)
    mark[matrix.row_ids() // br, matrix.indices // bc] = True
    indptr = np.zeros(nbr + 1, dtype=np.int64)
    np.cumsum(mark.sum(axis=1), out=indptr[1:])
    return indptr, np.nonzero(mark)[1].astype(np.int32)


def blocked_ell_columns(matrix: SparseMatrix, block: int) -> np.ndarray:
    """The Blocked-ELL block-column indices of `matrix` cut into square
    `block` x `block` blocks (cuSPARSE's format): int32, one row per
    block-row, its nonzero blocks' columns in increasing order, padded with
    -1 to the width of the fullest block-row (at least 1).  M and K must be
    multiples of `block` (ValueError)."""
    m, k = matrix.shape
    if block < 1 or m % block or k % block:
        raise ValueError(f"the block size ({block}) must divide M ({m}) and K ({k})")
    indptr, bcols = block_structure(matrix, block, block)
    counts = np.diff(indptr)
    out = np.full((m // block, max(1, int(counts.max(initial=0)))), -1, dtype=np.int32)
    brow = np.repeat(np.arange(m // block), counts)
    out[brow, np.arange(bcols.size) - indptr[brow]] = bcols
    return out


def fits_bsr(matrix: SparseMatrix, br: int, bc: int) -> bool:
    """True when every nonzero block is fully dense (and inside the matrix):
    the bsr family then stores no zeros at all.  Any matrix can be stored as
    bsr; see block_structure for the blocks and analyze for the cost."""
    indptr, _ = block_structure(matrix, br, bc)
    return matrix.nnz == int(indptr[-1]) * br * bc


@dataclass
class BsrFit:
    br: int
    bc: int
    n_blocks: int
    fill: float            # nnz / (n_blocks * br * bc)
    extra_zeros: int       # stored zeros
    cost: float            # extra_zeros / nnz
    fits: bool             # fill == 1
    blocks_per_row_cv: float   # imbalance across block rows
    blocks_per_row_max: int


def _bsr_fit(matrix: SparseMatrix, br: int, bc: int) -> BsrFit:
    indptr, _ = block_structure(matrix, br, bc)
    nb = int(indptr[-1])
    stored = nb * br * bc
    per_row = np.diff(indptr)
    _, _, mx, cv = _stats(per_row)
    return BsrFit(br, bc, nb, matrix.nnz / stored if stored else 1.0, stored - matrix.nnz,
                  (stored - matrix.nnz) / matrix.nnz if matrix.nnz else 0.0,
                  stored == matrix.nnz, cv, int(mx))


# =========================================================================
# shflbw
# =========================================================================
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


def _shflbw_fit(matrix: SparseMatrix, v: int) -> tuple[ShflbwFit, list[np.ndarray]]:
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
    _, wmean, wmax, wcv = _stats(widths)
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
    fit, sup = _shflbw_fit(matrix, v)
    return fit.perm, sup


def fits_shflbw(matrix: SparseMatrix, v: int) -> bool:
    return _shflbw_fit(matrix, v)[0].fits


# =========================================================================
# nm24
# =========================================================================
@dataclass
class Nm24Fit:
    fits: bool
    violating_groups: int      # aligned groups of 4 with more than 2 nonzeros
    dropped_l1: float          # fraction of |W| that 2:4 pruning drops
    dropped_nnz: float         # fraction of the nonzeros it drops
    k_multiple_of_4: bool


def _nm24_groups(matrix: SparseMatrix):
    """Group id of every nonzero (non-decreasing in CSR order)."""
    g = -(-matrix.cols // 4)
    return matrix.row_ids() * g + matrix.indices // 4


def fits_nm24(matrix: SparseMatrix) -> bool:
    """True when every row has at most 2 nonzeros in every aligned group of
    4 along K (a partial last group of K % 4 columns included)."""
    gid = _nm24_groups(matrix)
    if gid.size < 3:
        return True
    return not np.any(gid[2:] == gid[:-2])


def _nm24_fit(matrix: SparseMatrix) -> Nm24Fit:
    gid = _nm24_groups(matrix)
    nnz = gid.size
    k4 = matrix.cols % 4 == 0
    if nnz == 0:
        return Nm24Fit(True, 0, 0.0, 0.0, k4)
    a = np.abs(matrix.values.astype(np.float64))
    total = a.sum()
    # only groups with more than 2 nonzeros drop anything
    over = np.zeros(nnz, dtype=bool)
    if nnz > 2:
        third = np.flatnonzero(gid[2:] == gid[:-2])   # entry i + 2 shares i's group
        over[np.isin(gid, gid[third + 2])] = True
    sel = np.flatnonzero(over)
    gs, av = gid[sel], a[sel]
    order = np.lexsort((-av, gs))
    gs, av = gs[order], av[order]
    start = np.concatenate([[True], gs[1:] != gs[:-1]]) if gs.size else np.zeros(0, bool)
    run_start = np.maximum.accumulate(np.where(start, np.arange(gs.size), 0)) if gs.size else start
    drop = (np.arange(gs.size) - run_start) >= 2
    violating = int(start.sum())
    return Nm24Fit(violating == 0, violating,
                   float(av[drop].sum() / total) if total > 0 else 0.0,
                   float(drop.sum() / nnz), k4)


# =========================================================================
# report
# =========================================================================
@dataclass
class AnalysisReport:
    name: str
    shape: tuple[int, int]
    nnz: int
    density: float
    dtype: str
    values_synthetic: bool
    note: str
    row_nnz_min: int
    row_nnz_mean: float
    row_nnz_max: int
    row_nnz_cv: float          # imbalance across rows
    col_nnz_cv: float
    csr: dict = field(default_factory=dict)
    bsr: list[BsrFit] = field(default_factory=list)
    shflbw: list[ShflbwFit] = field(default_factory=list)
    nm24: Optional[Nm24Fit] = None

    def exact_fits(self) -> list[str]:
        """Family tags the matrix fits with no conversion cost."""
        out = ["csr"]
        out += [f"bsr{b.br}x{b.bc}" for b in self.bsr if b.fits]
        out += [f"shflbw{s.v}" for s in self.shflbw if s.fits]
        if self.nm24 is not None and self.nm24.fits:
            out.append("nm24")
        return out

    def to_dict(self, include_perm: bool = False) -> dict:
        d = {k: getattr(self, k) for k in
             ("name", "nnz", "density", "dtype", "values_synthetic", "note", "row_nnz_min",
              "row_nnz_mean", "row_nnz_max", "row_nnz_cv", "col_nnz_cv")}
        d["shape"] = list(self.shape)
        d["csr"] = dict(self.csr)
        d["bsr"] = [asdict(b) for b in self.bsr]
        d["shflbw"] = []
        for s in self.shflbw:
            e = {k: getattr(s, k) for k in ("v", "fits", "method", "n_groups", "extra_zeros",
                                             "cost", "width_mean", "width_max", "width_cv")}
            e["identity"] = s.identity
            if include_perm:
                e["perm"] = s.perm.tolist()
            d["shflbw"].append(e)
        d["nm24"] = asdict(self.nm24) if self.nm24 is not None else None
        d["exact_fits"] = self.exact_fits()
        return _plain(d)

    def format(self) -> str:
        m, k = self.shape
        lines = [f"{self.name or 'matrix'}: {m} x {k}, nnz {self.nnz} "
                 f"(density {self.density:.4f}, sparsity {1 - self.density:.4f}), {self.dtype}"]
        if self.values_synthetic or self.note:
            lines.append(f"  note: {self.note or 'values are synthetic'}")
        lines.append(f"  rows: nnz min {self.row_nnz_min}, mean {self.row_nnz_mean:.1f}, "
                     f"max {self.row_nnz_max}, cv {self.row_nnz_cv:.3f}; columns: cv {self.col_nnz_cv:.3f}")
        lines.append("  family        fits  cost (zeros/nnz)  detail")
        lines.append(f"  {'csr':<13} {'yes':<5} {0.0:<17.3f} row imbalance (cv) {self.row_nnz_cv:.3f}")
        for b in self.bsr:
            lines.append(f"  {f'bsr{b.br}x{b.bc}':<13} {'yes' if b.fits else 'no':<5} {b.cost:<17.3f} "
                         f"{b.n_blocks} blocks, fill {b.fill:.3f}, blocks/block-row cv "
                         f"{b.blocks_per_row_cv:.3f} (max {b.blocks_per_row_max})")
        for s in self.shflbw:
            how = {"identity": "rows in order", "given": "given permutation",
                   "recovered": "permutation recovered", "greedy": "greedy grouping"}[s.method]
            lines.append(f"  {f'shflbw{s.v}':<13} {'yes' if s.fits else 'no':<5} {s.cost:<17.3f} "
                         f"{how}, {s.n_groups} groups, width mean {s.width_mean:.1f} "
                         f"max {s.width_max} cv {s.width_cv:.3f}")
        if self.nm24 is not None:
            n = self.nm24
            detail = ("every group of 4 has at most 2 nonzeros" if n.fits else
                      f"{n.violating_groups} groups over 2; 2:4 pruning drops "
                      f"{100 * n.dropped_l1:.1f}% of |W| ({100 * n.dropped_nnz:.1f}% of nonzeros)")
            if not n.k_multiple_of_4:
                detail += "; K is not a multiple of 4"
            cost = f"{n.dropped_l1:.3f} (|W| dropped)"
            lines.append(f"  {'nm24':<13} {'yes' if n.fits else 'no':<5} {cost:<17} {detail}")
        fits = self.exact_fits()
        lines.append(f"  fits exactly: {', '.join(fits)}")
        return "\n".join(lines)


def _plain(x):
    """JSON-safe copy: numpy scalars to Python numbers, tuples to lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def analyze(matrix: SparseMatrix, v_sizes: Sequence[int] = (16, 32, 64, 128),
            block_sizes: Sequence[tuple[int, int]] = ((16, 16), (32, 32), (64, 64)),
            nm24: bool = True, name: Optional[str] = None) -> AnalysisReport:
    """Fit and conversion cost of `matrix` for every family."""
    rmin, rmean, rmax, rcv = _stats(matrix.row_nnz())
    _, _, _, ccv = _stats(np.bincount(matrix.indices, minlength=matrix.cols))
    rep = AnalysisReport(
        name=name if name is not None else matrix.name, shape=matrix.shape, nnz=matrix.nnz,
        density=matrix.density, dtype=matrix.dtype, values_synthetic=matrix.values_synthetic,
        note=str(matrix.meta.get("note", "")), row_nnz_min=int(rmin), row_nnz_mean=rmean,
        row_nnz_max=int(rmax), row_nnz_cv=rcv, col_nnz_cv=ccv,
        csr={"fits": True, "cost": 0.0, "imbalance": rcv})
    rep.bsr = [_bsr_fit(matrix, int(br), int(bc)) for br, bc in block_sizes]
    rep.shflbw = [_shflbw_fit(matrix, int(v))[0] for v in v_sizes]
    if nm24:
        rep.nm24 = _nm24_fit(matrix)
    return rep
