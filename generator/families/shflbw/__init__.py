"""`shflbw`: Shuffled Block-wise sparsity (Shfl-BW, DAC'22), run by the
row-group gather GEMM (generator/families/rowgroup/).

The rows are permuted (matrix.perm, or a permutation recovered by
grouping.py), then each group of V consecutive permuted rows keeps or
prunes whole V x 1 column vectors: a group is a dense V x k_g matrix over
its column support.  The kernel scatters each group's rows back to their
original positions in the epilogue.  A matrix whose groups are not exact
(rows of a group with different supports) still runs: its groups store the
union support with explicit zeros, and `fits` is False.  Pruning
(prune.py) searches the permutation that keeps the most |W|^2.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import parse_int, register
from ...family import Fit, PatternError, Pruned
from ...matrix import SparseMatrix
from ..rowgroup import RowGroupFamily, round_up
from ..rowgroup.plan import Grouping
from .grouping import fits_shflbw, shflbw_fit, shflbw_groups  # noqa: F401  (the package's API)
from .prune import group_sizes, prune_shflbw

MAX_V = 256
ANALYZED = (16, 32, 64, 128)       # the group sizes `inspect` reports
DETECTED = (128, 64, 32, 16)       # those auto-detection tries, largest first
_HOW = {"identity": "rows in order", "given": "given permutation",
        "recovered": "permutation recovered", "greedy": "greedy grouping"}


def shflbw_grouping(matrix: SparseMatrix, v: int) -> tuple[np.ndarray, list]:
    """(perm, supports) of a shflbw plan: the matrix's own permutation when
    it fits (or groups best), else one recovered exactly (a shuffled Shfl-BW
    matrix) or greedily (then the supports are unions and the plan stores
    explicit zeros)."""
    perm, supports = shflbw_groups(matrix, v)
    perm = np.ascontiguousarray(perm, dtype=np.int64)
    if perm.shape != (matrix.rows,) or not np.array_equal(np.sort(perm), np.arange(matrix.rows)):
        raise ValueError("shflbw_groups returned something that is not a row permutation")
    return perm, [np.ascontiguousarray(s_, dtype=np.int32) for s_ in supports]


class ShflbwFamily(RowGroupFamily):
    name = "shflbw"
    syntax = "shflbw:V"
    summary = "rows permuted, then groups of V rows share their columns (Shfl-BW)"
    auto_rank = 30
    # token-major: the columns are a group's own, so X is gathered element by
    # element (loads held in registers across a stage) and Y is written back
    # to the original rows one element at a time
    layouts = ("fm", "tm")

    # -- the pattern ----------------------------------------------------------
    def parse_params(self, arg: str) -> dict:
        if not arg:
            raise PatternError("shflbw needs a group size V, e.g. shflbw:64")
        return {"v": parse_int(arg, "the group size V", 1, MAX_V)}

    def _check_params(self, params: dict) -> tuple:
        try:
            v = int(params["v"])
        except (KeyError, TypeError, ValueError):
            raise PatternError(f"shflbw needs an integer param v, got {params!r}") from None
        if set(params) != {"v"}:
            raise PatternError(f"shflbw takes param v only, got {sorted(params)}")
        if not 1 <= v <= MAX_V:
            raise PatternError(f"shflbw group size v={v}: need 1 <= v <= {MAX_V}")
        return (v,)

    def tag(self, params: dict) -> str:
        (v,) = self._check_params(params)
        return f"shflbw{v}"

    def spec(self, params: dict) -> str:
        (v,) = self._check_params(params)
        return f"shflbw:{v}"

    def analyze(self, matrix: SparseMatrix) -> list[Fit]:
        out = []
        for v in ANALYZED:
            s, _ = shflbw_fit(matrix, v)
            data = {k: getattr(s, k) for k in ("v", "fits", "method", "n_groups", "extra_zeros",
                                               "cost", "width_mean", "width_max", "width_cv")}
            data["identity"] = s.identity
            out.append(Fit(f"shflbw:{v}", f"shflbw{v}", s.fits, s.cost, f"{s.cost:.3f}",
                           f"{_HOW[s.method]}, {s.n_groups} groups, width mean "
                           f"{s.width_mean:.1f} max {s.width_max} cv {s.width_cv:.3f}", data))
        return out

    def detect(self, matrix: SparseMatrix) -> Optional[dict]:
        """Whole groups of V rows (16-bit weights, M a multiple of V) that
        share their columns exactly."""
        if matrix.dtype not in self.dtypes:
            return None
        for v in DETECTED:
            if matrix.rows >= v and matrix.rows % v == 0:
                _, supports = shflbw_groups(matrix, v)
                if sum(len(s) * v for s in supports) == matrix.nnz:
                    return {"v": v}
        return None

    def prune(self, w: np.ndarray, params: dict, sparsity: float,
              rng: np.random.Generator) -> Pruned:
        (v,) = self._check_params(params)
        target = int(round((1.0 - sparsity) * w.size))
        mask, perm, extra = prune_shflbw(w, target, rng, v, sparsity)
        return Pruned(mask, perm, extra)

    def synth(self, params: dict, m: int, k: int, density: float,
              rng: np.random.Generator) -> tuple[np.ndarray, Optional[np.ndarray]]:
        (v,) = self._check_params(params)
        perm = rng.permutation(m)
        width = int(round(density * k))
        mask = np.zeros((m, k), dtype=bool)
        for g in range(0, m, v):
            cols = rng.choice(k, size=width, replace=False)
            mask[np.ix_(perm[g:g + v], cols)] = True
        return mask, perm

    # -- the row-group engine ---------------------------------------------------
    def _grouping_uncached(self, matrix: SparseMatrix, params: dict) -> Grouping:
        (v,) = self._check_params(params)
        perm, supports = shflbw_grouping(matrix, v)
        stored = sum(int(sup.size) * int(n) for sup, n in zip(supports, group_sizes(matrix.rows, v)))
        return Grouping(group_rows=v, bm=round_up(v, 16), perm=perm, supports=supports,
                        exact=stored == matrix.nnz)


register(ShflbwFamily())
