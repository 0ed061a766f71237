"""`bsr`: dense blocks of br x bc (block-sparse weights), run by the
row-group gather GEMM (generator/families/rowgroup/).

A group is one block-row (br >= 16) or ceil(16 / br) consecutive block-rows
(br < 16, so that a group fills one m16 tensor-core tile); its column list
is the union of its nonzero blocks' columns, in runs of bc (the last block
column clipped at K).  Entries of a stored block that are zero in W are
stored as explicit zeros; `fits` says whether every stored block is full.

Both layouts: feature-major gathers rows of X; token-major gathers runs of
columns of X, 16 bytes at a time when bc % 8 == 0 and K % 8 == 0 (else one
element at a time), and stores runs of 8 output rows per token.

Analysis: the nonzero blocks (edge blocks padded); cost = stored zeros /
nnz; fits exactly when every block is full.  Pruning keeps the blocks of
largest Frobenius norm (edge blocks are smaller; the number of blocks is
chosen so that the kept entries are closest to the target).  The benchmark
peer is cuSPARSE's Blocked-ELL SpMM (square blocks only).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from .. import parse_int, register
from ...family import Fit, PatternError, Pruned
from ...matrix import SparseMatrix
from ...prune import closest_prefix, ranked
from ..rowgroup import RowGroupFamily, round_up
from ..rowgroup.plan import Grouping, union_supports

MAX_BLOCK = 256
ANALYZED = ((16, 16), (32, 32), (64, 64))   # the blocks `inspect` reports
DETECTED = (64, 32, 16)                     # square blocks auto-detection tries, largest first


def block_structure(matrix: SparseMatrix, br: int, bc: int) -> tuple[np.ndarray, np.ndarray]:
    """(block_indptr, block_cols): the blocks of br x bc holding at least one
    stored entry, in CSR form over block rows (ceil(M / br) of them), block
    columns sorted within each block row.  Edge blocks may reach past the
    matrix; the family pads them with zeros."""
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
    the family then stores no zeros at all."""
    indptr, _ = block_structure(matrix, br, bc)
    return matrix.nnz == int(indptr[-1]) * br * bc


def block_count(matrix: SparseMatrix, br: int, bc: int) -> tuple[int, int]:
    """(nonzero blocks, entries those blocks cover, clipped at the edges)."""
    m, k = matrix.shape
    bptr, bcols = block_structure(matrix, br, bc)
    brow = np.repeat(np.arange(bptr.size - 1, dtype=np.int64), np.diff(bptr))
    bcol = bcols.astype(np.int64)
    area = np.minimum(br, m - brow * br) * np.minimum(bc, k - bcol * bc)
    return int(brow.size), int(area.sum())


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


def block_fit(matrix: SparseMatrix, br: int, bc: int) -> BsrFit:
    """How `matrix` fits blocks of br x bc."""
    from ...analysis import stats
    indptr, _ = block_structure(matrix, br, bc)
    nb = int(indptr[-1])
    stored = nb * br * bc
    _, _, mx, cv = stats(np.diff(indptr))
    return BsrFit(br, bc, nb, matrix.nnz / stored if stored else 1.0, stored - matrix.nnz,
                  (stored - matrix.nnz) / matrix.nnz if matrix.nnz else 0.0,
                  stored == matrix.nnz, cv, int(mx))


class BsrFamily(RowGroupFamily):
    name = "bsr"
    syntax = "bsr:RxC"
    summary = "dense blocks of R x C (R x R for bsr:R)"
    layouts = ("fm", "tm")
    auto_rank = 20
    peer = "cuSPARSE Blocked-ELL"

    # -- the pattern ----------------------------------------------------------
    def parse_params(self, arg: str) -> dict:
        if not arg:
            raise PatternError("bsr needs a block size, e.g. bsr:32x32 or bsr:32")
        br, sep, bc = arg.lower().partition("x")
        br = parse_int(br, "the block's rows", 1, MAX_BLOCK)
        bc = parse_int(bc, "the block's columns", 1, 1 << 20) if sep else br
        return {"br": br, "bc": bc}

    def _check_params(self, params: dict) -> tuple:
        try:
            br, bc = int(params["br"]), int(params["bc"])
        except (KeyError, TypeError, ValueError):
            raise PatternError(f"bsr needs integer params br and bc, got {params!r}") from None
        if set(params) != {"br", "bc"}:
            raise PatternError(f"bsr takes params br and bc only, got {sorted(params)}")
        if not 1 <= br <= MAX_BLOCK or bc < 1:
            raise PatternError(f"bsr block {br}x{bc}: need 1 <= br <= {MAX_BLOCK} and bc >= 1")
        return br, bc

    def tag(self, params: dict) -> str:
        br, bc = self._check_params(params)
        return f"bsr{br}x{bc}"

    def spec(self, params: dict) -> str:
        br, bc = self._check_params(params)
        return f"bsr:{br}x{bc}"

    def analyze(self, matrix: SparseMatrix) -> list[Fit]:
        out = []
        for br, bc in ANALYZED:
            b = block_fit(matrix, br, bc)
            out.append(Fit(f"bsr:{br}x{bc}", f"bsr{br}x{bc}", b.fits, b.cost, f"{b.cost:.3f}",
                           f"{b.n_blocks} blocks, fill {b.fill:.3f}, blocks/block-row cv "
                           f"{b.blocks_per_row_cv:.3f} (max {b.blocks_per_row_max})", asdict(b)))
        return out

    def detect(self, matrix: SparseMatrix) -> Optional[dict]:
        """Square blocks of 64, 32 or 16 that hold every nonzero with no
        stored zero (16-bit weights): a block pattern also fits shflbw, but
        bsr's contiguous column runs gather faster."""
        if matrix.dtype not in self.dtypes:
            return None
        for b in DETECTED:
            _, bcols = block_structure(matrix, b, b)
            if bcols.size and matrix.nnz == bcols.size * b * b:
                return {"br": b, "bc": b}
        return None

    def prune(self, w: np.ndarray, params: dict, sparsity: float,
              rng: np.random.Generator) -> Pruned:
        br, bc = self._check_params(params)
        m, k = w.shape
        target = int(round((1.0 - sparsity) * m * k))
        nbr, nbc = -(-m // br), -(-k // bc)
        pad = np.zeros((nbr * br, nbc * bc), dtype=np.float64)
        pad[:m, :k] = w.astype(np.float64) ** 2
        energy = pad.reshape(nbr, br, nbc, bc).sum(axis=(1, 3)).ravel()
        rh = np.minimum(br, m - np.arange(nbr) * br)
        cw = np.minimum(bc, k - np.arange(nbc) * bc)
        entries = (rh[:, None] * cw[None, :]).ravel()
        order = ranked(energy, rng)
        n = closest_prefix(entries[order], target)
        keep_blocks = np.zeros(nbr * nbc, dtype=bool)
        keep_blocks[order[:n]] = True
        kb = keep_blocks.reshape(nbr, nbc)
        return Pruned(np.repeat(np.repeat(kb, br, axis=0), bc, axis=1)[:m, :k])

    def synth(self, params: dict, m: int, k: int, density: float,
              rng: np.random.Generator) -> tuple[np.ndarray, Optional[np.ndarray]]:
        br, bc = self._check_params(params)
        gm, gk = -(-m // br), -(-k // bc)
        chosen = rng.choice(gm * gk, size=int(round(density * gm * gk)), replace=False)
        bmask = np.zeros(gm * gk, dtype=bool)
        bmask[chosen] = True
        mask = np.kron(bmask.reshape(gm, gk), np.ones((br, bc), dtype=bool))[:m, :k]
        return mask.astype(bool), None

    # -- the row-group engine ---------------------------------------------------
    def _grouping_uncached(self, matrix: SparseMatrix, params: dict) -> Grouping:
        br, bc = self._check_params(params)
        per_group = 1 if br >= 16 else -(-16 // br)
        rows = br * per_group
        supports, _ = union_supports(matrix, None, rows, block_cols=bc)
        _, covered = block_count(matrix, br, bc)
        return Grouping(group_rows=rows, bm=round_up(rows, 16), perm=None, supports=supports,
                        exact=covered == matrix.nnz, run=bc)

    # -- the benchmark peer -------------------------------------------------------
    def time_peer(self, ctx, matrix: SparseMatrix, params: dict, op, n: int,
                  timing: dict) -> dict:
        """cuSPARSE's Blocked-ELL SpMM on the matrix's block pattern
        (square blocks only; M and K multiples of the block)."""
        br, bc = self._check_params(params)
        if bc != br:
            raise ValueError(f"Blocked-ELL needs square blocks, not {br}x{bc}")
        m, k = matrix.shape
        cols = blocked_ell_columns(matrix, br)
        return ctx.time_blocked_ell(op.dtype, m, k, n, br, cols, layout=op.layout, **timing)


register(BsrFamily())
