"""`bsr`: dense blocks of br x bc (block-sparse weights), run by the
row-group gather GEMM (generator/families/rowgroup.py).

A group is one block-row (br >= 16) or ceil(16 / br) consecutive block-rows
(br < 16, so that a group fills one m16 tensor-core tile); its column list
is the union of its nonzero blocks' columns, in runs of bc (the last block
column clipped at K).  Entries of a stored block that are zero in W are
stored as explicit zeros; `fits` says whether every stored block is full.

Both layouts: feature-major gathers rows of X; token-major gathers runs of
columns of X, 16 bytes at a time when bc % 8 == 0 and K % 8 == 0 (else one
element at a time), and stores runs of 8 output rows per token.
"""
from __future__ import annotations

import numpy as np

from ..analysis import block_structure
from ..kernel import register
from ..matrix import SparseMatrix
from .rowgroup import Grouping, RowGroupFamily, round_up, union_supports

MAX_BLOCK_ROWS = 256


def block_count(matrix: SparseMatrix, br: int, bc: int) -> tuple[int, int]:
    """(nonzero blocks, entries those blocks cover, clipped at the edges)."""
    m, k = matrix.shape
    bptr, bcols = block_structure(matrix, br, bc)
    brow = np.repeat(np.arange(bptr.size - 1, dtype=np.int64), np.diff(bptr))
    bcol = bcols.astype(np.int64)
    area = np.minimum(br, m - brow * br) * np.minimum(bc, k - bcol * bc)
    return int(brow.size), int(area.sum())


class BsrFamily(RowGroupFamily):
    name = "bsr"
    layouts = ("fm", "tm")

    def _check_params(self, params: dict) -> tuple:
        try:
            br, bc = int(params["br"]), int(params["bc"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"bsr needs integer params br and bc, got {params!r}") from None
        if set(params) != {"br", "bc"}:
            raise ValueError(f"bsr takes params br and bc only, got {sorted(params)}")
        if not 1 <= br <= MAX_BLOCK_ROWS or bc < 1:
            raise ValueError(f"bsr block {br}x{bc}: need 1 <= br <= {MAX_BLOCK_ROWS} and bc >= 1")
        return br, bc

    def tag(self, params: dict) -> str:
        br, bc = self._check_params(params)
        return f"bsr{br}x{bc}"

    def _grouping_uncached(self, matrix: SparseMatrix, params: dict) -> Grouping:
        br, bc = self._check_params(params)
        per_group = 1 if br >= 16 else -(-16 // br)
        rows = br * per_group
        supports, _ = union_supports(matrix, None, rows, block_cols=bc)
        _, covered = block_count(matrix, br, bc)
        return Grouping(group_rows=rows, bm=round_up(rows, 16), perm=None, supports=supports,
                        exact=covered == matrix.nnz, run=bc)


register(BsrFamily())
