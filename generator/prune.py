"""Magnitude pruning of a dense weight matrix to a family's pattern.

    prune(dense, "bsr:32x32", sparsity) -> (SparseMatrix, PruneStats)

Each family prunes to its own pattern (Family.prune, in its package); this
module checks the input, reports the fraction of |W| and |W|^2 kept, and
holds the selection helpers the families share.  Structured patterns store
what the family stores (whole blocks, vectors or 2-of-4 pairs, explicit
zeros included), so the result fits its family exactly.  Ties in magnitude
are broken by `seed`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from .family import PatternError
from .matrix import DTYPES, SparseMatrix
from .workers import in_order


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
def top_mask(scores: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
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


def ranked(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of a 1-D array by decreasing score, ties in seeded random order."""
    return np.lexsort((rng.permutation(scores.size), -scores))


def closest_prefix(sizes_in_order: np.ndarray, target: int) -> int:
    """How many of the items (taken in order) bring the total closest to
    target (ties: fewer)."""
    cum = np.concatenate([[0], np.cumsum(sizes_in_order)])
    return int(np.argmin(np.abs(cum - target)))


def from_mask(dense: np.ndarray, mask: np.ndarray, dtype: str, perm=None) -> SparseMatrix:
    """The entries of `dense` under `mask` (row order kept), rounded to
    `dtype`, with the row permutation `perm`: what pruning returns."""
    return SparseMatrix.from_mask(dense, mask, dtype, perm=perm)


def _norms(w: np.ndarray) -> tuple[float, float]:
    """(sum |w|, sum w^2) summed in float64: the squares in float32 (a
    float64 copy of a large layer costs more than its pruning), in float64
    where they would overflow."""
    a = np.abs(w)
    l1 = float(np.sum(a, dtype=np.float64))
    l2 = float(np.sum(np.square(a), dtype=np.float64))
    if not np.isfinite(l2):
        l2 = float(np.sum(np.square(a, dtype=np.float64)))
    return l1, l2


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
    from .families import family_of
    try:
        fam, params = family_of(pattern)
    except ValueError as e:
        raise ValueError(f"prune: {e}") from None
    try:
        pruned = fam.prune(w, params, sparsity, np.random.default_rng(seed))
    except PatternError as e:
        raise ValueError(f"prune: {e}") from None
    mask, perm, extra = pruned.mask, pruned.perm, pruned.extra
    mat = from_mask(w, mask, dtype, perm=perm)
    l1, l2 = _norms(w)
    k1, k2 = _norms(w[mask])
    stats = PruneStats(pattern=pattern, target_sparsity=sparsity,
                       density=mat.density, nnz=mat.nnz,
                       kept_l1=k1 / l1 if l1 > 0 else 1.0,
                       kept_l2=k2 / l2 if l2 > 0 else 1.0,
                       seconds=0.0, **extra)
    mat.meta["pruned"] = f"{pattern} at sparsity {sparsity}"
    stats.seconds = time.perf_counter() - t0
    return mat, stats


# Matrices with fewer entries than this in all are pruned in this process:
# starting worker processes (about a second each) would cost more.
PARALLEL_ENTRIES = 1 << 22


def auto_jobs(entries: int, matrices: Optional[int] = None) -> int:
    """Worker processes for pruning `matrices` matrices (None: not known
    yet) of `entries` entries in all: one a matrix up to every core, where
    they hold PARALLEL_ENTRIES or more; else 1 (this process)."""
    if entries < PARALLEL_ENTRIES or matrices == 1:
        return 1
    cores = os.cpu_count() or 1
    return min(matrices or cores, cores)


def _prune_job(job: tuple) -> tuple[SparseMatrix, PruneStats]:
    dense, pattern, sparsity, seed, dtype = job
    return prune(dense, pattern, sparsity, seed=seed, dtype=dtype)


def prune_many(denses: Iterable[np.ndarray], pattern: str, sparsity: float,
               seed: Union[int, Sequence[int]] = 0, dtype: Optional[str] = None,
               jobs: Optional[int] = None) -> Iterator[tuple[SparseMatrix, PruneStats]]:
    """prune() of each matrix of `denses` (seed: one for all, or one per
    matrix), `jobs` at a time in worker processes (None: every core; 1: in
    this process), the results in input order, each as soon as it and those
    before it are done.  At most `jobs` matrices are in flight, so a
    generator of a model's layers is not held in memory at once.  A
    worker's error is raised here, for its matrix, in order."""
    seeds = (lambda i: seed) if isinstance(seed, (int, np.integer)) else (lambda i: seed[i])
    items = ((d, pattern, sparsity, seeds(i), dtype) for i, d in enumerate(denses))
    yield from in_order(_prune_job, items, jobs or os.cpu_count() or 1,
                        died="prune: a worker process died while matrix {i} or one after it "
                             "was pruned (out of memory?); with jobs=1 (sparseforge prune "
                             "--jobs 1) they are pruned in this process, one at a time",
                        alone="note: pruning one matrix at a time in this process ({error})")
