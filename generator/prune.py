"""Magnitude pruning of a dense weight matrix to each family's pattern.

    prune(dense, "csr" | "bsr:BRxBC" | "shflbw:V" | "nm24", sparsity)
        -> (SparseMatrix, PruneStats)

- csr: keep the largest |w| (unstructured).  Exact zeros of the input are
  never kept, so a matrix that is already sparser than asked stays as is.
- bsr:BRxBC: keep the blocks of largest Frobenius norm (edge blocks are
  smaller; the number of blocks is chosen so that the kept entries are
  closest to the target).
- shflbw:V: rows are permuted, then each group of V consecutive rows keeps
  whole V x 1 column vectors, the ones of largest L2 norm over all groups.
  The permutation is searched: rows are clustered by where their large
  weights are (greedy on normalized |w| profiles), refined by reassigning
  rows to the group whose kept columns hold most of their energy, and
  compared with the identity order; the order that keeps the most |W|^2
  wins.  The result carries `.perm` (original row at each position).
- nm24: keep the 2 largest |w| of every aligned 4 along K (sparsity must be
  0.5; a partial last group of K % 4 columns keeps at most 2).

Structured patterns store what the family stores: whole blocks, vectors or
2-of-4 pairs, explicit zeros included, so the result fits its family
exactly (see analysis).  Ties in magnitude are broken by `seed`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .kernel import parse_pattern
from .matrix import DTYPES, SparseMatrix


@dataclass
class PruneStats:
    pattern: str
    target_sparsity: float
    density: float           # stored entries / (M * K)
    nnz: int
    kept_l1: float           # fraction of sum |w| kept
    kept_l2: float           # fraction of sum w^2 kept
    seconds: float
    permuted: bool = False            # shflbw: a non-identity order won
    identity_kept_l2: Optional[float] = None  # shflbw: what the identity order keeps

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density

    def format(self) -> str:
        s = (f"{self.pattern}: sparsity {self.sparsity:.4f} (target {self.target_sparsity:.4f}), "
             f"nnz {self.nnz}, kept {100 * self.kept_l1:.2f}% of |W| and "
             f"{100 * self.kept_l2:.2f}% of |W|^2")
        if self.identity_kept_l2 is not None:
            s += (f", {'permuted' if self.permuted else 'identity order'} (identity keeps "
                  f"{100 * self.identity_kept_l2:.2f}% of |W|^2)")
        return s + f", {self.seconds:.3f} s"

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["sparsity"] = self.sparsity
        return d


# =========================================================================
# selection helpers
# =========================================================================
def _top_mask(scores: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of the `keep` largest scores; ties at the threshold are
    broken at random (seeded)."""
    flat = scores.ravel()
    n = flat.size
    out = np.zeros(n, dtype=bool)
    if keep <= 0:
        return out.reshape(scores.shape)
    if keep >= n:
        out[:] = True
        return out.reshape(scores.shape)
    thr = np.partition(flat, n - keep)[n - keep]
    out[flat > thr] = True
    need = keep - int(out.sum())
    if need > 0:
        ties = np.flatnonzero(flat == thr)
        out[rng.permutation(ties)[:need]] = True
    return out.reshape(scores.shape)


def _ranked(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of a 1-D array by decreasing score, ties in seeded random order."""
    return np.lexsort((rng.permutation(scores.size), -scores))


def _closest_prefix(sizes_in_order: np.ndarray, target: int) -> int:
    """How many of the items (taken in order) bring the total closest to
    target (ties: fewer)."""
    cum = np.concatenate([[0], np.cumsum(sizes_in_order)])
    return int(np.argmin(np.abs(cum - target)))


def _from_mask(dense: np.ndarray, mask: np.ndarray, dtype: str, perm=None) -> SparseMatrix:
    rows, cols = np.nonzero(mask)
    indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    m = SparseMatrix(dense.shape, indptr, cols, dense[rows, cols], dtype="fp32", perm=perm)
    return m.astype(dtype) if dtype != "fp32" else m


# =========================================================================
# patterns
# =========================================================================
def _prune_csr(w, target, rng):
    a = np.abs(w)
    keep = min(target, int(np.count_nonzero(a)))
    return _top_mask(a, keep, rng), None, {}


def _prune_bsr(w, target, rng, br, bc):
    m, k = w.shape
    nbr, nbc = -(-m // br), -(-k // bc)
    pad = np.zeros((nbr * br, nbc * bc), dtype=np.float64)
    pad[:m, :k] = w.astype(np.float64) ** 2
    energy = pad.reshape(nbr, br, nbc, bc).sum(axis=(1, 3)).ravel()
    rh = np.minimum(br, m - np.arange(nbr) * br)
    cw = np.minimum(bc, k - np.arange(nbc) * bc)
    entries = (rh[:, None] * cw[None, :]).ravel()
    order = _ranked(energy, rng)
    n = _closest_prefix(entries[order], target)
    keep_blocks = np.zeros(nbr * nbc, dtype=bool)
    keep_blocks[order[:n]] = True
    kb = keep_blocks.reshape(nbr, nbc)
    mask = np.repeat(np.repeat(kb, br, axis=0), bc, axis=1)[:m, :k]
    return mask, None, {}


def _group_sizes(m: int, v: int) -> np.ndarray:
    g = -(-m // v)
    sizes = np.full(g, v, dtype=np.int64)
    if g and m % v:
        sizes[-1] = m % v
    return sizes


def _shflbw_select(sq: np.ndarray, perm: np.ndarray, v: int, target: int, rng):
    """For rows in `perm` order, groups of v: (selected (G x K) bool, kept
    energy) of the global best V x 1 vectors."""
    m, k = sq.shape
    g = -(-m // v)
    pad = np.zeros((g * v, k), dtype=np.float64)
    pad[:m] = sq[perm]
    score = pad.reshape(g, v, k).sum(axis=1)
    sizes = np.repeat(_group_sizes(m, v), k)
    order = _ranked(score.ravel(), rng)
    n = _closest_prefix(sizes[order], target)
    sel = np.zeros(g * k, dtype=bool)
    sel[order[:n]] = True
    return sel.reshape(g, k), float(score.ravel()[order[:n]].sum())


def _cluster_order(sq: np.ndarray, v: int, t: int) -> np.ndarray:
    """Greedy clustering of rows by their normalized |w| profile restricted
    to each row's t largest entries (|w| rather than w^2, whose few largest
    entries would dominate the similarity): seed a group with the free row
    of most energy, fill it with the v - 1 free rows most similar to it."""
    m, k = sq.shape
    t = max(1, min(t, k))
    if t < k:
        top = np.argpartition(-sq, t - 1, axis=1)[:, :t]
        prof = np.zeros_like(sq)
        np.put_along_axis(prof, top, np.take_along_axis(sq, top, axis=1), axis=1)
    else:
        prof = sq.copy()
    energy = prof.sum(axis=1)
    prof = np.sqrt(prof)
    norms = np.linalg.norm(prof, axis=1)
    prof /= np.where(norms > 0, norms, 1.0)[:, None]
    prof = prof.astype(np.float32)
    free = np.ones(m, dtype=bool)
    seeds = np.lexsort((np.arange(m), -energy))
    out = []
    si = 0
    remaining = m
    while remaining >= v:
        while not free[seeds[si]]:
            si += 1
        s = int(seeds[si])
        free[s] = False
        cols = np.flatnonzero(prof[s])
        cand = np.flatnonzero(free)
        if cols.size:
            sim = prof[np.ix_(cand, cols)] @ prof[s, cols]
        else:
            sim = np.zeros(cand.size, dtype=np.float32)
        pick = cand[np.lexsort((cand, -sim))[:v - 1]]
        free[pick] = False
        out.append(s)
        out.extend(sorted(pick.tolist()))
        remaining -= v
    out.extend(np.flatnonzero(free).tolist())
    return np.asarray(out, dtype=np.int64)


def _reassign(sq: np.ndarray, sel: np.ndarray, v: int) -> np.ndarray:
    """Balanced reassignment of rows to groups: each row to the group whose
    selected columns hold most of its energy, groups filled to capacity in
    order of preference.  Returns the new perm (groups in order)."""
    m = sq.shape[0]
    cap = _group_sizes(m, v).copy()
    g = cap.size
    score = sq.astype(np.float32) @ sel.T.astype(np.float32)  # M x G
    assigned = np.full(m, -1, dtype=np.int64)
    while True:
        free = np.flatnonzero(assigned < 0)
        if free.size == 0:
            break
        sc = score[free].copy()
        sc[:, cap == 0] = -np.inf
        choice = np.argmax(sc, axis=1)
        best = sc[np.arange(free.size), choice]
        order = np.lexsort((free, -best, choice))
        ch = choice[order]
        first = np.searchsorted(ch, ch, side="left")
        rank = np.arange(ch.size) - first
        ok = rank < cap[ch]
        assigned[free[order[ok]]] = ch[ok]
        cap -= np.bincount(ch[ok], minlength=g)
    return np.lexsort((np.arange(m), assigned))


def _prune_shflbw(w, target, rng, v, sparsity, refine=3):
    m, k = w.shape
    sq = w.astype(np.float64) ** 2
    ident = np.arange(m, dtype=np.int64)
    seed_state = rng.bit_generator.state

    def evaluate(perm):
        rng.bit_generator.state = seed_state  # same tie-breaking for every order
        return _shflbw_select(sq, perm, v, target, rng)

    sel_id, e_id = evaluate(ident)
    best = (e_id, ident, sel_id)
    if m > v:
        t = int(round((1.0 - sparsity) * k))
        perm = _cluster_order(sq, v, t)
        sel, e = evaluate(perm)
        cands = [(e, perm, sel)]
        # refine from the better of the two
        cur = max(cands + [best], key=lambda c: c[0])
        for _ in range(refine):
            perm = _reassign(sq, cur[2], v)
            sel, e = evaluate(perm)
            if e <= cur[0] * (1 + 1e-12):
                break
            cur = (e, perm, sel)
        if cur[0] > best[0] * (1 + 1e-12):
            best = cur
    e, perm, sel = best
    # mask in original row order: position i (row perm[i]) keeps its group's columns
    mask = np.zeros((m, k), dtype=bool)
    mask[perm] = np.repeat(sel, _group_sizes(m, v), axis=0)[:m]
    total = float(sq.sum())
    extra = {"permuted": not np.array_equal(perm, ident),
             "identity_kept_l2": e_id / total if total > 0 else 1.0}
    return mask, perm, extra


def _prune_nm24(w):
    m, k = w.shape
    a = np.abs(w)
    mask = np.zeros((m, k), dtype=bool)
    full = k // 4 * 4
    if full:
        g = a[:, :full].reshape(m, full // 4, 4)
        top = np.argsort(-g, axis=2, kind="stable")[:, :, :2]
        gm = np.zeros(g.shape, dtype=bool)
        np.put_along_axis(gm, top, True, axis=2)
        mask[:, :full] = gm.reshape(m, full)
    if k > full:
        tail = a[:, full:]
        top = np.argsort(-tail, axis=1, kind="stable")[:, :2]
        tm = np.zeros(tail.shape, dtype=bool)
        np.put_along_axis(tm, top, True, axis=1)
        mask[:, full:] = tm
    return mask, None, {}


# =========================================================================
# entry point
# =========================================================================
def prune(dense: np.ndarray, pattern: str, sparsity: float, seed: int = 0,
          dtype: Optional[str] = None) -> tuple[SparseMatrix, PruneStats]:
    """Prune `dense` (M x K) to `pattern` at `sparsity` (fraction of entries
    removed).  dtype: of the result (default: fp16 for a float16 input,
    fp32 otherwise); values are rounded to it."""
    t0 = time.perf_counter()
    w = np.asarray(dense)
    if w.ndim != 2:
        raise ValueError(f"prune: expected a 2-D matrix, got shape {w.shape}")
    if w.dtype.kind not in "fiu":
        raise ValueError(f"prune: unsupported dtype {w.dtype} (expected a real number type)")
    if dtype is None:
        dtype = "fp16" if w.dtype == np.float16 else "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"prune: unknown dtype {dtype!r}; expected one of {DTYPES}")
    w = w.astype(np.float32)
    if not np.all(np.isfinite(w)):
        bad = int(np.flatnonzero(~np.isfinite(w.ravel()))[0])
        raise ValueError(f"prune: weights contain NaN or infinity (first at row "
                         f"{bad // w.shape[1]}, col {bad % w.shape[1]})")
    sparsity = float(sparsity)
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"prune: sparsity must be in [0, 1], got {sparsity}")
    try:
        family, params = parse_pattern(pattern)
    except ValueError as e:
        raise ValueError(f"prune: bad pattern {pattern!r}: {e}") from None
    m, k = w.shape
    target = int(round((1.0 - sparsity) * m * k))
    rng = np.random.default_rng(seed)
    if family == "csr":
        mask, perm, extra = _prune_csr(w, target, rng)
    elif family == "bsr":
        br, bc = params["br"], params["bc"]
        if br <= 0 or bc <= 0:
            raise ValueError(f"prune: block size must be positive, got {br}x{bc}")
        mask, perm, extra = _prune_bsr(w, target, rng, br, bc)
    elif family == "shflbw":
        v = params["v"]
        if v <= 0:
            raise ValueError(f"prune: group size V must be positive, got {v}")
        mask, perm, extra = _prune_shflbw(w, target, rng, v, sparsity)
    elif family == "nm24":
        if abs(sparsity - 0.5) > 1e-9:
            raise ValueError(f"prune: nm24 keeps 2 of every 4 weights: sparsity must be 0.5, "
                             f"got {sparsity}")
        mask, perm, extra = _prune_nm24(w)
    else:  # parse_pattern knows no other family
        raise ValueError(f"prune: unknown pattern {pattern!r}")
    mat = _from_mask(w, mask, dtype, perm=perm)
    a = np.abs(w.astype(np.float64))
    l1, l2 = a.sum(), (a * a).sum()
    kept = a[mask]
    stats = PruneStats(pattern=pattern, target_sparsity=sparsity,
                       density=mat.density, nnz=mat.nnz,
                       kept_l1=float(kept.sum() / l1) if l1 > 0 else 1.0,
                       kept_l2=float((kept * kept).sum() / l2) if l2 > 0 else 1.0,
                       seconds=0.0, **extra)
    mat.meta["pruned"] = f"{pattern} at sparsity {sparsity}"
    stats.seconds = time.perf_counter() - t0
    return mat, stats
