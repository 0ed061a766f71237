"""The tensor-core format of `csr`: W as tiled bitmaps in the order of the
mma fragments (templates/include/sf/csr_tc.cuh describes the layout the
kernel reads; this module writes it, reads it back and emulates the lanes'
decode).

W (M x K) is cut into 16 x 16 tiles.  A row block of `bm` rows (bm / 16
strips) keeps the k-steps (16-column slices) where any of its rows has a
nonzero; `ks` of them at a time form a stage.  Each tile has a 48-byte
record (its 256-bit bitmap, a byte of prefix count per bitmap word, the
offset of its first value within the stage, its count) and its nonzeros
in fragment order:

    lane = 4 g + t, slot = 2 reg + half, bit = 8 lane + slot, for the entry
    at tile row  g + 8 (reg % 2)  and tile column  2 t + half + 8 (reg // 2)

(g < 8, t < 4, reg < 4: the mma.sync m16n8k16 A fragment of the PTX ISA,
a[reg] holding two consecutive columns).  Stored bytes per 16 x 16 tile:
48 of record and 2 per nonzero: at density d, 0.19 + 2 d bytes per entry
of W against dense's 2.

The lane-record variant (`lanes`, for the TMA kernels) stores instead a
u32 per lane and tile, (slot mask << 24) | offset: the lane's 8-bit slot
mask and where its values start (in 16-bit values from the stage's first),
and as values the lane's nonzero A registers whole (both halves, a zero in
an empty slot of a register that holds a nonzero), in tile, lane, register
order.  A lane reads its record and then each register with a set slot by
one aligned 4-byte load.  128 bytes of record a tile and about 4 bytes a
nonzero register.

The register-values variant (`regvals`, for the mma.sync kernels) keeps
the bitmap records and stores the values as the lane records do, the
nonzero registers whole: a record's p[q] and base count registers of the
words before (base: in 16-bit values from the stage's first) and its count
is the tile's nonzero registers.  A lane finds its first register from its
word as with the bitmaps (a register is nonzero where either of its two
bits is set) and then reads each by one 4-byte load: half the loads and no
packing of the bitmaps' decode, for 48 bytes a tile and about 4 bytes a
nonzero register.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...matrix import SparseMatrix, from_device_bytes, round_to_dtype, to_device_bytes

MAGIC = 0x42435346           # 'FSCB' little-endian
ALIGN = 16
TILE = 16
REC_BYTES = 48
HEADER_WORDS = 16            # uint32: magic, m, k, nnz, bm, ks, dtype, blocks, stages, has_bias,
                             # windows, lanes, regvals, fixed stride (0: none)
LANE_REC_BYTES = 128         # the lane-record variant: a u32 a lane
LANE_OFFSET_BITS = 24
DTYPE_CODES = {"fp16": 1, "bf16": 2}
RECORD = np.dtype([("w", "<u4", (8,)), ("p", "u1", (8,)), ("base", "<u4"), ("count", "<u4")])
assert RECORD.itemsize == REC_BYTES


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def slot_position(bit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) within a 16 x 16 tile of each bit of its bitmap."""
    bit = np.asarray(bit, dtype=np.int64)
    lane, slot = bit // 8, bit % 8
    g, t = lane // 4, lane % 4
    reg, half = slot // 2, slot % 2
    return g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)


def position_bit(row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """The bitmap bit of tile entry (row, col): slot_position's inverse."""
    row = np.asarray(row, dtype=np.int64)
    col = np.asarray(col, dtype=np.int64)
    g, hi_r = row % 8, row // 8
    t, half, hi_k = (col % 8) // 2, col % 2, col // 8
    return 8 * (4 * g + t) + 2 * (hi_r + 2 * hi_k) + half


# position_bit of every entry of a tile, indexed by 16 row + col
_TILE_BIT = position_bit(np.arange(TILE * TILE) // TILE, np.arange(TILE * TILE) % TILE)


def _unique_inverse(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True) for keys in [0, size), by
    marking and counting rather than sorting (a 4096 x 11008 matrix at
    density 0.5 has 22.5 M nonzeros: a sort of them took seconds a call),
    unless the range is far larger than the keys."""
    if size > 8 * key.size + (1 << 20):
        uniq, inv = np.unique(key, return_inverse=True)
        return uniq.astype(np.int64), inv.astype(np.int64).reshape(-1)
    present = np.zeros(size, dtype=bool)
    present[key] = True
    uniq = np.flatnonzero(present)
    rank = np.zeros(size, dtype=np.int64 if uniq.size >= 1 << 31 else np.int32)
    rank[uniq] = np.arange(uniq.size, dtype=rank.dtype)
    return uniq.astype(np.int64), rank[key].astype(np.int64)


@dataclass
class Layout:
    """The stage structure of a matrix for (bm, ks), before packing: what
    the search space needs (sizes) and what the packer fills."""
    bm: int
    ks: int
    windows: bool
    blocks: np.ndarray        # int64 [slots]: the row block of each schedule slot
    first_stage: np.ndarray   # int64 [slots]
    stages: np.ndarray        # int64 [slots]
    entry_block: np.ndarray   # int64 [entries]: block of each nonempty (block, k-step)
    entry_kstep: np.ndarray   # int64 [entries]
    entry_stage: np.ndarray   # int64 [entries]: global stage
    entry_j: np.ndarray       # int64 [entries]: position in its stage
    stage_values: np.ndarray  # int64 [total stages]: nonzeros per stage
    stage_regs: np.ndarray    # int64 [total stages]: nonzero A registers per stage
    kt: int                   # k-steps a block row (whole windows with `windows`)

    @property
    def total_stages(self) -> int:
        return int(self.stage_values.size)

    @property
    def vmax(self) -> int:
        return int(self.stage_values.max()) if self.stage_values.size else 0

    @property
    def smax(self) -> int:
        """The most stages of one row block."""
        return int(self.stages.max()) if self.stages.size else 0


def tile_counts(matrix: SparseMatrix) -> tuple[np.ndarray, np.ndarray]:
    """The nonzeros and the nonzero A registers (columns 2c and 2c + 1 of
    a row: one u32) of every 16 x 16 tile, int64 [row tiles, k-steps];
    computed once a matrix.  Every layout's sizes follow from them, with
    no work per nonzero (a 4096 x 11008 matrix at density 0.5 has 22.5 M
    nonzeros, and the search space asks for about 18 layouts)."""
    def build():
        m, k = matrix.shape
        kt, rt = max(1, -(-k // TILE)), -(-m // TILE)
        rows, cols = matrix.row_ids(), matrix.indices
        t = rows // TILE * kt + cols // TILE
        vals = np.bincount(t, minlength=rt * kt)
        # a nonzero at an odd column whose left neighbour is stored shares its
        # register (columns are sorted and distinct within a row)
        shared = np.zeros(cols.size, dtype=bool)
        if cols.size > 1:
            shared[1:] = (cols[1:] % 2 == 1) & (cols[1:] == cols[:-1] + 1) & \
                (rows[1:] == rows[:-1])
        regs = vals - np.bincount(t[shared], minlength=rt * kt)
        return (vals.astype(np.int64).reshape(rt, kt), regs.astype(np.int64).reshape(rt, kt))
    return matrix.cached(("csr.bitmap.tile_counts",), build)


def layout(matrix: SparseMatrix, bm: int, ks: int, windows: bool = False) -> Layout:
    """Blocks, their nonempty k-steps in stages of `ks`, the schedule (the
    blocks with the most stages first; ties in row order).  `windows`: a
    stage is instead a whole window of `ks` consecutive k-steps from a
    multiple of `ks` (every window of a block holding a nonzero, its empty
    k-steps as empty tiles, the last window's past K too), so that one
    tensor-map box loads the stage's X (the TMA kernels).  From the tiles'
    counts (tile_counts); which entry each nonzero falls in: nz_entry."""
    m, k = matrix.shape
    kt = max(1, -(-k // TILE))
    nb = -(-m // bm) if m else 0
    ms = bm // TILE
    ktw = -(-kt // ks) * ks if windows else kt   # k-steps of whole windows
    sums = []
    for counts in tile_counts(matrix):
        per = np.zeros((nb * ms, ktw), dtype=np.int64)
        per[:counts.shape[0], :kt] = counts
        sums.append(per.reshape(nb, ms, ktw).sum(axis=1).ravel())   # per (block, k-step)
    vals, regs = sums
    if windows:   # every k-step of the windows that hold a nonzero
        present = np.repeat(vals.reshape(-1, ks).sum(axis=1) > 0, ks)
    else:
        present = vals > 0
    uniq = np.flatnonzero(present)
    eb, ek = uniq // ktw, uniq % ktw
    per_block = np.bincount(eb, minlength=nb).astype(np.int64)
    stages = -(-per_block // ks)
    order = np.argsort(-stages, kind="stable")
    slot_stages = stages[order]
    first = np.zeros(nb, dtype=np.int64)
    if nb:
        first[1:] = np.cumsum(slot_stages)[:-1]
    block_first = np.empty(nb, dtype=np.int64)
    block_first[order] = first
    block_entry0 = np.zeros(nb, dtype=np.int64)
    if nb:
        block_entry0[1:] = np.cumsum(per_block)[:-1]
    e_idx = np.arange(uniq.size, dtype=np.int64) - block_entry0[eb]
    e_stage = block_first[eb] + e_idx // ks
    total = int(stages.sum())

    def per_stage(w):
        return np.bincount(e_stage, weights=w[uniq], minlength=total).astype(np.int64)
    return Layout(bm, ks, bool(windows), order.astype(np.int64), first, slot_stages, eb, ek,
                  e_stage, e_idx % ks, per_stage(vals), per_stage(regs), ktw)


def cached_layout(matrix: SparseMatrix, bm: int, ks: int, windows: bool = False) -> Layout:
    return matrix.cached(("csr.bitmap.layout", bm, ks, bool(windows)),
                         lambda: layout(matrix, bm, ks, windows))


def nz_entry(matrix: SparseMatrix, lay: Layout) -> np.ndarray:
    """The layout's entry (nonempty block and k-step) of each nonzero,
    int64 [nnz] (the packer's; cached on the matrix)."""
    def build():
        nb = lay.blocks.size
        index = np.full(nb * lay.kt, -1, dtype=np.int64)
        index[lay.entry_block * lay.kt + lay.entry_kstep] = np.arange(lay.entry_block.size)
        return index[matrix.row_ids() // lay.bm * lay.kt + matrix.indices // TILE]
    return matrix.cached(("csr.bitmap.nz_entry", lay.bm, lay.ks, lay.windows), build)


@dataclass
class LaneRegs:
    """The lane-record variant's registers: every nonzero A register (a
    u32 of two values) of the layout, in tile, lane, register order."""
    key: np.ndarray           # int64 [regs]: (tile * 32 + lane) * 4 + reg
    of_nz: np.ndarray         # int64 [nnz]: the register of each nonzero
    stage_halves: np.ndarray  # int64 [total stages]: 16-bit values a stage stores

    @property
    def vmax(self) -> int:
        return int(self.stage_halves.max()) if self.stage_halves.size else 0


def _nz_tile_bit(matrix: SparseMatrix, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Each nonzero's tile (stage, entry, strip order) and its bit (the
    bits depend on the matrix alone: computed once, int16)."""
    ms = lay.bm // TILE
    rows = matrix.row_ids()
    tile = ((lay.entry_stage * lay.ks + lay.entry_j) * ms)[nz_entry(matrix, lay)] + \
        (rows % lay.bm) // TILE
    bit = matrix.cached(("csr.bitmap.bit",), lambda: _TILE_BIT.astype(np.int16)[
        (rows % TILE) * TILE + matrix.indices % TILE])
    return tile, bit


def lane_regs(matrix: SparseMatrix, bm: int, ks: int, windows: bool = False) -> LaneRegs:
    """The registers the lane-record variant stores (cached on the matrix)."""
    def build():
        lay = cached_layout(matrix, bm, ks, windows)
        tile, bit = _nz_tile_bit(matrix, lay)
        key, of_nz = _unique_inverse(tile * 128 + bit // 2,
                                     lay.total_stages * ks * (bm // TILE) * 128)
        return LaneRegs(key, of_nz, 2 * lay.stage_regs)
    return matrix.cached(("csr.bitmap.lane_regs", bm, ks, bool(windows)), build)


@dataclass
class Packed:
    """A packed buffer and where its sections start."""
    data: bytes
    offsets: dict              # header, blocks, kid, rec, voff, val, bias (0 without)
    num_blocks: int
    total_stages: int
    vmax: int
    smax: int
    fixed_stride: int = 0      # `fixed`: the values a stage (every stage's start a multiple)


def regular(lay: Layout) -> bool:
    """Whether the schedule is arithmetic: stages of k-steps, not windows,
    and every row block holds every k-step (so the blocks run in row
    order, each with the same number of stages, and stage s of a block
    names k-steps s ks .. s ks + ks - 1, the last stage's padding
    repeating the last).  Random patterns at the densities of pruned
    models are (a 16-column k-step of a 32-row block is empty with
    probability (1 - d)^512)."""
    nb = lay.blocks.size
    return bool(nb and not lay.windows and lay.entry_block.size == nb * lay.kt
                and np.array_equal(lay.blocks, np.arange(nb)))


def fixed_stride(stage_values: np.ndarray) -> int:
    """The values of a stage under `fixed` offsets: the largest stage's,
    rounded up to 8 (16 bytes)."""
    return max(8, -(-int(stage_values.max(initial=0)) // 8) * 8)


def _spread(vals: np.ndarray, voff: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Each stage's values moved to a multiple of `stride`, zeros between."""
    counts = np.diff(voff)
    out = np.zeros((counts.size, stride), dtype=vals.dtype)
    # (a boolean mask fills in row-major order: each stage's values at its row's start)
    out[np.arange(stride)[None, :] < counts[:, None]] = vals
    return out.reshape(-1), np.arange(counts.size + 1, dtype=np.int64) * stride


def pack(matrix: SparseMatrix, dtype: str, bm: int, ks: int,
         bias: Optional[np.ndarray] = None, windows: bool = False,
         lanes: bool = False, regvals: bool = False, fixed: bool = False) -> Packed:
    """The packed buffer of `matrix` (values rounded to `dtype`) for row
    blocks of `bm` rows and stages of `ks` k-steps (see the module
    docstring and csr_tc.cuh; `windows`: stages of whole windows of k-steps,
    layout(); `lanes`: the lane-record variant; `regvals`: the
    register-values variant; `fixed`: a regular schedule (regular()) whose
    stages' values start at multiples of one stride, so that a kernel
    computes every offset from its block and stage instead of reading the
    tables first)."""
    if lanes and regvals:
        raise ValueError("lane records and register values are two variants: one at a time")
    if dtype not in DTYPE_CODES:
        raise ValueError(f"the tensor-core csr format holds fp16 or bf16, not {dtype}")
    if bm % TILE or bm < TILE or ks < 1:
        raise ValueError(f"bm must be a multiple of 16 and ks >= 1, got {bm}, {ks}")
    m, k = matrix.shape
    if m < 1 or k < 1:
        raise ValueError(f"csr needs at least one row and one column, got {m} x {k}")
    lay = cached_layout(matrix, bm, ks, windows)
    if fixed and not regular(lay):
        raise ValueError("fixed offsets need a regular schedule: every row block holding "
                         "every k-step (and no windows)")
    ms = bm // TILE
    nb = lay.blocks.size
    total = lay.total_stages
    ntiles = total * ks * ms

    # per nonzero: its tile and bit
    tile, bit = _nz_tile_bit(matrix, lay)
    if lanes:
        rec, vals, voff, vmax = _pack_lanes(matrix, dtype, bm, ks, windows, tile, bit, ntiles)
    elif regvals:
        rec, vals, voff, vmax = _pack_regvals(matrix, dtype, bm, ks, windows, tile, bit, ntiles)
    else:
        rec, vals, voff = _pack_bitmaps(matrix, dtype, ks, ms, total, tile, bit, ntiles)
        vmax = lay.vmax
    stride = 0
    if fixed:
        stride = fixed_stride(np.diff(voff))
        vals, voff = _spread(vals, voff, stride)
        vmax = stride

    # k-step of each stage entry; the padding entries of a last stage repeat
    # the block's last k-step (their tiles are empty)
    kid = np.full(total * ks, -1, dtype=np.int64)
    kid[lay.entry_stage * ks + lay.entry_j] = lay.entry_kstep
    if kid.size:
        idx = np.where(kid >= 0, np.arange(kid.size), 0)
        np.maximum.accumulate(idx, out=idx)
        kid = kid[idx]
        kid[kid < 0] = 0

    blocks = np.zeros((nb, 4), dtype=np.int32)
    blocks[:, 0] = lay.first_stage
    blocks[:, 1] = lay.stages
    blocks[:, 2] = lay.blocks * bm

    head = np.zeros(HEADER_WORDS, dtype=np.uint32)
    head[:14] = [MAGIC, m, k, matrix.nnz, bm, ks, DTYPE_CODES[dtype], nb, total,
                 int(bias is not None), int(windows), int(lanes), int(regvals), stride]
    sections = [("header", head.tobytes()), ("blocks", blocks.tobytes()),
                ("kid", kid.astype(np.int32).tobytes()), ("rec", rec.tobytes()),
                ("voff", voff.astype(np.uint32).tobytes()),
                # 16 bytes of slack: the kernel copies whole 16-byte chunks
                ("val", to_device_bytes(vals, dtype) + b"\0" * 16)]
    if bias is not None:
        b = np.zeros(nb * bm, dtype=np.float32)
        b[:m] = np.asarray(bias, dtype=np.float32).reshape(-1)
        sections.append(("bias", b.tobytes()))
    offsets, out = {}, bytearray()
    for name, data in sections:
        offsets[name] = len(out)
        out += data + b"\0" * (_align(len(data)) - len(data))
    offsets.setdefault("bias", 0)
    return Packed(bytes(out), offsets, nb, total, vmax, lay.smax, stride)


def _pack_bitmaps(matrix: SparseMatrix, dtype: str, ks: int, ms: int, total: int,
                  tile: np.ndarray, bit: np.ndarray, ntiles: int):
    """The bitmap records, the values in tile and bit order, and the value
    offsets of the stages."""
    order = np.argsort(tile * 256 + bit, kind="stable")   # (tile, bit): one key, one sort
    vals = round_to_dtype(matrix.values, dtype)[order]
    rec = np.zeros(ntiles, dtype=RECORD)
    voff = np.zeros(total + 1, dtype=np.int64)
    if ntiles:
        per_word = np.bincount(tile * 8 + bit // 32, minlength=ntiles * 8).reshape(ntiles, 8)
        start = _fill_records(rec, tile, bit, per_word)
        voff[:-1] = start[::ks * ms]
        voff[-1] = matrix.nnz
        rec["base"] = (start - np.repeat(voff[:-1], ks * ms)).astype(np.uint32)
    return rec, vals, voff


def _fill_records(rec: np.ndarray, tile: np.ndarray, bit: np.ndarray,
                  per_word: np.ndarray) -> np.ndarray:
    """Fills the bitmap records' words, prefix counts (p) and counts from
    the set bits and what each word counts (values, or registers); returns
    each tile's first, counted the same way (the caller sets base)."""
    ntiles = rec.size
    words = np.bincount(tile * 8 + bit // 32, weights=np.ldexp(1.0, (bit % 32).astype(np.int32)),
                        minlength=ntiles * 8)
    rec["w"] = words.astype(np.uint64).astype(np.uint32).reshape(ntiles, 8)
    pre = np.zeros((ntiles, 8), dtype=np.int64)
    pre[:, 1:] = np.cumsum(per_word, axis=1)[:, :-1]
    rec["p"] = pre.astype(np.uint8)
    counts = per_word.sum(axis=1)
    rec["count"] = counts.astype(np.uint32)
    start = np.zeros(ntiles, dtype=np.int64)
    start[1:] = np.cumsum(counts)[:-1]
    return start


def _register_values(matrix: SparseMatrix, dtype: str, bm: int, ks: int, windows: bool,
                     bit: np.ndarray):
    """The nonzero registers whole (both halves, a zero in an empty one) in
    tile, lane, register order, and the stages' offsets into them (in
    16-bit values): the values of both register variants."""
    regs = lane_regs(matrix, bm, ks, windows)
    vals = np.zeros(2 * regs.key.size, dtype=np.float32)
    vals[2 * regs.of_nz + bit % 2] = round_to_dtype(matrix.values, dtype)
    voff = np.zeros(regs.stage_halves.size + 1, dtype=np.int64)
    np.cumsum(regs.stage_halves, out=voff[1:])
    return regs, vals, voff


def _pack_regvals(matrix: SparseMatrix, dtype: str, bm: int, ks: int, windows: bool,
                  tile: np.ndarray, bit: np.ndarray, ntiles: int):
    """The register-values variant's records (the bitmaps, p and base
    counting registers), values, value offsets and largest stage."""
    regs, vals, voff = _register_values(matrix, dtype, bm, ks, windows, bit)
    rec = np.zeros(ntiles, dtype=RECORD)
    if ntiles:
        # registers a word (key = (tile * 32 + lane) * 4 + reg: a word is 4 lanes)
        per_word = np.bincount(regs.key // 16, minlength=ntiles * 8).reshape(ntiles, 8)
        start = _fill_records(rec, tile, bit, per_word)
        stage = np.arange(ntiles) // (ks * (bm // TILE))
        rec["base"] = (2 * start - voff[stage]).astype(np.uint32)
    return rec, vals, voff, regs.vmax


def _pack_lanes(matrix: SparseMatrix, dtype: str, bm: int, ks: int, windows: bool,
                tile: np.ndarray, bit: np.ndarray, ntiles: int):
    """The lane-record variant's records, values, value offsets (in 16-bit
    values) and largest stage."""
    regs, vals, voff = _register_values(matrix, dtype, bm, ks, windows, bit)
    masks = np.bincount(tile * 32 + bit // 8, weights=np.ldexp(1.0, (bit % 8).astype(np.int32)),
                        minlength=ntiles * 32).astype(np.int64)
    # each lane's first register, from its stage's first value
    tl, first = np.unique(regs.key // 4, return_index=True)
    stage = tl // (32 * ks * (bm // TILE))
    offset = np.zeros(ntiles * 32, dtype=np.int64)
    offset[tl] = 2 * first - voff[stage]
    if offset.size and offset.max() >= 1 << LANE_OFFSET_BITS:
        raise ValueError("a stage holds too many values for the lane records' offsets")
    rec = ((masks << LANE_OFFSET_BITS) | offset).astype(np.uint32).reshape(ntiles, 32)
    return rec, vals, voff, regs.vmax


# ---- reading a packed buffer back ---------------------------------------------------

@dataclass
class Sections:
    m: int
    k: int
    nnz: int
    bm: int
    ks: int
    dtype: str
    blocks: np.ndarray   # int32 [nb, 4]
    kid: np.ndarray      # int32 [stages * ks]
    rec: np.ndarray      # RECORD [stages * ks * ms] (lanes: uint32 [stages * ks * ms, 32])
    voff: np.ndarray     # uint32 [stages + 1]
    values: np.ndarray   # float32 [nnz] (lanes: [voff[-1]], the registers' values)
    bias: Optional[np.ndarray]
    lanes: bool = False
    regvals: bool = False
    fixed_stride: int = 0


def sections(packed: bytes) -> Sections:
    """The sections of a packed buffer, located from its header alone."""
    head = np.frombuffer(packed, dtype="<u4", count=HEADER_WORDS)
    if head[0] != MAGIC:
        raise ValueError("not a tensor-core csr buffer (bad magic)")
    m, k, nnz, bm, ks, code, nb, total, has_bias = (int(v) for v in head[1:10])
    lanes, regvals, stride = bool(head[11]), bool(head[12]), int(head[13])
    dtype = {v: n for n, v in DTYPE_CODES.items()}[code]
    ms = bm // TILE
    pos = _align(HEADER_WORDS * 4)

    def take(dt, count):
        nonlocal pos
        a = np.frombuffer(packed, dtype=dt, count=count, offset=pos).copy()
        pos += _align(a.nbytes)
        return a

    blocks = take("<i4", nb * 4).reshape(nb, 4)
    kid = take("<i4", total * ks)
    if lanes:
        rec = take("<u4", total * ks * ms * 32).reshape(-1, 32)
    else:
        rec = take(RECORD, total * ks * ms)
    voff = take("<u4", total + 1)
    nval = int(voff[-1]) if lanes or regvals or stride else nnz
    raw = packed[pos:pos + 2 * nval]
    values = from_device_bytes(raw, dtype, nval)
    pos += _align(2 * nval + 16)
    bias = take("<f4", nb * bm)[:m] if has_bias else None
    return Sections(m, k, nnz, bm, ks, dtype, blocks, kid, rec, voff, values, bias, lanes,
                    regvals, stride)


def _lane_slots(s: Sections) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lane-record variant's set slots: (tile, bit, value index) each,
    read as a lane does (its register's rank among its nonzero registers)."""
    ntiles = s.rec.shape[0]
    ms = s.bm // TILE
    rec = s.rec.astype(np.int64)
    mask = rec >> LANE_OFFSET_BITS
    off = rec & ((1 << LANE_OFFSET_BITS) - 1)
    slot_set = (mask[:, :, None] >> np.arange(8)) & 1          # [tiles, 32, 8]
    reg_set = slot_set.reshape(ntiles, 32, 4, 2).max(axis=3)     # [tiles, 32, 4]
    rank = np.cumsum(reg_set, axis=2) - reg_set
    stage = np.arange(ntiles) // (s.ks * ms)
    t, lane, slot = np.nonzero(slot_set)
    vidx = (s.voff[stage[t]].astype(np.int64) + off[t, lane] + 2 * rank[t, lane, slot // 2]
            + slot % 2)
    return t, 8 * lane + slot, vidx


def _repeats(a: np.ndarray, is_sorted: bool = False) -> bool:
    """Whether any value of `a` occurs twice."""
    a = a if is_sorted else np.sort(a)
    return bool(a.size > 1 and np.any(a[1:] == a[:-1]))


def unpack(packed: bytes) -> tuple[SparseMatrix, Optional[np.ndarray]]:
    """The matrix (and bias) a packed buffer holds, read the way the format
    defines it: every set bit of a tile is a nonzero, the tile's values in
    bit order from voff[stage] + base."""
    s = sections(packed)
    ms = s.bm // TILE
    ntiles = s.rec.shape[0]
    stage_of = np.arange(ntiles) // (s.ks * ms)
    j_of = np.arange(ntiles) // ms % s.ks
    strip_of = np.arange(ntiles) % ms
    # the first row of each stage's block
    stage_row = np.zeros(s.voff.size - 1, dtype=np.int64)
    for first, count, row, _ in s.blocks:
        stage_row[first:first + count] = row
    if s.lanes:
        t_idx, b_idx, vidx = _lane_slots(s)
    else:
        bits = np.unpackbits(s.rec["w"].astype("<u4").view(np.uint8).reshape(ntiles, 32),
                             axis=1, bitorder="little").astype(bool)
        t_idx, b_idx = np.nonzero(bits)
        counts = bits.sum(axis=1)
        if s.regvals:   # a set bit's value: 2 x its register's rank in the tile + its half
            reg_set = bits.reshape(ntiles, 32, 4, 2).any(axis=3).reshape(ntiles, 128)
            nregs = reg_set.sum(axis=1)
            if np.any(nregs != s.rec["count"]):
                raise ValueError("corrupt buffer: a tile's count differs from its bitmap")
            rank = (np.cumsum(reg_set, axis=1) - reg_set)[t_idx, b_idx // 2]
            vidx = (s.voff[stage_of[t_idx]].astype(np.int64) + s.rec["base"][t_idx] + 2 * rank
                    + b_idx % 2)
        else:
            if np.any(counts != s.rec["count"]):
                raise ValueError("corrupt buffer: a tile's count differs from its bitmap")
            rank = np.arange(t_idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
            vidx = s.voff[stage_of[t_idx]].astype(np.int64) + s.rec["base"][t_idx] + rank
    if vidx.size and (vidx.max() >= s.values.size or _repeats(vidx)):
        raise ValueError("corrupt buffer: tiles' values overlap or overrun")
    tr, tc = slot_position(b_idx)
    rows = stage_row[stage_of[t_idx]] + 16 * strip_of[t_idx] + tr
    cols = 16 * s.kid[stage_of[t_idx] * s.ks + j_of[t_idx]].astype(np.int64) + tc
    if rows.size and (rows.max() >= s.m or cols.max() >= s.k):
        raise ValueError("corrupt buffer: a nonzero in the padding")
    dense_key = rows * s.k + cols
    order = np.argsort(dense_key, kind="stable")
    if _repeats(dense_key[order], is_sorted=True):
        raise ValueError("corrupt buffer: an entry stored twice")
    indptr = np.zeros(s.m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=s.m), out=indptr[1:])
    mat = SparseMatrix((s.m, s.k), indptr, cols[order], s.values[vidx[order]], dtype=s.dtype)
    return mat, s.bias


# ---- the lanes' decode, emulated -----------------------------------------------------

def emulate_decode(packed: bytes, stage: int, j: int, strip: int) -> np.ndarray:
    """The A fragment registers every lane of a warp builds for tile (stage,
    entry j, strip), computed as decode_tile does (the lane's bitmap word,
    its prefix byte, a popcount, then its values in slot order): float32
    [32 lanes, 4 registers, 2 halves]."""
    s = sections(packed)
    ms = s.bm // TILE
    r = s.rec[(stage * s.ks + j) * ms + strip]
    v0 = int(s.voff[stage])
    shift = v0 % 8                       # where the stage's first value lands
    chunk = s.values[v0 - shift:]        # the copy starts at v0 rounded down
    out = np.zeros((32, 4, 2), dtype=np.float32)
    def registers(lane, mask, ptr):      # each register with a set slot: one 4-byte load
        for reg in range(4):
            if (mask >> (2 * reg)) & 3:
                out[lane, reg] = chunk[ptr:ptr + 2]
                ptr += 2

    if s.lanes:                          # the record, then a register a load
        for lane in range(32):
            registers(lane, int(r[lane]) >> LANE_OFFSET_BITS,
                      shift + (int(r[lane]) & ((1 << LANE_OFFSET_BITS) - 1)))
        return out
    for lane in range(32):
        q, rr = lane >> 2, lane & 3
        word = int(r["w"][q])
        below = word & ((1 << (8 * rr)) - 1)
        mask = (word >> (8 * rr)) & 0xFF
        if s.regvals:                    # registers: bit 2 reg of each lane's byte
            regs_below = (below | below >> 1) & 0x55555555
            registers(lane, mask,
                      shift + int(r["base"]) + 2 * (int(r["p"][q]) + bin(regs_below).count("1")))
            continue
        ptr = shift + int(r["base"]) + int(r["p"][q]) + bin(below).count("1")
        for i in range(8):
            if (mask >> i) & 1:
                out[lane, i // 2, i % 2] = chunk[ptr]
                ptr += 1
    return out


def fragment_positions() -> tuple[np.ndarray, np.ndarray]:
    """(row, column) in a 16 x 16 tile of A register `reg`, half `h` of
    lane L, by the PTX ISA's statement of the m16n8k16 A fragment: a0 =
    (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)."""
    lane = np.arange(32)[:, None, None]
    reg = np.arange(4)[None, :, None]
    h = np.arange(2)[None, None, :]
    g, t = lane // 4, lane % 4
    row = g + 8 * (reg % 2) + 0 * h
    col = 2 * t + h + 8 * (reg // 2)
    return np.broadcast_to(row, (32, 4, 2)), np.broadcast_to(col, (32, 4, 2))


def emulate_product(packed: bytes, x_kn: np.ndarray) -> np.ndarray:
    """W X (M x N, float64) computed the way the kernel walks the buffer:
    per block and stage, per entry and strip, the emulated A fragments
    times the rows of X its k-step names.  For tests on small matrices."""
    s = sections(packed)
    ms = s.bm // TILE
    n = x_kn.shape[1]
    # (a windowed layout's last window may name k-steps past K: zeros of X)
    kt = max(-(-s.k // TILE), int(s.kid.max()) + 1 if s.kid.size else 0)
    xp = np.zeros((kt * TILE, n), dtype=np.float64)
    xp[:s.k] = x_kn
    nb = s.blocks.shape[0]
    y = np.zeros((nb * s.bm, n), dtype=np.float64)
    frow, fcol = fragment_positions()
    for first, count, row0, _ in s.blocks:
        for st in range(first, first + count):
            for j in range(s.ks):
                kstep = int(s.kid[st * s.ks + j])
                for strip in range(ms):
                    a = np.zeros((TILE, TILE))
                    a[frow, fcol] = emulate_decode(packed, st, j, strip)
                    rows = slice(row0 + 16 * strip, row0 + 16 * strip + 16)
                    y[rows] += a @ xp[16 * kstep:16 * kstep + 16]
    return y[:s.m]
