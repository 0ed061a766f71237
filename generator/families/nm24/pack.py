"""2:4 packing: W (M x K) compressed into values (MP x KP/2) and 2-bit
indices, both shuffled, at pack time, into the order the mma.sp kernel
consumes them (templates/include/sf/nm24.cuh describes it):

    values  per 16-row tile `mt` and 32-wide K step `s`: 512 bytes; lane L's
            16 bytes are its four A registers (rows g, g+8; chunks t, t+4
            with g = L // 4, t = L % 4).
    meta    per (mt, s): 16 words; word 2g + h holds rows g (bits 0-15) and
            g + 8 (bits 16-31), chunks 4h .. 4h+3 of the step, one nibble
            idx0 | idx1 << 2 (idx0 < idx1) per chunk.

A group with fewer than two nonzeros stores zeros at a valid index pair.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ...matrix import SparseMatrix, to_device_bytes

KSTEP = 32          # dense K of one mma.sp m16n8k32
MTILE = 16          # rows of one mma.sp
FRAG_BYTES = 512    # compressed A of one (16-row tile, K step)
META_BYTES = 64     # metadata of one (16-row tile, K step)
ROW_CHUNK = 1024    # rows packed at a time (bounds host memory; a multiple of 64)

# Axis orders of the shuffles (see pack_values / pack_meta).
_VALUE_AXES = (0, 3, 2, 5, 4, 1, 6)
_META_AXES = (0, 3, 2, 4, 1, 5)
_WG_VALUE_AXES = (0, 3, 1, 4, 2, 5)


def _group_keys(matrix: SparseMatrix) -> np.ndarray:
    """One key per stored entry: row * groups_per_row + column // 4
    (non-decreasing, since columns are sorted within rows)."""
    groups = max(1, -(-matrix.cols // 4))
    return matrix.row_ids() * groups + matrix.indices.astype(np.int64) // 4


def first_violation(matrix: SparseMatrix) -> Optional[tuple[int, int]]:
    """(row, first column of the group) of the first aligned group of 4
    with more than 2 stored entries, or None when the matrix is 2:4."""
    keys = _group_keys(matrix)
    if keys.size < 3:
        return None
    bad = np.flatnonzero(keys[2:] == keys[:-2])
    if bad.size == 0:
        return None
    i = int(bad[0])
    return int(matrix.row_ids()[i]), int(matrix.indices[i]) // 4 * 4


def compress_rows(dense: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2:4 compression of padded rows (R x KP, KP % 4 == 0).  Returns values
    (R x KP/2: for group j, entries 2j and 2j+1) and nibbles (R x KP/4,
    idx0 | idx1 << 2 with idx0 < idx1).  `mask` marks stored entries; a group
    with one entry at p pairs it with p+1 (or 2 when p = 3), an empty group
    uses (0, 1)."""
    r, kp = dense.shape
    g = dense.reshape(r, kp // 4, 4)
    m = mask.reshape(r, kp // 4, 4)
    cnt = m.sum(axis=2)
    if np.any(cnt > 2):
        raise ValueError("more than 2 nonzeros in an aligned group of 4")
    first = np.argmax(m, axis=2)
    last = 3 - np.argmax(m[:, :, ::-1], axis=2)
    idx0 = np.where(cnt == 2, first, np.where(cnt == 1, np.minimum(first, 2), 0))
    idx1 = np.where(cnt == 2, last, np.where(cnt == 1, np.where(first < 3, first + 1, 3), 1))
    v0 = np.take_along_axis(g, idx0[:, :, None], axis=2)[:, :, 0]
    v1 = np.take_along_axis(g, idx1[:, :, None], axis=2)[:, :, 0]
    values = np.stack([v0, v1], axis=2).reshape(r, kp // 2)
    nibbles = (idx0 | (idx1 << 2)).astype(np.uint8)
    return values, nibbles


def pack_values(values: np.ndarray) -> np.ndarray:
    """Compressed values (R x KP/2, R % 16 == 0) in fragment order:
    [tile][step][lane][register][half]."""
    r, kh = values.shape
    v = values.reshape(r // 16, 2, 8, kh // 16, 2, 4, 2)  # mt rlo g s rhi t h
    return np.ascontiguousarray(v.transpose(_VALUE_AXES)).ravel()


def unpack_values(flat: np.ndarray, r: int, kh: int) -> np.ndarray:
    v = flat.reshape(r // 16, kh // 16, 8, 4, 2, 2, 2)
    return np.ascontiguousarray(v.transpose(np.argsort(_VALUE_AXES))).reshape(r, kh)


def pack_values_sm90(values: np.ndarray) -> np.ndarray:
    """Compressed values (R x KP/2, R % 64 == 0) in sparse wgmma order:
    per (64-row tile, 32-wide K step) the 64 x 16 values in the no-swizzle
    K-major operand layout, [tile][step][r / 8][c / 8][r % 8][c % 8]."""
    r, kh = values.shape
    v = values.reshape(r // 64, 8, 8, kh // 16, 2, 8)  # t rg rr s cg cr
    return np.ascontiguousarray(v.transpose(_WG_VALUE_AXES)).ravel()


def unpack_values_sm90(flat: np.ndarray, r: int, kh: int) -> np.ndarray:
    v = flat.reshape(r // 64, kh // 16, 8, 2, 8, 8)
    return np.ascontiguousarray(v.transpose(np.argsort(_WG_VALUE_AXES))).reshape(r, kh)


def pack_meta(nibbles: np.ndarray) -> np.ndarray:
    """Nibbles (R x KP/4) as metadata words: [tile][step][g][h] (uint32)."""
    r, kq = nibbles.shape
    n = nibbles.reshape(r // 16, 2, 8, kq // 8, 2, 4).astype(np.uint32)  # mt rh g s h j
    n = n.transpose(_META_AXES)                                         # mt s g h rh j
    shifts = (16 * np.arange(2)[:, None] + 4 * np.arange(4)[None, :]).astype(np.uint32)
    return np.ascontiguousarray((n << shifts).sum(axis=(-2, -1), dtype=np.uint32)).ravel()


def unpack_meta(words: np.ndarray, r: int, kq: int) -> np.ndarray:
    w = words.reshape(r // 16, kq // 8, 8, 2)
    shifts = (16 * np.arange(2)[:, None] + 4 * np.arange(4)[None, :]).astype(np.uint32)
    n = (w[..., None, None] >> shifts) & 0xF                            # mt s g h rh j
    n = n.transpose(np.argsort(_META_AXES))                             # mt rh g s h j
    return np.ascontiguousarray(n).reshape(r, kq).astype(np.uint8)


AE_STEP = 2048 + 4 * META_BYTES   # one 64-row tile x one K step: values, then metadata


def interleave_ae(values: bytes, meta: bytes, mp: int, kp: int) -> bytes:
    """The TMA path's runs: per (64-row tile t, K step s), AE_STEP bytes at
    (t * KSTEPS + s) * AE_STEP: the tile's values in sparse wgmma order
    (2048 bytes), then the metadata of its four 16-row tiles (4 x 64)."""
    ks = kp // KSTEP
    v = np.frombuffer(values, np.uint8).reshape(mp // 64, ks, 2048)
    e = np.frombuffer(meta, np.uint8).reshape(mp // 64, 4, ks, META_BYTES).transpose(0, 2, 1, 3)
    return np.concatenate([v, e.reshape(mp // 64, ks, 4 * META_BYTES)], axis=2).tobytes()


def split_ae(ae: bytes, mp: int, kp: int) -> tuple[bytes, bytes]:
    """interleave_ae's inverse: (values in sparse wgmma order, metadata in
    mma.sp order)."""
    ks = kp // KSTEP
    a = np.frombuffer(ae, np.uint8).reshape(mp // 64, ks, AE_STEP)
    e = a[:, :, 2048:].reshape(mp // 64, ks, 4, META_BYTES).transpose(0, 2, 1, 3)
    return a[:, :, :2048].tobytes(), np.ascontiguousarray(e).tobytes()


def compress_entries(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, r: int,
                     kp: int) -> tuple[np.ndarray, np.ndarray]:
    """compress_rows from stored entries (row-major, columns sorted within
    rows, at most two in each aligned group of 4; rows < r, cols < kp)
    without a dense R x KP array: values (R x KP/2, vals' dtype, zero
    where nothing is stored) and nibbles (R x KP/4), the same rules."""
    gq = kp // 4
    values = np.zeros((r, kp // 2), dtype=vals.dtype)
    nibbles = np.full((r, gq), 0 | (1 << 2), dtype=np.uint8)    # an empty group: (0, 1)
    if rows.size == 0:
        return values, nibbles
    key = rows.astype(np.int64) * gq + cols // 4
    pos = (cols % 4).astype(np.uint8)
    second = np.zeros(key.size, dtype=bool)          # the second entry of its group
    second[1:] = key[1:] == key[:-1]
    paired = second.copy()
    paired[:-1] |= second[1:]
    # a lone entry at p keeps slot 0 and pairs with p + 1, or at 3 slot 1 with 2
    slot = np.where(paired, second, pos == 3).astype(np.int64)
    values.reshape(-1)[key * 2 + slot] = vals
    lone = ~paired
    nib = nibbles.reshape(-1)
    p = pos[lone]
    nib[key[lone]] = np.where(p < 3, p | ((p + 1) << 2), 2 | (3 << 2))
    first = np.flatnonzero(second) - 1
    nib[key[first]] = pos[first] | (pos[first + 1] << 2)
    return values, nibbles


def pack_matrix(matrix: SparseMatrix, dtype: str, mp: int, kp: int,
                wgmma: bool = False) -> tuple[bytes, bytes]:
    """(values bytes, metadata bytes) of `matrix` padded to mp x kp; the
    values in mma.sp fragment order, or with `wgmma` (mp % 64 == 0) in
    sparse wgmma operand order.  The metadata is the same for both.  The
    values are converted to `dtype` once and shuffled as 16-bit words."""
    m, k = matrix.shape
    ks = kp // KSTEP
    words = np.frombuffer(to_device_bytes(matrix.values, dtype), dtype=np.uint16)
    vals_out = np.empty(mp * kp // 2, dtype=np.uint16)
    meta_out = np.empty((mp // MTILE) * ks * 16, dtype=np.uint32)
    rows_of = matrix.row_ids()
    shuffle = pack_values_sm90 if wgmma else pack_values
    for r0 in range(0, mp, ROW_CHUNK):
        r1 = min(mp, r0 + ROW_CHUNK)
        lo, hi = (matrix.indptr[r0], matrix.indptr[min(r1, m)]) if r0 < m else (0, 0)
        values, nibbles = compress_entries(rows_of[lo:hi] - r0, matrix.indices[lo:hi],
                                           words[lo:hi], r1 - r0, kp)
        vals_out[r0 * kp // 2:r1 * kp // 2] = shuffle(values)
        meta_out[r0 // MTILE * ks * 16:r1 // MTILE * ks * 16] = pack_meta(nibbles)
    return vals_out.astype("<u2").tobytes(), meta_out.astype("<u4").tobytes()
