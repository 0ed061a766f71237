"""`shflbw`: Shuffled Block-wise sparsity (Shfl-BW, DAC'22), run by the
row-group gather GEMM (generator/families/rowgroup.py).

The rows are permuted (matrix.perm, or a permutation recovered by
generator/analysis.py), then each group of V consecutive permuted rows keeps
or prunes whole V x 1 column vectors: a group is a dense V x k_g matrix over
its column support.  The kernel scatters each group's rows back to their
original positions in the epilogue.  A matrix whose groups are not exact
(rows of a group with different supports) still runs: its groups store the
union support with explicit zeros, and `fits` is False.
"""
from __future__ import annotations

from ..kernel import register
from ..matrix import SparseMatrix
from .rowgroup import Grouping, RowGroupFamily, round_up, shflbw_grouping

MAX_V = 256


class ShflbwFamily(RowGroupFamily):
    name = "shflbw"

    def _check_params(self, params: dict) -> tuple:
        try:
            v = int(params["v"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"shflbw needs an integer param v, got {params!r}") from None
        if set(params) != {"v"}:
            raise ValueError(f"shflbw takes param v only, got {sorted(params)}")
        if not 1 <= v <= MAX_V:
            raise ValueError(f"shflbw group size v={v}: need 1 <= v <= {MAX_V}")
        return (v,)

    def tag(self, params: dict) -> str:
        (v,) = self._check_params(params)
        return f"shflbw{v}"

    def _grouping_uncached(self, matrix: SparseMatrix, params: dict) -> Grouping:
        (v,) = self._check_params(params)
        perm, supports = shflbw_grouping(matrix, v)
        stored = sum(int(sup.size) * min(v, matrix.rows - g * v) for g, sup in enumerate(supports))
        return Grouping(group_rows=v, bm=round_up(v, 16), perm=perm, supports=supports,
                        exact=stored == matrix.nnz)


register(ShflbwFamily())
