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

`s24`: 3 is the same format on feature-major prefill tiles (128 x 256),
where per-thread sums do not fit: the residual's columns of each tile of
rows are numbered in K order into steps of 32 slots (a step the columns
of whole K tiles), each step a 2:4 matrix of the tile's rows x 32 slots
run by one more sparse wgmma on those columns of X, which the consumer
warps copy out of the stages' X tiles (residual_steps; the kernel's side
is sf/nm24_tma.cuh's RS).  Its cost is one sparse wgmma a step (about an
eighth more tensor-core work at density 0.1) and 16-byte copies of whole
rows of the X tile, both per distinct column of a tile's residual, so
there the residual is chosen for few columns (split with tile_rows).
Token-major X tiles hold a column of X as one element a row: not offered
there.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Optional

import numpy as np

from ...family import accepted_by
from ...kernel import ConfigError, Kernel, Operation, config_name, sm_count
from ...matrix import SparseMatrix, round_to_dtype
from ..nm24 import Nm24Family, Nm24Plan, TMA_KEYS, _align16, is_tma, padded_shape
from ..nm24.pack import AE_STEP as AE_STEP_BYTES, interleave_ae, pack_matrix

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


STEPS = 3          # `s24` of the residual in steps (prefill, feature-major)
STEP_SLOTS = 32    # columns a step (one sparse wgmma K step)
LIST_BYTES = 64    # a K tile's list: count, flags, 30 entries of (column, slot)
LIST_MAX = (LIST_BYTES - 4) // 2
# the prefill tile with room for the steps' buffers beside 4 stages
STEP_TILES = (dict(bm=128, bn=256, bk=64, wm=2, wn=1, mw=1, stages=4, wg=1, tma=1, cm=2,
                   ks=1, mt=1, ra=0),
              dict(bm=128, bn=256, bk=64, wm=2, wn=1, mw=1, stages=4, wg=1, tma=1, cm=1,
                   ks=1, mt=1, ra=0))


# Whether the tuner offers the step tiles (first for feature-major prefill).
# On an H100, tuned, they ran issue 19's prefill rows at density 0.1 at
# 1.04x (4096 x 4096), 1.09x (11008 x 4096) and 1.11x (4096 x 11008) of
# cuBLAS, where the bitmap tiles ran 0.93-0.98x (bench/RESULTS.md,
# 2026-11-28).
# The offer was off while the kernel hung on some of those problems: the
# producer's lane 0 waited for a step's slot alone (now the whole warp
# waits; the GPU test test_gpu_steps_finish_on_prefill_problems).
OFFER_STEPS = True


def is_split24(config: dict) -> bool:
    return bool(config.get(KEY, 0))


def tile_config(config: dict) -> dict:
    """The 2:4 kernel's configuration (without `s24`; `rs` 1 for steps)."""
    out = {k: v for k, v in config.items() if k != KEY}
    if config.get(KEY) == STEPS:
        out["rs"] = 1
    return out


def _params(config: dict) -> dict:
    return {"rs": True} if config.get(KEY) == STEPS else {}


def split(matrix: SparseMatrix, tile_rows: Optional[int] = None
          ) -> tuple[SparseMatrix, SparseMatrix]:
    """W = part + residual, `part` a 2:4 matrix holding two nonzeros of
    every aligned group of 4 along K that has more, `residual` the rest;
    both in W's dtype and shape, without W's permutation.  Which two a
    group keeps does not change the product (both parts run with fp32
    sums), so:
    - tile_rows None: the two largest |w| (ties: the lower column);
    - tile_rows R (the residual in steps, one step list per tile of R
      rows): in each tile, the residual's members chosen so that the tile
      needs few distinct columns (_few_columns): each column the tile
      needs is one more a step copies and multiplies."""
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
        # their members as rows of 4 (-1 for no member), in column order
        member = starts[over, None] + np.arange(4)[None, :]
        present = np.arange(4)[None, :] < sizes[over, None]
        if tile_rows is None:
            mag = np.where(present, np.abs(matrix.values)[np.minimum(member, nnz - 1)], -1.0)
            # rank: members before it by |w| descending, ties to the lower column
            beats = (mag[:, None, :] > mag[:, :, None]) | (
                (mag[:, None, :] == mag[:, :, None]) &
                (np.arange(4)[None, None, :] < np.arange(4)[None, :, None]))
            keep[member[present]] = beats.sum(axis=2)[present] < 2
        else:
            cols = np.where(present, matrix.indices[np.minimum(member, nnz - 1)], -1)
            out = _few_columns(cols, sizes[over] - 2, rows[starts[over]] // tile_rows)
            keep[member[out]] = False

    def part(mask: np.ndarray) -> SparseMatrix:
        counts = np.bincount(rows[mask], minlength=m)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return SparseMatrix((m, k), indptr, matrix.indices[mask], matrix.values[mask],
                            dtype=matrix.dtype)
    return part(keep), part(~keep)


def _few_columns(cols: np.ndarray, need: np.ndarray, tile: np.ndarray) -> np.ndarray:
    """Which members go to the residual: cols int[G][4] the columns of
    each over-full group's members (-1: none), need[G] how many of each
    (1 or 2), tile[G] each group's tile of rows (non-decreasing).  Greedy
    cover, tile by tile: take the column that the most groups still
    needing a member hold (ties: the lower column), one member of each of
    those groups, until every group has its count (on a random pattern
    at density 0.1, 15% fewer columns a tile of 128 rows than the
    smallest members: bench/RESULTS.md, 2026-11-28).  Returns bool[G][4]."""
    out = np.zeros(cols.shape, dtype=bool)
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(tile)) + 1, [tile.size]])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        c = cols[lo:hi]
        left = need[lo:hi].copy()
        # the tile's columns and, for each, the members holding it
        uc, inv = np.unique(c, return_inverse=True)
        inv = inv.reshape(c.shape)
        valid = c >= 0
        count = np.bincount(inv[valid], minlength=uc.size)   # (no member: 0)
        order = np.argsort(inv, axis=None, kind="stable")
        first = np.searchsorted(inv.reshape(-1)[order], np.arange(uc.size + 1))
        while True:
            u = int(np.argmax(count))
            if count[u] == 0:
                break
            flat = order[first[u]:first[u + 1]]
            g, j = np.divmod(flat, 4)
            take = left[g] > 0
            g, j = g[take], j[take]
            out[lo + g, j] = True
            left[g] -= 1
            count[u] = 0
            done = g[left[g] == 0]
            if done.size:   # their other members no longer count
                rest = inv[done][valid[done] & ~out[lo + done]]
                np.subtract.at(count, rest, 1)
    return out


def _split_cached(matrix: SparseMatrix, tile_rows: Optional[int] = None
                  ) -> tuple[SparseMatrix, SparseMatrix]:
    return matrix.cached(("csr.split24", tile_rows), lambda: split(matrix, tile_rows))


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
    if config.get(KEY) not in (1, STEPS):
        raise ConfigError(f"{KEY} must be 1 (the split 2:4 format) or {STEPS} (its residual in "
                          f"steps), got {config.get(KEY)!r}")
    if "rs" in config:
        raise ConfigError(f"rs: set by {KEY} {STEPS}, not a key of its own")
    tile = tile_config(config)
    if not is_tma(tile):
        raise ConfigError("the split 2:4 format runs on the 2:4 family's TMA kernels (tma: 1)")
    extra = sorted(set(tile) - set(TMA_KEYS))
    if extra:
        raise ConfigError(f"split 2:4 config has unknown keys {', '.join(extra)}")
    if config[KEY] == 1 and tile.get("bn", 0) // max(1, tile.get("wn", 1)) > MAX_WG_N:
        raise ConfigError(f"bn / wn <= {MAX_WG_N}: the residual's sums take bn / wn / 2 "
                          "registers a thread more (decode tiles)")
    # the 2:4 kernel's rules read the matrix for its shape only
    _NM24.check_config(tile, matrix, op, _params(config), device)


def candidates(matrix: SparseMatrix, op: Operation, device: Optional[dict],
               n: Optional[int] = None) -> list[dict]:
    """For a small matrix SMALL_TILES, then the 2:4 family's TMA hints for
    this shape (N known: its regime's first), each as a split 2:4
    configuration, those the device takes; at 16 < N <= 64 a matrix whose
    128-row tiles fill half the GPU tries the 128-row tile first; for
    feature-major prefill the step tiles (STEP_TILES, OFFER_STEPS)."""
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
        for c in _valid([hint, dict(hint, stages=4)] if deep_split else [hint], 1, matrix, op,
                        device):
            if c not in out:
                out.append(c)
    if OFFER_STEPS and op.layout == "fm" and (
            n is None or (n > 256 and _steps_fill(matrix, n, device))):
        # prefill: the residual in steps on the 128 x 256 tiles where they
        # fill the GPU and every list fits (first for a known N: the decode
        # tiles above lose there; a small matrix keeps its small tiles first)
        steps = [c for c in _valid(STEP_TILES, STEPS, matrix, op, device)
                 if _steps_fit(matrix, c)]
        lead = len(out) if n is None else sum(tile_config(c) in SMALL_TILES for c in out)
        out = out[:lead] + steps + out[lead:]
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


def _steps_fill(matrix: SparseMatrix, n: int, device: Optional[dict]) -> bool:
    """Whether the step tiles (one 128 x 256 tile a CTA, one CTA an SM)
    fill the GPU at least once at this N.  They were measured on prefill
    problems of 512 to 1,376 tiles (bench/RESULTS.md, 2026-11-28); on the
    DLMC subset in feature-major they would run 4 to 98 (a 128 x 1152 matrix
    at N = 784: 4 CTAs on 132 SMs), where the decode tiles spread wider."""
    tiles = -(-matrix.rows // STEP_TILES[0]["bm"]) * -(-n // STEP_TILES[0]["bn"])
    return tiles >= sm_count(device)


def _steps_fit(matrix: SparseMatrix, config: dict) -> bool:
    """Whether every K tile's residual columns fit its list and a step
    (residual_steps raises otherwise: a configuration the tuner would only
    see refused)."""
    try:
        _step_lists(matrix, config)
    except ConfigError:
        return False
    return True


def _step_lists(matrix: SparseMatrix, config: dict):
    """residual_steps of the configuration's tiles (cached by the matrix)."""
    bm, bk = int(config["bm"]), int(config["bk"])
    mp, kp = padded_shape(matrix.rows, matrix.cols, tile_config(config))
    res = _split_cached(matrix, bm)[1]
    return matrix.cached(("csr.split24.steps", mp, kp, bm, bk),
                         lambda: residual_steps(res, mp, kp, bm, bk))


def _valid(tiles, s24: int, matrix: SparseMatrix, op: Operation,
           device: Optional[dict]) -> list[dict]:
    """The tiles as split 2:4 configurations (`s24`) that `check` accepts."""
    return accepted_by(lambda c: check(c, matrix, op, device),
                       [dict(t, **{KEY: s24}) for t in tiles])


def plan(matrix: SparseMatrix, op: Operation, tag: str, config: dict,
         bias: Optional[np.ndarray]) -> Nm24Plan:
    """The 2:4 part planned by the 2:4 family, the residual appended to its
    packed buffer: ptr int32[MP + 1], then the records."""
    check(config, matrix, op)
    # (steps) the residual chosen for few columns a tile of rows
    part, res = _split_cached(matrix, int(config["bm"]) if config[KEY] == STEPS else None)
    p = _NM24.plan(part, op, _params(config), tile_config(config), bias)
    if config[KEY] == STEPS:
        return _plan_steps(matrix, op, tag, config, p)
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


def _plan_steps(matrix: SparseMatrix, op: Operation, tag: str, config: dict,
                p: Nm24Plan) -> Nm24Plan:
    """The packed buffer of the residual in steps: the 2:4 part's runs
    with each K tile's list as blocks (block_weights), the bias, the
    steps' weights (2:4 runs), int32 first step of each tile, the step
    ends (step_end_words)."""
    bm, bk = int(config["bm"]), int(config["bk"])
    lists, first, stacked = _step_lists(matrix, config)
    assert lists.size == (p.mp // bm) * (p.kp // bk) * LIST_BYTES
    ae = _step_runs(stacked, op.dtype) if stacked.rows else b""
    ends = step_end_words(lists, p.kp // bk)
    blocks_len = len(lists) + p.mp // 64 * (p.kp // 32) * AE_STEP_BYTES
    bias_len = p.mp * 4 if p.has_bias else 0
    bias_offset = _align16(blocks_len) if p.has_bias else 0
    rs_a = _align16(blocks_len + bias_len)
    rs_ptr = _align16(rs_a + len(ae))
    rs_ends = _align16(rs_ptr + first.nbytes)
    total = _align16(rs_ends + ends.nbytes)

    def assemble() -> bytes:
        buf = bytearray(total)
        buf[:blocks_len] = block_weights(p.packed, lists, p.mp, p.kp, bm, bk).tobytes()
        if p.has_bias:
            buf[bias_offset:bias_offset + bias_len] = \
                p.packed[p.bias_offset:p.bias_offset + bias_len]
        buf[rs_a:rs_a + len(ae)] = ae
        buf[rs_ptr:rs_ptr + first.nbytes] = first.tobytes()
        buf[rs_ends:rs_ends + ends.nbytes] = ends.tobytes()
        return bytes(buf)
    packed = matrix.cached(("csr.split24.steps.packed", op.dtype, p.mp, p.kp, bm, bk,
                            hashlib.blake2b(p.packed, digest_size=16).digest()), assemble)
    cfg = {k: int(v) for k, v in config.items()}
    return dataclasses.replace(
        p, name=config_name(tag, cfg, op), config=cfg, packed=packed, values_offset=0,
        meta_offset=_align16(blocks_len), bias_offset=bias_offset, rs_a=rs_a, rs_ptr=rs_ptr,
        rs_ends=rs_ends, perm=None if matrix.perm is None else matrix.perm.copy())


def block_weights(ae: bytes, lists: np.ndarray, mp: int, kp: int, bm: int,
                  bk: int) -> np.ndarray:
    """The 2:4 part's runs (the TMA kernels' AE layout, from offset 0 of
    `ae`) regrouped as the stages hold them, each K tile's list after:
    uint8 [tiles][K tiles][bm / 64 x bk / 32 x AE_STEP + LIST_BYTES]."""
    tiles, kts, t64, kst = mp // bm, kp // bk, bm // 64, bk // 32
    a = np.frombuffer(ae, np.uint8, count=mp // 64 * (kp // 32) * AE_STEP_BYTES)
    a = a.reshape(tiles, t64, kts, kst, AE_STEP_BYTES).transpose(0, 2, 1, 3, 4)
    return np.concatenate([a.reshape(tiles, kts, t64 * kst * AE_STEP_BYTES),
                           lists.reshape(tiles, kts, LIST_BYTES)], axis=2)


def unblock_weights(blocks: bytes, mp: int, kp: int, bm: int,
                    bk: int) -> tuple[bytes, np.ndarray]:
    """block_weights' inverse: (the runs in the AE layout, the lists)."""
    tiles, kts, t64, kst = mp // bm, kp // bk, bm // 64, bk // 32
    size = t64 * kst * AE_STEP_BYTES
    b = np.frombuffer(blocks, np.uint8, count=tiles * kts * (size + LIST_BYTES))
    b = b.reshape(tiles, kts, size + LIST_BYTES)
    a = b[:, :, :size].reshape(tiles, kts, t64, kst, AE_STEP_BYTES).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(a).tobytes(), np.ascontiguousarray(b[:, :, size:])


def step_end_words(lists: np.ndarray, kts: int) -> np.ndarray:
    """The lists' step ends as bits for the producer: uint32
    [tiles][ceil(kts / 32)], bit kt % 32 of word kt // 32 set where K tile
    kt ends a step."""
    flags = (lists.reshape(-1, kts, LIST_BYTES)[:, :, 1] & 1).astype(np.uint64)
    words = -(-kts // 32)
    padded = np.zeros((flags.shape[0], words * 32), dtype=np.uint64)
    padded[:, :kts] = flags
    bits = padded.reshape(-1, words, 32) << np.arange(32, dtype=np.uint64)
    return bits.sum(axis=2).astype("<u4")


def _step_runs(stacked: SparseMatrix, dtype: str) -> bytes:
    """The steps' weights as the TMA kernels' runs (64 rows x 32 columns each)."""
    values, meta = pack_matrix(stacked, dtype, stacked.rows, STEP_SLOTS, wgmma=True)
    return interleave_ae(values, meta, stacked.rows, STEP_SLOTS)


def residual_steps(res: SparseMatrix, mp: int, kp: int, bm: int,
                   bk: int) -> tuple[np.ndarray, np.ndarray, SparseMatrix]:
    """The residual of each tile of `bm` rows in steps: (lists uint8
    [tiles][K tiles][LIST_BYTES], first int32[tiles] (each tile's first
    step), the steps' weights stacked: (steps x bm) x STEP_SLOTS, step j's
    slots in its rows j bm ..).  A tile's residual columns take slots in K
    order; a column moves to the next group of 4 slots where a row would
    hold 3 in one (the 2:4 rule); a K tile's columns all go to one step,
    a new step where they do not fit the current one.  ConfigError where a
    K tile holds more columns than its list (LIST_MAX)."""
    tiles, kts = mp // bm, kp // bk
    lists = np.zeros((tiles, kts, LIST_BYTES), dtype=np.uint8)
    first = np.zeros(tiles, dtype="<i4")
    rows_of = res.row_ids()
    cols_all = res.indices.astype(np.int64)
    order = np.lexsort((rows_of, cols_all, rows_of // bm))   # by tile, column, row
    t_sorted = rows_of[order] // bm
    bounds = np.searchsorted(t_sorted, np.arange(tiles + 1))
    out_rows, out_cols, out_vals = [], [], []
    nsteps = 0
    for t in range(tiles):
        first[t] = nsteps
        idx = order[bounds[t]:bounds[t + 1]]
        if idx.size == 0:
            continue
        cols = cols_all[idx]
        rloc = rows_of[idx] - t * bm
        ucols, starts = np.unique(cols, return_index=True)
        ends = np.append(starts[1:], cols.size)
        windows = ucols // bk
        wstarts = np.flatnonzero(np.diff(windows, prepend=-1))
        wends = np.append(wstarts[1:], ucols.size)
        slot, counts, last_w = 0, np.zeros((bm, STEP_SLOTS // 4), np.int8), -1

        def place(lo: int, hi: int, slot: int, counts: np.ndarray):
            counts = counts.copy()
            slots = []
            for u in range(lo, hi):
                r = rloc[starts[u]:ends[u]]
                while slot < STEP_SLOTS and np.any(counts[r, slot // 4] >= 2):
                    slot = (slot // 4 + 1) * 4
                if slot >= STEP_SLOTS:
                    return None
                counts[r, slot // 4] += 1
                slots.append(slot)
                slot += 1
            return slots, slot, counts

        def close(w: int):
            nonlocal nsteps
            lists[t, w, 1] |= 1
            nsteps += 1

        for lo, hi in zip(wstarts, wends):
            w = int(windows[lo])
            if hi - lo > LIST_MAX:
                raise ConfigError(f"{KEY} {STEPS}: K tile {w} of rows {t * bm}.. holds "
                                  f"{hi - lo} residual columns, more than a list's {LIST_MAX}")
            got = place(lo, hi, slot, counts)
            if got is None and slot > 0:   # the open step is full: the next one
                close(last_w)
                got = place(lo, hi, 0, np.zeros_like(counts))
            if got is None:
                raise ConfigError(f"{KEY} {STEPS}: the residual columns of K tile {w} of "
                                  f"rows {t * bm}.. do not fit one step")
            slots, slot, counts = got
            lists[t, w, 0] = hi - lo
            ent = lists[t, w, 4:4 + 2 * (hi - lo)].reshape(-1, 2)
            ent[:, 0] = ucols[lo:hi] - w * bk
            ent[:, 1] = slots
            for u, sl in zip(range(lo, hi), slots):
                seg = idx[starts[u]:ends[u]]
                out_rows.append(nsteps * bm + rloc[starts[u]:ends[u]])
                out_cols.append(np.full(seg.size, sl, dtype=np.int64))
                out_vals.append(res.values[seg])
            last_w = w
        if slot > 0:
            close(last_w)
    n = nsteps * bm
    if out_rows:
        r = np.concatenate(out_rows)
        c = np.concatenate(out_cols)
        v = np.concatenate(out_vals)
        o = np.lexsort((c, r))
        r, c, v = r[o], c[o], v[o]
    else:
        r = c = np.zeros(0, np.int64)
        v = np.zeros(0, res.values.dtype)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n))]).astype(np.int64)
    stacked = SparseMatrix((n, STEP_SLOTS), indptr, c, v, dtype=res.dtype)
    return lists.reshape(-1), first, stacked


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
    if p.config.get(KEY) == STEPS:
        return _unpack_steps(p)
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


def _unpack_steps(p: Nm24Plan) -> SparseMatrix:
    """s24 3: the 2:4 part (from the blocks) plus the steps' weights put
    back at their columns, read from the lists."""
    bm, bk = int(p.config["bm"]), int(p.config["bk"])
    tiles, kts = p.mp // bm, p.kp // bk
    ae, lists = unblock_weights(p.packed[p.values_offset:], p.mp, p.kp, bm, bk)
    runs = {k: v for k, v in p.config.items() if k != KEY}   # the 2:4 runs' own layout
    part = _NM24.unpack(dataclasses.replace(p, config=runs, packed=ae, values_offset=0,
                                            perm=None))
    first = np.frombuffer(p.packed, dtype="<i4", count=tiles, offset=p.rs_ptr).astype(np.int64)
    nsteps = int((lists[:, :, 1] & 1).sum())
    ends = step_end_words(lists, kts)
    if ends.tobytes() != p.packed[p.rs_ends:p.rs_ends + ends.nbytes]:
        raise ValueError("corrupt plan: residual step ends")
    if np.any(first != np.concatenate([[0], np.cumsum((lists[:, :, 1] & 1).sum(axis=1))[:-1]])):
        raise ValueError("corrupt plan: residual steps' first indices")
    dense = part.to_dense()
    if nsteps:
        n = nsteps * bm
        steps = _NM24.unpack(dataclasses.replace(
            p, config=runs, m=n, k=STEP_SLOTS, mp=n, kp=STEP_SLOTS,
            packed=p.packed[p.rs_a:p.rs_a + n // 64 * AE_STEP_BYTES], values_offset=0,
            perm=None)).to_dense()
        for t in range(tiles):
            j = int(first[t])
            for w in range(kts):
                cnt = int(lists[t, w, 0])
                if cnt > LIST_MAX:
                    raise ValueError("corrupt plan: a residual list's count")
                if lists[t, w, 1] & 1 and (cnt == 0 or j >= nsteps):
                    raise ValueError("corrupt plan: a residual step ends on an empty list")
                if cnt == 0:
                    continue
                if j >= nsteps:
                    raise ValueError("corrupt plan: residual columns past the last step")
                ent = lists[t, w, 4:4 + 2 * cnt].reshape(-1, 2).astype(np.int64)
                cols = w * bk + ent[:, 0]
                block = steps[j * bm:(j + 1) * bm, ent[:, 1]]
                rows = t * bm + np.arange(bm)
                keep = rows < p.m
                sub = dense[rows[keep][:, None], cols[None, :]]
                add = block[keep]
                if np.any((sub != 0) & (add != 0)):
                    raise ValueError("corrupt plan: a residual nonzero overlaps the 2:4 part")
                if cols.size and cols.max() >= p.k and np.any(add[:, cols >= p.k]):
                    raise ValueError("corrupt plan: residual nonzeros past K")
                ok = cols < p.k
                dense[np.ix_(rows[keep], cols[ok])] += add[:, ok]
                if lists[t, w, 1] & 1:
                    j += 1
    return SparseMatrix.from_dense(dense, dtype=p.dtype, perm=p.perm)
