"""The `csr` family's split 2:4 format (sm_90a; config key `s24`: 1):
unstructured W in fp16 or bf16 stored as a 2:4 part, run on Sparse Tensor
Cores by the 2:4 family's warp-specialized TMA kernel (sf/nm24_tma.cuh),
plus a residual: the nonzeros beyond the two largest of their group of 4
along K, records sorted by row and column that the same kernel adds stage
by stage, each times the X tile the stage holds in shared memory, while
the stage's sparse wgmma run (sums in registers of their own, added to
the accumulators after the last stage).

Why: the bitmap format's decode costs the same per 16 x 16 tile at any
density (bench/RESULTS.md, 2026-11-26: the decode rows at density 0.1 run
no faster than at 0.5), and its tensor-core work is dense.  At low
density nearly every group of 4 of a random pattern holds at most 2
nonzeros (the residual holds 1% of the nonzeros at density 0.1, 4% at
0.2, 8% at 0.3, 19% at 0.5), so the 2:4 part carries almost all of W at
half the MMA work and 9/16 of the dense weight bytes.  The residual's
records cost each stage consumer time: on an H100 the format ran 1.2-2.6x
faster than the bitmaps at density 0.05, 1.5-2.1x at 0.1 with N = 64
(from 17% slower to 1.5x faster with N = 16), and 2-5x slower at 0.2
(bench/RESULTS.md).

A configuration is one of the 2:4 family's TMA tiles with `s24`: 1; the
candidates are that family's measured decode tiles (its hints), offered
where the residual is short (MAX_RESIDUAL).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Optional

import numpy as np

from ...kernel import ConfigError, Kernel, Operation, config_name, sm_count
from ...matrix import SparseMatrix, round_to_dtype
from ..nm24 import Nm24Family, Nm24Plan, TMA_KEYS, _align16, is_tma

KEY = "s24"
REC = np.dtype([("col", "<i4"), ("val", "<f4")])   # a residual nonzero (sf::nm24::ResRec)

# The residual's sums have registers of their own (bn / wn / 2 a thread):
# decode tiles only (sf/nm24_tma.cuh asserts it too).
MAX_WG_N = 64
# Offered where the residual holds at most this share of the nonzeros
# (random patterns: density 0.1 about 1%, 0.2 about 4%, 0.3 8%).  Measured
# on an H100 (bench/RESULTS.md, 2026-11-26): at density 0.1 the format was
# faster on 6 of 9 decode rows, on a par on 2, 17% slower on one
# (4096 x 4096, N = 16, feature-major); at 0.2 2-5x slower on every row: a
# tuner offered it there would spend half its hints on losing kernels.
MAX_RESIDUAL = 0.02
# Small matrices (at most this many entries) at any N: the decode-shaped
# TMA tile without split K, 64 rows by 32 or 16 columns of N a CTA: enough
# CTAs to fill the GPU where M is small.  H100, DLMC rn50 0.95
# bottleneck_1 (64 x 256, 819 nonzeros), token-major fp16 (bench/RESULTS.md,
# 2026-11-27): N = 3136 6.3 us against 8.8 for the suite's winner (split
# K over 2; cuBLAS 6.9), N = 25088 11.5 against 14.6 (cuBLAS 12.0).
SMALL_ENTRIES = 1 << 22
SMALL_TILES = tuple(dict(bm=64, bn=bn, bk=128, wm=1, wn=1, mw=1, stages=4, wg=1, tma=1, cm=1,
                         ks=1, mt=1, ra=0) for bn in (32, 16))

_NM24 = Nm24Family()   # the 2:4 kernels' planner (not registered twice: a private instance)


def is_split24(config: dict) -> bool:
    return bool(config.get(KEY, 0))


def tile_config(config: dict) -> dict:
    """The 2:4 kernel's configuration (without `s24`)."""
    return {k: v for k, v in config.items() if k != KEY}


def split(matrix: SparseMatrix) -> tuple[SparseMatrix, SparseMatrix]:
    """W = part + residual: `part` keeps the two largest |w| of every
    aligned group of 4 along K (ties: the lower column), `residual` the
    rest.  Both in W's dtype and shape, without W's permutation."""
    m, k = matrix.shape
    rows = matrix.row_ids()
    nnz = matrix.nnz
    # the nonzeros run by row, then column: their groups of 4 are runs too
    groups = rows * ((k + 3) // 4) + matrix.indices // 4
    starts = np.flatnonzero(np.diff(groups, prepend=-1)) if nnz else np.zeros(0, np.int64)
    sizes = np.diff(np.concatenate([starts, [nnz]]))
    keep = np.ones(nnz, dtype=bool)
    over = np.flatnonzero(sizes > 2)             # groups holding 3 or 4
    if over.size:
        # their members as rows of 4 (|w|, -1 for no member), in column order
        member = starts[over, None] + np.arange(4)[None, :]
        present = np.arange(4)[None, :] < sizes[over, None]
        mag = np.where(present, np.abs(matrix.values)[np.minimum(member, nnz - 1)], -1.0)
        # rank: members before it by |w| descending, ties to the lower column
        beats = (mag[:, None, :] > mag[:, :, None]) | (
            (mag[:, None, :] == mag[:, :, None]) &
            (np.arange(4)[None, None, :] < np.arange(4)[None, :, None]))
        rank = beats.sum(axis=2)
        keep[member[present]] = rank[present] < 2

    def part(mask: np.ndarray) -> SparseMatrix:
        counts = np.bincount(rows[mask], minlength=m)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return SparseMatrix((m, k), indptr, matrix.indices[mask], matrix.values[mask],
                            dtype=matrix.dtype)
    return part(keep), part(~keep)


def _split_cached(matrix: SparseMatrix) -> tuple[SparseMatrix, SparseMatrix]:
    return matrix.cached(("csr.split24",), lambda: split(matrix))


def residual_fraction(matrix: SparseMatrix) -> float:
    """The share of W's nonzeros the residual holds."""
    if matrix.nnz == 0:
        return 0.0
    return _split_cached(matrix)[1].nnz / matrix.nnz


def speedup_limit(density: float) -> float:
    """Dense fp16 weight bytes over the format's, for a random pattern at
    `density`: the 2:4 part's values (1 byte an entry of W) and metadata
    (1/8), and the residual's records (8 bytes each; a group of 4 with j > 2
    nonzeros leaves j - 2 of them).  What a memory-bound decode can gain at
    most: 1.78x at any low density, where the bitmaps allow up to 5x."""
    d = float(density)
    extra = sum((j - 2) * math.comb(4, j) * d ** j * (1 - d) ** (4 - j) for j in (3, 4))
    return 2.0 / (1.0 + 1.0 / 8 + REC.itemsize * extra / 4)


def check(config: dict, matrix: SparseMatrix, op: Operation,
          device: Optional[dict] = None) -> None:
    if config.get(KEY) != 1:
        raise ConfigError(f"{KEY} must be 1 (the split 2:4 format), got {config.get(KEY)!r}")
    tile = tile_config(config)
    if not is_tma(tile):
        raise ConfigError("the split 2:4 format runs on the 2:4 family's TMA kernels (tma: 1)")
    extra = sorted(set(tile) - set(TMA_KEYS))
    if extra:
        raise ConfigError(f"split 2:4 config has unknown keys {', '.join(extra)}")
    if tile.get("bn", 0) // max(1, tile.get("wn", 1)) > MAX_WG_N:
        raise ConfigError(f"bn / wn <= {MAX_WG_N}: the residual's sums take bn / wn / 2 "
                          "registers a thread more (decode tiles)")
    # the 2:4 kernel's rules read the matrix for its shape only
    _NM24.check_config(tile, matrix, op, {}, device)


def candidates(matrix: SparseMatrix, op: Operation, device: Optional[dict],
               n: Optional[int] = None) -> list[dict]:
    """For a small matrix SMALL_TILES, then the 2:4 family's TMA hints for
    this shape (N known: its regime's first), each as a split 2:4
    configuration, those the device takes; at 16 < N <= 64 a matrix whose
    128-row tiles fill half the GPU tries the 128-row tile first."""
    if device and device.get("arch") not in (None, "sm_90a"):
        return []
    if residual_fraction(matrix) > MAX_RESIDUAL:
        return []
    out = []
    is_small = matrix.rows * matrix.cols <= SMALL_ENTRIES
    for hint in (list(SMALL_TILES) if is_small else []) + _NM24.hint_configs(matrix, op, {}, device, n):
        if not is_tma(hint):
            continue
        # a decode tile splitting K, then the same in 4 stages (H100, N = 64,
        # density 0.1, 64-row tiles, K over 2: 4096 x 4096 12.2 us against
        # 14.0 with 8 stages; 4096 x 11008 29.6 against 27.6;
        # bench/RESULTS.md, 2026-11-28)
        deep_split = hint.get("ks", 1) > 1 and hint["stages"] > 4
        for c in [hint, dict(hint, stages=4)] if deep_split else [hint]:
            c = dict(c, **{KEY: 1})
            try:
                check(c, matrix, op, device)
            except ConfigError:
                continue
            if c not in out:
                out.append(c)
    if (n is not None and 16 < n <= 64 and not is_small
            and matrix.rows >= 128 * (sm_count(device) // 2)):
        # tall matrices at N = 64: the 128-row tile without split K first,
        # where it alone fills half the GPU (H100, 11008 x 4096 x 64 at
        # density 0.1: 24.3 us against 31.4 for the 64-row tile with K over
        # 2 and 38.9 with 8 stages; 2:4, 20.7 against 27.7; 4096 rows: the
        # 64-row tiles, 12.3 against 23.4; bench/RESULTS.md, 2026-11-28).
        # A budgeted search measures only its first few hints.
        tall = next((c for c in out if c["bm"] == 128 and c.get("ks", 1) == 1 and c["bn"] >= n),
                    None)
        if tall is not None:
            out.remove(tall)
            out.insert(0, tall)
    return out


def plan(matrix: SparseMatrix, op: Operation, tag: str, config: dict,
         bias: Optional[np.ndarray]) -> Nm24Plan:
    """The 2:4 part planned by the 2:4 family, the residual appended to its
    packed buffer: ptr int32[MP + 1], then the records."""
    check(config, matrix, op)
    part, res = _split_cached(matrix)
    p = _NM24.plan(part, op, {}, tile_config(config), bias)
    ptr = slice_starts(res, p.mp, p.kp, int(config.get("ks", 1))).astype("<i4")
    rec = np.empty(res.nnz, dtype=REC)
    rec["col"] = res.indices
    rec["val"] = round_to_dtype(res.values, op.dtype)
    res_ptr = _align16(len(p.packed))
    res_rec = _align16(res_ptr + ptr.nbytes)
    total = _align16(res_rec + rec.nbytes)

    def assemble() -> bytes:
        buf = bytearray(total)
        buf[:len(p.packed)] = p.packed
        buf[res_ptr:res_ptr + ptr.nbytes] = ptr.tobytes()
        buf[res_rec:res_rec + rec.nbytes] = rec.tobytes()
        return bytes(buf)
    # shared by the configurations whose 2:4 packing and K slices are shared
    packed = matrix.cached(("csr.split24.packed", op.dtype, p.mp, p.kp, int(config.get("ks", 1)),
                            hashlib.blake2b(p.packed, digest_size=16).digest()), assemble)
    cfg = {k: int(v) for k, v in config.items()}
    return dataclasses.replace(
        p, name=config_name(tag, cfg, op), config=cfg, packed=packed, res_ptr=res_ptr,
        res_rec=res_rec, perm=None if matrix.perm is None else matrix.perm.copy())


def slice_starts(res: SparseMatrix, mp: int, kp: int, ks: int) -> np.ndarray:
    """ptr[MP][KS + 1]: row m's first record in K slice z (columns from
    z kp / ks) and, last, its end; rows past M empty."""
    m = res.rows
    ptr = np.empty((mp, ks + 1), dtype=np.int64)
    ptr[m:] = res.nnz
    if m:
        rows = res.row_ids()
        for z in range(ks):   # records before column z kp / ks in each row
            before = np.bincount(rows[res.indices < z * (kp // ks)], minlength=m)
            ptr[:m, z] = res.indptr[:-1] + before
        ptr[:m, ks] = res.indptr[1:]
    return ptr.ravel()


def render_kernel(p: Nm24Plan, op: Operation) -> Kernel:
    tile = dataclasses.replace(p, config=tile_config(p.config))
    k = _NM24.render(tile, op, tile.config)
    return dataclasses.replace(k, config=dict(p.config))


def unpack(p: Nm24Plan) -> SparseMatrix:
    """W back: the 2:4 part (the 2:4 family's unpacking) plus the residual
    read from the packed buffer."""
    part = _NM24.unpack(dataclasses.replace(p, config=tile_config(p.config), perm=None))
    ks = int(p.config.get("ks", 1))
    ptr = np.frombuffer(p.packed, dtype="<i4", count=p.mp * (ks + 1),
                        offset=p.res_ptr).reshape(p.mp, ks + 1).astype(np.int64)
    nres = int(ptr[-1, -1])
    if nres < 0:
        raise ValueError("corrupt plan: residual row offsets")
    rec = np.frombuffer(p.packed, dtype=REC, count=nres,
                        offset=p.res_rec)
    ends = ptr[:, ks]
    starts = np.concatenate([[0], ends[:-1]])
    if (np.any(np.diff(ptr, axis=1) < 0) or np.any(ptr[:, 0] != starts)
            or np.any(ends[p.m:] != nres)):
        raise ValueError("corrupt plan: residual row offsets")
    rows = np.repeat(np.arange(p.mp), ends - starts)
    cols = rec["col"].astype(np.int64)
    z = np.minimum(cols // (p.kp // ks), ks - 1)
    e = np.arange(nres)
    if np.any(rows >= p.m) or np.any(cols < 0) or np.any(cols >= p.k) or \
            np.any(e < ptr[rows, z]) or np.any(e >= ptr[rows, z + 1]):
        raise ValueError("corrupt plan: residual records outside their row or K slice")
    dense = part.to_dense()
    if np.any(dense[rows, cols] != 0):
        raise ValueError("corrupt plan: a residual nonzero overlaps the 2:4 part")
    dense[rows, cols] = rec["val"]
    return SparseMatrix.from_dense(dense, dtype=p.dtype, perm=p.perm)
