"""The row-group gather GEMM shared by the `bsr` and `shflbw` families.

Both patterns reduce to the same computation: the rows of W (permuted for
shflbw) fall into groups; group g has a list of k_g columns and a dense
weight tile over them, and

    Y[rows of g, :] = epilogue(W_g . X[cols of g, :])

- shflbw: a group is V consecutive rows of the permuted matrix; its list is
  the group's column support (the union of its rows' supports, so a matrix
  that does not fit exactly still runs, with explicit zeros stored).
- bsr: a group is one block-row of br rows (several block-rows when br < 16,
  to fill one m16 tensor-core tile); its list is the union of its nonzero
  blocks' columns, each block contributing a run of bc columns.

`plan` packs the weights in BK-chunks (one chunk of one group is one
contiguous BM x BK run), the column indices per chunk (padded with the
group's last index, under zero weights), the schedule (groups sorted by k_g,
longest first), the row map and the bias (by position, like the row map).
The shared-gather path (config keys "xr" and "xu") packs sets of xr groups
instead: generator/families/xshare.py.  The device code is
templates/include/sf/rowgroup.cuh; templates/rowgroup.cu.j2 only bakes in the
constants.  Split-K is not implemented: one CTA runs one group's whole K.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..kernel import ConfigError, Family, Kernel, Operation, config_name, render, smem_limit
from ..matrix import SparseMatrix, from_device_bytes, to_device_bytes
from . import xshare

BN_CHOICES = (16, 32, 64, 128, 256)
BK_CHOICES = (16, 32, 64)
STAGE_CHOICES = (2, 3, 4)
MAX_WARPS = 8
MAX_ACC_REGS = 128
MAX_LOADS = 8          # 16-byte loads per thread per stage, for each operand
CONFIG_KEYS = ("bk", "bn", "stages", "wm", "wn")
# the wgmma path (sm_90a) adds the key "wg": 1; its wm is fixed by the tile
# (4 warps per 64 rows) and wn counts warpgroups along N
WG_KEYS = tuple(sorted(CONFIG_KEYS + ("wg",)))
# ... and optionally "tn": tiles of N one CTA computes in turn, its copies
# streaming on from one tile into the next (absent: 1); a long group's CTAs
# take fewer (tile_spans)
WG_TN_KEYS = tuple(sorted(WG_KEYS + ("tn",)))
TN_CHOICES = (2, 4)
# the shared-gather path adds "xr" (groups per CTA; wm = xr) and "xu" (rows of
# X a chunk holds)
XS_KEYS = tuple(sorted(CONFIG_KEYS + ("xr", "xu")))
WG_N_CHOICES = (64, 128, 256)     # N of one warpgroup's wgmma (the wrappers in mma_sm90.cuh)
WG_BN_CHOICES = (64, 128, 256, 512)
WG_STAGE_CHOICES = (3, 4, 5, 6)
WG_MAX_WARPS = 16
WG_MAX_LOADS = 16      # wgmma and shared-gather paths
ACT_CODES = {"none": 0, "relu": 1, "gelu": 2}
# the last columns of N, enough to fill the GPU once, run longest slot
# first (rowgroup.cuh, tail_first); it tells apart this many runs of
# equal-cost slots
MAX_COST_CLASSES = 16
ELEM_T = {"fp16": "__half", "bf16": "__nv_bfloat16"}


def is_wg(config: dict) -> bool:
    """Whether a configuration takes the wgmma (sm_90a) path."""
    return bool(config.get("wg", 0))


def is_xs(config: dict) -> bool:
    """Whether a configuration takes the shared-gather path."""
    return bool(config.get("xr", 0))


def wg_tile_rows(bm: int) -> int:
    """Rows of a wgmma tile: BM rounded up to whole warpgroups (64 rows)."""
    return max(64, round_up(bm, 64))


def smem_bytes(bm: int, config: dict, layout: str = "fm") -> int:
    """Dynamic shared memory of a configuration (mirrors Config::SMEM_BYTES):
    the pipeline stages, or the padded output tile where larger, plus the
    row map (each tile row's original row and bias); the wgmma path tiles
    wg_tile_rows(bm) rows and reserves 1 KB to align its base."""
    bn, bk, stages = config["bn"], config["bk"], config["stages"]
    pad, b_rows, loc = 0, bk, 0
    if is_wg(config):
        bm, pad = wg_tile_rows(bm), 1024
    if is_xs(config):
        bm, b_rows, loc = bm * config["xr"], config["xu"], config["xr"] * bk
    pipe = stages * (bm * bk * 2 + b_rows * bn * 2 + loc)
    c_tile = bm * (bn + 8) * 2 if layout == "fm" else bn * (bm + 8) * 2
    return max(pipe, c_tile) + bm * 8 + pad


def min_blocks(bm: int, config: dict) -> int:
    """The minimum-CTAs-per-SM hint of __launch_bounds__: the most CTAs
    whose registers fit when each thread gets its accumulators, two k-steps
    of A and B fragments, its prefetched row indices and ~88 registers of
    addressing (each of the SM's 4 schedulers has 16K registers).  ptxas's
    own default, with only a thread count, spills the large warp tiles; a
    sweep of the whole search space for sm_90a spills nothing with this."""
    if is_wg(config):
        return _wg_min_blocks(bm, config)
    if is_xs(config):
        bm *= config["xr"]
    regs = _regs_per_thread(bm, config)
    warps = config["wm"] * config["wn"]
    for blocks in range(8, 0, -1):
        # registers are split over the SM's 4 schedulers (16K each), 8 at a time
        per_scheduler = -(-blocks * warps // 4)
        cap = min(255, 16384 // (per_scheduler * 32) // 8 * 8)
        if cap >= regs:
            return blocks
    return 1


def _regs_per_thread(bm: int, config: dict) -> int:
    """The mma.sync paths' register estimate (bm: the CTA tile's rows)."""
    mf, nf = bm // config["wm"] // 16, config["bn"] // config["wn"] // 8
    threads = 32 * config["wm"] * config["wn"]
    b_loads = -(-config.get("xu", config["bk"]) * config["bn"] // 8 // threads)
    return mf * nf * 4 + (mf * 4 + nf * 2) * 2 + b_loads + 88


def _check_warp_tile(wtm: int, bn: int, wn: int, stages: int) -> None:
    """The mma.sync paths' pipeline depth and warp tile (wtm rows of BN / wn
    columns): n16 steps along N and at most MAX_ACC_REGS accumulators."""
    if stages not in STAGE_CHOICES:
        raise ConfigError(f"stages: must be one of {STAGE_CHOICES}, got {stages}")
    if bn % (16 * wn):
        raise ConfigError(f"bn % (16*wn): BN = {bn} is not a multiple of 16 x wn = {16 * wn}")
    acc = (wtm // 16) * (bn // wn // 8) * 4
    if acc > MAX_ACC_REGS:
        raise ConfigError(f"accumulators: warp tile {wtm}x{bn // wn} needs {acc} fp32 "
                          f"registers per thread, more than {MAX_ACC_REGS}")


def _check_loads_and_smem(config: dict, bm: int, op: Operation, device: Optional[dict],
                          max_loads: int) -> None:
    """16-byte copies per thread and operand in a stage, and shared memory."""
    threads = 32 * config["wm"] * config["wn"]
    bk, bn = config["bk"], config["bn"]
    a_rows = bm * config.get("xr", 1)
    loads = max(-(-a_rows * bk // 8 // threads), -(-config.get("xu", bk) * bn // 8 // threads))
    if loads > max_loads:
        raise ConfigError(f"loads per thread: a stage needs {loads} 16-byte loads per thread and "
                          f"operand with {threads} threads, more than {max_loads}")
    smem = smem_bytes(bm, config, op.layout)
    limit = smem_limit(device)
    if smem > limit:
        raise ConfigError(f"shared memory: {smem} bytes exceed the limit of {limit}")


SM_SMEM = 228 * 1024     # shared memory of an sm_90 multiprocessor (1 KB of it per CTA is reserved)


def _wg_min_blocks(bm: int, config: dict) -> int:
    """The wgmma path's CTAs per SM: as many as shared memory holds, while
    each thread keeps its accumulators and ~56 registers of addressing and
    epilogue.  Asking for them caps the registers: without the cap the
    compiler took more than half the register file for a fused GELU and
    the SM held one CTA instead of two, so nothing hid the epilogue."""
    threads = 32 * config["wm"] * config["wn"]
    need = round_up(config["bn"] // config["wn"] // 2 + 56, 8)
    by_smem = SM_SMEM // (smem_bytes(bm, config) + 1024)
    return max(1, min(8, by_smem, 65536 // (threads * need)))


def _align16(n: int) -> int:
    return (n + 15) & ~15


# ---- grouping ----------------------------------------------------------------------

@dataclass
class Grouping:
    """How the rows of a matrix fall into groups, and each group's columns."""
    group_rows: int                  # rows per group (the last may have fewer)
    bm: int                          # tile rows: group_rows rounded up to 16
    perm: Optional[np.ndarray]       # permuted position -> original row; None = identity
    supports: list                   # per group: sorted int32 column list
    exact: bool                      # every stored entry is a nonzero of the pattern
    run: int = 1                     # columns come in aligned runs of this many (bsr: bc)
    packs: dict = field(default_factory=dict, repr=False)  # shared-gather packings, by (xr, bk, xu)

    @property
    def num_groups(self) -> int:
        return len(self.supports)


def permuted_csr(matrix: SparseMatrix, perm: Optional[np.ndarray]):
    """(indptr, indices, values) of W[perm] (W itself when perm is None)."""
    if perm is None:
        return matrix.indptr, matrix.indices, matrix.values
    nnz_row = matrix.row_nnz()[perm]
    indptr = np.zeros(matrix.rows + 1, dtype=np.int64)
    np.cumsum(nnz_row, out=indptr[1:])
    starts = matrix.indptr[perm]
    # gather each permuted row's range of the original arrays
    offs = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], nnz_row)
    src = np.repeat(starts, nnz_row) + offs
    return indptr, matrix.indices[src], matrix.values[src]


def _group_bounds(m: int, group_rows: int):
    n_groups = (m + group_rows - 1) // group_rows if group_rows else 0
    for g in range(n_groups):
        yield g, g * group_rows, min(m, (g + 1) * group_rows)


def union_supports(matrix: SparseMatrix, perm: Optional[np.ndarray], group_rows: int,
                   block_cols: int = 1) -> tuple[list, int]:
    """Per group, the sorted union of its rows' columns; with block_cols > 1
    the union of the touched column blocks, expanded to runs of block_cols
    (clipped at K).  Also returns the number of entries stored."""
    indptr, indices, _ = permuted_csr(matrix, perm)
    k = matrix.cols
    supports, stored = [], 0
    for _, r0, r1 in _group_bounds(matrix.rows, group_rows):
        cols = indices[indptr[r0]:indptr[r1]]
        if block_cols > 1:
            blocks = np.unique(cols // block_cols).astype(np.int64)
            exp = (blocks[:, None] * block_cols + np.arange(block_cols)[None, :]).ravel()
            sup = exp[exp < k].astype(np.int32)
        else:
            sup = np.unique(cols).astype(np.int32)
        supports.append(sup)
        stored += sup.size * (r1 - r0)
    return supports, stored


def shflbw_grouping(matrix: SparseMatrix, v: int) -> tuple[np.ndarray, list]:
    """(perm, supports) of a shflbw plan, from generator/analysis.py: the
    matrix's own permutation when it fits (or groups best), else one
    recovered exactly (a shuffled Shfl-BW matrix) or greedily (then the
    supports are unions and the plan stores explicit zeros)."""
    from ..analysis import shflbw_groups
    perm, supports = shflbw_groups(matrix, v)
    perm = np.ascontiguousarray(perm, dtype=np.int64)
    if perm.shape != (matrix.rows,) or not np.array_equal(np.sort(perm), np.arange(matrix.rows)):
        raise ValueError("analysis.shflbw_groups returned something that is not a row permutation")
    return perm, [np.ascontiguousarray(s_, dtype=np.int32) for s_ in supports]


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ---- the plan ------------------------------------------------------------------------

@dataclass
class RowGroupPlan:
    """Everything a row-group kernel needs: the packed device buffer, its
    section offsets, the schedule and the constants the template bakes in."""
    family: str
    tag: str
    dtype: str
    shape: tuple[int, int]
    group_rows: int
    bm: int
    bk: int
    permuted: bool                    # the kernel maps rows through the rows table
    perm: Optional[np.ndarray]        # permuted position -> original row (None: identity)
    matrix_perm: Optional[np.ndarray]  # the input matrix's perm, handed back by unpack
    slots: np.ndarray                 # int32 (num_slots, 4): first chunk, chunks, first row,
                                      # rows | (streamed tiles) span code << 16
    group_k: np.ndarray               # k_g (unpadded) per slot
    offsets: dict                     # section -> byte offset in packed
    packed: bytes
    has_bias: bool
    exact: bool
    stored_entries: int               # sum over groups of rows x k_g (explicit zeros included)
    runs8: bool                       # every run of 8 indices: 8 consecutive aligned columns, K % 8 == 0
    meta: dict = field(default_factory=dict)
    xr: int = 0                       # shared gather: groups per CTA (0: one group per CTA)
    xu: int = 0                       # shared gather: rows of X per chunk

    @property
    def num_slots(self) -> int:
        return int(self.slots.shape[0])

    @property
    def total_chunks(self) -> int:
        """Chunks packed: those of the slots at a span's first tile (a group
        of span < tn tiles has more slots, all reading the same chunks)."""
        return int(self.slots[self.first_spans, 1].sum()) if self.num_slots else 0

    @property
    def first_spans(self) -> np.ndarray:
        """Per slot, whether it starts its group's first span of tiles."""
        return (self.slots[:, 3] >> 20) == 0


def _pack_sections(sections: list) -> tuple[dict, bytes]:
    """(name -> byte offset, buffer) of named byte strings, each 16-byte aligned."""
    offsets, buf, pos = {}, bytearray(), 0
    for name, data in sections:
        pos = _align16(pos)
        buf.extend(b"\0" * (pos - len(buf)))
        offsets[name] = pos
        buf.extend(data)
        pos += len(data)
    buf.extend(b"\0" * (_align16(len(buf)) - len(buf)))
    return offsets, bytes(buf)


def _check_plan_inputs(matrix: SparseMatrix, op: Operation, grouping: Grouping, bk: int,
                       family: str, bias: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The checks both packers share; returns the bias as float32 (or None)."""
    if op.dtype not in ELEM_T:
        raise ValueError(f"{family} supports dtypes {tuple(ELEM_T)}, not {op.dtype!r}")
    if bk not in BK_CHOICES:
        raise ValueError(f"bk must be one of {BK_CHOICES}, got {bk}")
    if not op.epilogue.bias:
        return None
    if bias is None:
        raise ValueError("the epilogue has a bias but none was given")
    bias = np.asarray(bias, dtype=np.float32).ravel()
    if bias.shape != (matrix.rows,):
        raise ValueError(f"bias has {bias.size} entries, expected M = {matrix.rows}")
    return bias


def _group_tile(matrix_csr, grouping: Grouping, g: int, r0: int, r1: int) -> np.ndarray:
    """Group g's dense (rows x k_g) weights over its column list."""
    indptr, pind, pval = matrix_csr
    sup = grouping.supports[g]
    lo, hi = int(indptr[r0]), int(indptr[r1])
    local_rows = np.repeat(np.arange(r1 - r0), np.diff(indptr[r0:r1 + 1]))
    pos = np.searchsorted(sup, pind[lo:hi])
    if np.any(pos >= sup.size) or np.any(sup[np.minimum(pos, sup.size - 1)] != pind[lo:hi]):
        raise ValueError(f"group {g}: a nonzero lies outside the group's column list")
    tile = np.zeros((r1 - r0, sup.size), dtype=np.float32)
    tile[local_rows, pos] = pval[lo:hi]
    return tile


def tile_spans(chunks: np.ndarray, tn: int) -> np.ndarray:
    """Tiles of N each group's CTAs compute (streamed tiles): tn for a group
    of at most the mean group's chunks, tn/2 up to twice that, ... at least
    1, so that no CTA runs much more than tn x the mean chunks (or the
    longest group's, once), while the short groups' CTAs stream tn tiles."""
    if tn == 1 or chunks.size == 0:
        return np.ones(chunks.size, dtype=np.int64)
    budget = max(tn * float(chunks.mean()), float(chunks.max()))
    span = np.full(chunks.size, tn, dtype=np.int64)
    while True:
        long = (span > 1) & (span * chunks > budget)
        if not long.any():
            return span
        span[long] //= 2


def cost_classes(plan: "RowGroupPlan", tn: int = 1) -> list[int]:
    """Where each run of equal-cost slots ends (the last end is the slot
    count), for the tail's order (rowgroup.cuh, tail_first): a slot costs
    its chunks times the tiles it streams.  The slots are sorted by cost,
    longest first, so a run is a class; past MAX_COST_CLASSES - 1 runs the
    shortest slots share the last class."""
    n = plan.num_slots
    if n == 0:
        return [0]
    cost = plan.slots[:, 1].astype(np.int64) * (tn >> ((plan.slots[:, 3] >> 16) & 15))
    ends = [int(i) for i in np.flatnonzero(cost[1:] != cost[:-1]) + 1]
    return ends[:MAX_COST_CLASSES - 1] + [n]


def build_plan(matrix: SparseMatrix, op: Operation, grouping: Grouping, bk: int, *,
               family: str, tag: str, bias: Optional[np.ndarray] = None,
               tn: int = 1) -> RowGroupPlan:
    """Packs `matrix` by `grouping` into BK-chunks, longest group first.
    tn > 1 (streamed tiles): a group whose CTAs take span < tn tiles of N
    (tile_spans) has tn / span slots, each `span` tiles further along N; the
    slots run most work (span x chunks) first."""
    m, k = matrix.shape
    G, bm = grouping.group_rows, grouping.bm
    perm = grouping.perm
    n_groups = grouping.num_groups
    bias = _check_plan_inputs(matrix, op, grouping, bk, family, bias)
    kg = np.array([s.size for s in grouping.supports], dtype=np.int64)
    chunks = (kg + bk - 1) // bk
    order = np.argsort(-kg, kind="stable")          # longest first
    first = np.zeros(n_groups, dtype=np.int64)
    first[order] = np.concatenate([[0], np.cumsum(chunks[order])[:-1]]) if n_groups else []
    total_chunks = int(chunks.sum())
    if total_chunks * bm * bk * 2 >= 1 << 40 or total_chunks >= 1 << 31:
        raise ValueError("matrix too large for one row-group plan")

    weights = np.zeros((total_chunks, bm, bk), dtype=np.float32)
    indices = np.zeros((total_chunks, bk), dtype=np.int32)
    csr = permuted_csr(matrix, perm)
    for g, r0, r1 in _group_bounds(m, G):
        sup = grouping.supports[g]
        nch = int(chunks[g])
        if nch == 0:
            continue
        tile = np.zeros((bm, nch * bk), dtype=np.float32)
        tile[:r1 - r0, :sup.size] = _group_tile(csr, grouping, g, r0, r1)
        f = int(first[g])
        weights[f:f + nch] = tile.reshape(bm, nch, bk).transpose(1, 0, 2)
        idx = np.empty(nch * bk, dtype=np.int32)
        idx[:sup.size] = sup
        # pads (under zero weights) repeat the last run of 8 real indices, so
        # that runs of 8 consecutive aligned columns stay runs (token-major)
        tail = sup[-8:] if sup.size >= 8 else sup[-1:]
        idx[sup.size:] = np.resize(tail, nch * bk - sup.size)
        indices[f:f + nch] = idx.reshape(nch, bk)

    span = tile_spans(chunks, tn)
    sched = [(int(g), o) for g in order for o in range(0, tn, int(span[g]))]
    sched.sort(key=lambda e: -int(span[e[0]] * chunks[e[0]]))     # stable: by group, then tile
    slots = np.zeros((len(sched), 4), dtype=np.int32)
    for s, (g, o) in enumerate(sched):
        r0 = g * G
        code = int(tn // span[g]).bit_length() - 1 | o << 4
        slots[s] = (first[g], chunks[g], r0, (min(m, r0 + G) - r0) | code << 16)

    offsets, buf = _pack_sections([
        ("weights", to_device_bytes(weights.ravel(), op.dtype)),
        ("indices", indices.tobytes()),
        ("slots", slots.tobytes()),
        ("rows", perm.astype(np.int32).tobytes() if perm is not None else b""),
        ("bias", (bias if perm is None else bias[perm]).tobytes() if op.epilogue.bias else b"")])
    stored = int(sum(int(kg[g]) * (r1 - r0) for g, r0, r1 in _group_bounds(m, G)))
    runs = indices.reshape(-1, 8).astype(np.int64)
    runs8 = bool(k % 8 == 0 and np.all(runs[:, 0] % 8 == 0)
                 and np.all(runs[:, 1:] - runs[:, :1] == np.arange(1, 8)))
    return RowGroupPlan(family=family, tag=tag, dtype=op.dtype, shape=(m, k), group_rows=G,
                        bm=bm, bk=bk, permuted=perm is not None, perm=perm,
                        matrix_perm=matrix.perm, slots=slots,
                        group_k=kg[[g for g, _ in sched]].astype(np.int32),
                        offsets=offsets, packed=buf, has_bias=bool(op.epilogue.bias),
                        exact=grouping.exact, stored_entries=stored, runs8=runs8,
                        meta={"nnz": matrix.nnz})


def shared_packing(grouping: Grouping, xr: int, bk: int, xu: int) -> list:
    """The sets of a shared-gather plan (cached on the grouping): xr groups
    each, in schedule order (longest first), with their chunk packing."""
    key = (xr, bk, xu)
    if key not in grouping.packs:
        kg = np.array([s.size for s in grouping.supports], dtype=np.int64)
        order = np.argsort(-kg, kind="stable")
        grouping.packs[key] = xshare.pack_sets(grouping.supports, order, xr, bk, xu, grouping.run)
    return grouping.packs[key]


def build_shared_plan(matrix: SparseMatrix, op: Operation, grouping: Grouping, bk: int, xr: int,
                      xu: int, *, family: str, tag: str,
                      bias: Optional[np.ndarray] = None) -> RowGroupPlan:
    """Packs `matrix` for the shared-gather path: sets of xr groups, one
    gather of the union of their columns per chunk (xshare.py)."""
    m, k = matrix.shape
    G, bm = grouping.group_rows, grouping.bm
    sets = shared_packing(grouping, xr, bk, xu)
    bias = _check_plan_inputs(matrix, op, grouping, bk, family, bias)
    tile_rows = xr * bm
    n_chunks = [p.cols.shape[0] for _, p in sets]
    firsts = np.concatenate([[0], np.cumsum(n_chunks)[:-1]]).astype(np.int64) if sets else []
    total = int(sum(n_chunks))
    if total * tile_rows * bk * 2 >= 1 << 40:
        raise ValueError("matrix too large for one row-group plan")
    weights = np.zeros((total, tile_rows, bk), dtype=np.float32)
    indices = np.full((total, xu), -1, dtype=np.int32)
    local = np.zeros((total, xr, bk), dtype=np.uint8)
    rows = np.full((len(sets), tile_rows), -1, dtype=np.int32)
    slots = np.zeros((len(sets), 4), dtype=np.int32)
    csr = permuted_csr(matrix, grouping.perm)
    for s, (members, pk) in enumerate(sets):
        f, nch = int(firsts[s]), n_chunks[s]
        slots[s] = (f, nch, s * tile_rows, tile_rows)
        indices[f:f + nch] = pk.cols
        local[f:f + nch, :len(members)] = pk.local
        # groups missing from a short last set read a loaded slot (zero weights)
        first_loaded = np.argmax(pk.cols >= 0, axis=1).astype(np.uint8)
        local[f:f + nch, len(members):] = first_loaded[:, None, None]
        for j, g in enumerate(members):
            r0, r1 = g * G, min(m, (g + 1) * G)
            orig = grouping.perm[r0:r1] if grouping.perm is not None else np.arange(r0, r1)
            rows[s, j * bm:j * bm + r1 - r0] = orig
            if nch == 0 or grouping.supports[g].size == 0:
                continue
            tile = _group_tile(csr, grouping, g, r0, r1)
            src = pk.src[:, j, :]
            vals = tile[:, np.maximum(src, 0)].transpose(1, 0, 2)      # (chunks, rows, bk)
            weights[f:f + nch, j * bm:j * bm + r1 - r0] = np.where(src[:, None, :] >= 0, vals, 0.0)
    offsets, buf = _pack_sections([
        ("weights", to_device_bytes(weights.ravel(), op.dtype)),
        ("indices", indices.tobytes()),
        ("local", local.tobytes()),
        ("slots", slots.tobytes()),
        ("rows", rows.tobytes()),
        ("bias", np.where(rows >= 0, bias[np.maximum(rows, 0)], 0.0).astype(np.float32).tobytes()
         if bias is not None else b"")])
    kg = np.array([sup.size for sup in grouping.supports], dtype=np.int64)
    stored = int(sum(int(kg[g]) * (r1 - r0) for g, r0, r1 in _group_bounds(m, G)))
    set_k = np.array([max((int(kg[g]) for g in mem), default=0) for mem, _ in sets], dtype=np.int32)
    return RowGroupPlan(family=family, tag=tag, dtype=op.dtype, shape=(m, k), group_rows=G,
                        bm=bm, bk=bk, permuted=grouping.perm is not None, perm=grouping.perm,
                        matrix_perm=matrix.perm, slots=slots, group_k=set_k, offsets=offsets,
                        packed=buf, has_bias=bias is not None, exact=grouping.exact,
                        stored_entries=stored, runs8=False,
                        meta={"nnz": matrix.nnz, "union_rows": int((indices >= 0).sum())},
                        xr=xr, xu=xu)


def unpack_plan(plan: RowGroupPlan) -> SparseMatrix:
    """The matrix a plan encodes, read back from its packed bytes: values
    rounded to the plan's dtype, stored zeros dropped; perm is the one the
    plan runs with (a permuted plan) or the input matrix's (otherwise)."""
    m, k = plan.shape
    if plan.xr:
        r, c, v = _unpack_shared(plan)
    else:
        r, c, v = _unpack_groups(plan)
    key = r * max(1, k) + c
    if np.unique(key).size != key.size:
        raise ValueError("packed plan stores an entry twice")
    o = np.argsort(key, kind="stable")
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=m), out=indptr[1:])
    perm = plan.perm if plan.permuted else plan.matrix_perm
    return SparseMatrix((m, k), indptr, c[o], v[o], dtype=plan.dtype, perm=perm)


def _concat_entries(rr: list, cc: list, vv: list):
    if not rr:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    return np.concatenate(rr), np.concatenate(cc), np.concatenate(vv)


def _unpack_shared(plan: RowGroupPlan):
    """(rows, cols, values) of a shared-gather plan's nonzero entries."""
    raw, bk, xr, xu, tr = plan.packed, plan.bk, plan.xr, plan.xu, plan.xr * plan.bm
    total = plan.total_chunks
    w = from_device_bytes(raw[plan.offsets["weights"]:], plan.dtype, total * tr * bk)
    w = w.reshape(total, xr, plan.bm, bk)
    idx = np.frombuffer(raw, dtype=np.int32, count=total * xu,
                        offset=plan.offsets["indices"]).reshape(total, xu)
    loc = np.frombuffer(raw, dtype=np.uint8, count=total * xr * bk,
                        offset=plan.offsets["local"]).reshape(total, xr, bk)
    slots = np.frombuffer(raw, dtype=np.int32, count=plan.num_slots * 4,
                          offset=plan.offsets["slots"]).reshape(-1, 4)
    rows_tab = np.frombuffer(raw, dtype=np.int32, count=plan.num_slots * tr,
                             offset=plan.offsets["rows"])
    rr, cc, vv = [], [], []
    for f, nch, r0, _ in slots:
        for c in range(f, f + nch):
            cols = np.take_along_axis(np.broadcast_to(idx[c], (xr, xu)), loc[c].astype(np.int64),
                                      axis=1)                    # (xr, bk)
            j, lr, le = np.nonzero(w[c])
            orig = rows_tab[r0 + j * plan.bm + lr]
            col = cols[j, le]
            if np.any(orig < 0) or np.any(col < 0):
                raise ValueError("a weight sits on a missing row or an empty slot")
            rr.append(orig.astype(np.int64))
            cc.append(col.astype(np.int64))
            vv.append(w[c][j, lr, le])
    return _concat_entries(rr, cc, vv)


def _unpack_groups(plan: RowGroupPlan):
    """(rows, cols, values) of a one-group-per-CTA plan's nonzero entries."""
    m, bm, bk, raw = plan.shape[0], plan.bm, plan.bk, plan.packed
    total = plan.total_chunks
    w = from_device_bytes(raw[plan.offsets["weights"]:], plan.dtype, total * bm * bk)
    w = w.reshape(total, bm, bk)
    idx = np.frombuffer(raw, dtype=np.int32, count=total * bk,
                        offset=plan.offsets["indices"]).reshape(total, bk)
    slots = np.frombuffer(raw, dtype=np.int32, count=plan.num_slots * 4,
                          offset=plan.offsets["slots"]).reshape(-1, 4)
    rows_tab = (np.frombuffer(raw, dtype=np.int32, count=m, offset=plan.offsets["rows"])
                if plan.permuted else None)
    rr, cc, vv = [], [], []
    for (f, nch, r0, nrows), first in zip(slots, plan.first_spans):
        nrows &= 0xffff           # a span code sits above
        if nch == 0 or not first:
            continue
        tile = w[f:f + nch].transpose(1, 0, 2).reshape(bm, nch * bk)[:nrows]
        cols = idx[f:f + nch].ravel()
        lr, lk = np.nonzero(tile)
        orig = rows_tab[r0 + lr] if rows_tab is not None else r0 + lr
        rr.append(orig.astype(np.int64))
        cc.append(cols[lk].astype(np.int64))
        vv.append(tile[lr, lk])
    return _concat_entries(rr, cc, vv)


# ---- the family base ----------------------------------------------------------------

class RowGroupFamily(Family):
    """A Family whose kernels are the row-group gather GEMM.  Subclasses
    define `name`, `tag`, `_params` (validated parameters) and `_grouping`."""
    dtypes = ("fp16", "bf16")
    layouts = ("fm",)
    template = "rowgroup.cu.j2"

    def __init__(self):
        self._cache: dict = {}

    # -- to implement -------------------------------------------------------
    def _grouping_uncached(self, matrix: SparseMatrix, params: dict) -> Grouping:
        raise NotImplementedError

    def _check_params(self, params: dict) -> tuple:
        raise NotImplementedError

    # -- grouping, cached per matrix object -----------------------------------
    def grouping(self, matrix: SparseMatrix, params: dict) -> Grouping:
        key = (id(matrix), self._check_params(params), matrix.nnz, matrix.shape)
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is matrix:
            return hit[1]
        g = self._grouping_uncached(matrix, params)
        if len(self._cache) >= 8:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (weakref.ref(matrix), g)
        return g

    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        return self.grouping(matrix, params).exact

    # -- configurations ------------------------------------------------------
    def tile_rows(self, matrix: SparseMatrix, params: dict) -> int:
        """BM of every configuration for this matrix and params."""
        return self.grouping(matrix, params).bm

    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> None:
        self._check_params(params)
        if op.dtype not in self.dtypes:
            raise ConfigError(f"dtype: {self.name} supports {self.dtypes}, not {op.dtype!r}")
        if op.layout not in self.layouts:
            raise ConfigError(f"layout: {self.name} supports {self.layouts}, not {op.layout!r}")
        keys = tuple(sorted(config))
        if keys not in (CONFIG_KEYS, WG_KEYS, WG_TN_KEYS, XS_KEYS):
            raise ConfigError(f"keys: a {self.name} configuration has exactly {CONFIG_KEYS} "
                              f"(or those and 'wg', optionally with 'tn', for the wgmma path, "
                              f"or 'xr' and 'xu' for the shared gather), got {keys}")
        for k_ in keys:
            if not isinstance(config[k_], (int, np.integer)) or isinstance(config[k_], bool):
                raise ConfigError(f"{k_}: must be an integer, got {config[k_]!r}")
        bm = self.tile_rows(matrix, params)
        if "wg" in config:
            if config["wg"] != 1:
                raise ConfigError(f"wg: 1 selects the wgmma path (omit the key for mma.sync), "
                                  f"got {config['wg']}")
            self._check_wg(config, bm, op, device)
            return
        if "xr" in config:
            self._check_xs(config, bm, op, device)
            return
        bn, bk, wm, wn, st = (config[k] for k in ("bn", "bk", "wm", "wn", "stages"))
        if bn not in BN_CHOICES:
            raise ConfigError(f"bn: must be one of {BN_CHOICES}, got {bn}")
        if bk not in BK_CHOICES:
            raise ConfigError(f"bk: must be one of {BK_CHOICES}, got {bk}")
        if wm < 1 or wn < 1 or wm * wn > MAX_WARPS:
            raise ConfigError(f"warps: wm x wn must be 1..{MAX_WARPS}, got {wm}x{wn}")
        if bm % (16 * wm):
            raise ConfigError(f"bm % (16*wm): BM = {bm} is not a multiple of 16 x wm = {16 * wm}")
        _check_warp_tile(bm // wm, bn, wn, st)
        _check_loads_and_smem(config, bm, op, device, MAX_LOADS)

    def _check_wg(self, config: dict, bm: int, op: Operation, device: Optional[dict]) -> None:
        """The wgmma path's constraints (keys and types already checked)."""
        bn, bk, wm, wn, st = (config[k] for k in ("bn", "bk", "wm", "wn", "stages"))
        if device and device.get("arch") and device["arch"] != "sm_90a":
            raise ConfigError(f"wg: the wgmma path needs sm_90a, the device is {device['arch']}")
        if op.layout != "fm":
            raise ConfigError("wg: the wgmma path is feature-major only")
        tile = wg_tile_rows(bm)
        if wm != tile // 16:
            raise ConfigError(f"wm: the wgmma path tiles {tile} rows with 4 warps per 64, "
                              f"so wm = {tile // 16}, got {wm}")
        if bk not in BK_CHOICES:
            raise ConfigError(f"bk: must be one of {BK_CHOICES}, got {bk}")
        if st not in WG_STAGE_CHOICES:
            raise ConfigError(f"stages: the wgmma path takes {WG_STAGE_CHOICES}, got {st}")
        if bn not in WG_BN_CHOICES:
            raise ConfigError(f"bn: the wgmma path takes {WG_BN_CHOICES}, got {bn}")
        if wn < 1 or bn % wn or bn // wn not in WG_N_CHOICES:
            raise ConfigError(f"bn / wn: each warpgroup's N must be one of {WG_N_CHOICES}, "
                              f"got bn={bn}, wn={wn}")
        if wm * wn > WG_MAX_WARPS:
            raise ConfigError(f"warps: at most {WG_MAX_WARPS} (4 warpgroups), got {wm * wn}")
        if "tn" in config:
            tn = config["tn"]
            if tn not in TN_CHOICES:
                raise ConfigError(f"tn: tiles of N per CTA must be one of {TN_CHOICES} (omit the "
                                  f"key for one), got {tn}")
            # half the output tile sits in each of the two stages a tile's
            # last chunks freed (Config::C_HALF_BYTES <= STAGE_BYTES)
            half, stage = tile // 2 * (bn + 8) * 2, tile * bk * 2 + bk * bn * 2
            if half > stage:
                raise ConfigError(f"tn: half the output tile ({half} bytes) must fit one stage "
                                  f"({stage} bytes); take a larger bk")
        threads = 32 * wm * wn
        # one CTA's registers: the accumulators (N/2 per thread) and ~40 for
        # addressing must fit the SM's 64K registers
        need, cap = bn // wn // 2 + 40, min(255, 65536 // threads // 8 * 8)
        if need > cap:
            raise ConfigError(f"registers: {bn // wn // 2} accumulators per thread need about "
                              f"{need} registers, more than {cap} with {threads} threads")
        _check_loads_and_smem(config, bm, op, device, WG_MAX_LOADS)

    def _check_xs(self, config: dict, bm: int, op: Operation, device: Optional[dict]) -> None:
        """The shared-gather path's constraints (keys and types already checked)."""
        bn, bk, wm, wn, st, xr, xu = (config[k] for k in ("bn", "bk", "wm", "wn", "stages",
                                                           "xr", "xu"))
        if op.layout != "fm":
            raise ConfigError("xr: the shared gather is feature-major only")
        if xr not in xshare.XR_CHOICES:
            raise ConfigError(f"xr: groups per CTA must be one of {xshare.XR_CHOICES}, got {xr}")
        if bk not in xshare.XS_BK_CHOICES:
            raise ConfigError(f"bk: the shared gather takes {xshare.XS_BK_CHOICES}, got {bk}")
        if xu % 16 or not bk <= xu <= min(xr * bk, xshare.MAX_UNION):
            raise ConfigError(f"xu: rows of X per chunk must be a multiple of 16 in "
                              f"[bk, min(xr * bk, {xshare.MAX_UNION})], got {xu}")
        if bn not in xshare.XS_BN_CHOICES:
            raise ConfigError(f"bn: the shared gather takes {xshare.XS_BN_CHOICES}, got {bn}")
        if wm != xr:
            raise ConfigError(f"wm: the shared gather has one warp row per group, so wm = xr = "
                              f"{xr}, got {wm}")
        if wn < 1 or wm * wn > WG_MAX_WARPS:
            raise ConfigError(f"warps: wm x wn must be 1..{WG_MAX_WARPS}, got {wm}x{wn}")
        _check_warp_tile(bm, bn, wn, st)
        threads = 32 * wm * wn
        # accumulators, one k-step of fragments and ~24 for addressing
        mf, nf = bm // 16, bn // wn // 8
        regs = mf * nf * 4 + mf * 4 + nf * 2 + 24
        if regs * threads > 65536:
            raise ConfigError(f"registers: about {regs} per thread x {threads} threads exceed "
                              f"the SM's 65536")
        if xr * bk > 16 * threads:
            raise ConfigError(f"threads: {threads} cannot copy the {xr * bk}-byte slot table")
        _check_loads_and_smem(config, bm, op, device, WG_MAX_LOADS)

    def xs_space(self) -> list[dict]:
        """Every shared-gather configuration shape (unchecked): half and
        three quarters of xr * bk rows of X per chunk."""
        out = []
        for xr in xshare.XR_CHOICES:
            for bk in xshare.XS_BK_CHOICES:
                for xu in sorted({round_up(xr * bk // 2, 16), round_up(3 * xr * bk // 4, 16)}):
                    for bn in xshare.XS_BN_CHOICES:
                        for wn in (1, 2, 4):
                            for st in STAGE_CHOICES:
                                out.append({"bk": bk, "bn": bn, "stages": st, "wm": xr, "wn": wn,
                                            "xr": xr, "xu": xu})
        return out

    def wg_space(self, bm: int) -> list[dict]:
        """Every wgmma configuration shape for a tile of bm rows (unchecked)."""
        wm = wg_tile_rows(bm) // 16
        base = [{"bk": bk, "bn": n * wn, "stages": st, "wm": wm, "wn": wn, "wg": 1}
                for n in WG_N_CHOICES for wn in (1, 2, 4) for bk in BK_CHOICES
                for st in WG_STAGE_CHOICES]
        # streamed tiles: BK = 32 only.  With BK = 64 they spill a few bytes
        # with a fused GELU (sm_90a; over 64-row tiles they also lost in the
        # probe of bench/RESULTS.md), and with BK = 16 half the output tile
        # does not fit a stage
        return base + [dict(c, tn=tn) for tn in TN_CHOICES for c in base if c["bk"] == 32]

    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """Every valid configuration.  On sm_90a (feature-major) the wgmma
        ones; the mma.sync and shared-gather ones join them only when the
        group is not whole warpgroups of rows (the wgmma tile then computes
        padding rows), as on an H200 wgmma was faster on every S1 problem
        whose groups are (the shared gather included: bench/RESULTS.md).
        Elsewhere mma.sync and, feature-major, the shared gather."""
        bm = self.tile_rows(matrix, params)
        out = []
        if op.layout == "fm":
            hopper = bool(device and device.get("arch") == "sm_90a")
            candidates = self.wg_space(bm) if hopper else []
            if not (hopper and bm % 64 == 0):
                candidates += self.xs_space()
            for cfg in candidates:
                try:
                    self.check_config(cfg, matrix, op, params, device)
                except ConfigError:
                    continue
                out.append(cfg)
            if hopper and bm % 64 == 0 and out:
                return out
        for bn in BN_CHOICES:
            for bk in BK_CHOICES:
                for wm in (1, 2, 4, 8):
                    for wn in (1, 2, 4, 8):
                        for st in STAGE_CHOICES:
                            cfg = {"bk": bk, "bn": bn, "stages": st, "wm": wm, "wn": wn}
                            try:
                                self.check_config(cfg, matrix, op, params, device)
                            except ConfigError:
                                continue
                            out.append(cfg)
        return out

    def hint_configs(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """The S1 winners on an H200 (bench/RESULTS.md), the most frequent
        first, that are valid here.  sm_90a, whole warpgroups of rows: the
        wgmma path; sm_90a with smaller groups: mma.sync, then the shared
        gather; elsewhere mma.sync with 64 x 64 warp tiles where BM allows."""
        bm = self.tile_rows(matrix, params)
        hopper = bool(device and device.get("arch") == "sm_90a" and op.layout == "fm")
        wm = wg_tile_rows(bm) // 16
        wg = [{"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 32, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1, "tn": 4},
              {"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 2, "wg": 1},
              {"bk": 32, "bn": 128, "stages": 5, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 64, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 32, "bn": 256, "stages": 5, "wm": wm, "wn": 2, "wg": 1, "tn": 2},
              {"bk": 32, "bn": 128, "stages": 4, "wm": wm, "wn": 1, "wg": 1},
              {"bk": 16, "bn": 256, "stages": 5, "wm": wm, "wn": 1, "wg": 1}]
        if hopper and bm % 64 == 0:  # the space is wgmma only
            prefs = wg
        else:
            small = [{"bk": 16, "bn": 256, "stages": 3, "wm": 1, "wn": 2},
                     {"bk": 16, "bn": 128, "stages": 4, "wm": 1, "wn": 2},
                     {"bk": 16, "bn": 256, "stages": 4, "wm": 1, "wn": 2},
                     {"bk": 32, "bn": 128, "stages": 4, "wm": 1, "wn": 4},
                     {"bk": 64, "bn": 128, "stages": 3, "wm": 1, "wn": 4},
                     {"bk": 32, "bn": 128, "stages": 3, "wm": 8, "wn": 1, "xr": 8, "xu": 128}]
            prefs = (small + wg if hopper else []) + [
                {"bk": 32, "bn": 256, "stages": 4, "wm": max(1, bm // 64), "wn": 4},
                {"bk": 32, "bn": 128, "stages": 3, "wm": max(1, bm // 64), "wn": 2},
                {"bk": 32, "bn": 128, "stages": 3, "wm": 1, "wn": 4},
                {"bk": 32, "bn": 128, "stages": 3, "wm": 2, "wn": 2}]
        out = []
        for cfg in prefs:
            try:
                self.check_config(cfg, matrix, op, params, device)
            except ConfigError:
                continue
            if cfg not in out:
                out.append(cfg)
        return out

    def default_config(self, matrix: SparseMatrix, op: Operation, params: dict,
                       device: Optional[dict] = None) -> dict:
        """A reasonable configuration without tuning: the first hint."""
        hints = self.hint_configs(matrix, op, params, device)
        return hints[0] if hints else super().default_config(matrix, op, params, device)

    # -- plan, unpack, generate ----------------------------------------------
    def plan(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
             bias: Optional[np.ndarray] = None) -> RowGroupPlan:
        self.check_config(config, matrix, op, params)
        if is_xs(config):
            return build_shared_plan(matrix, op, self.grouping(matrix, params), config["bk"],
                                     config["xr"], config["xu"], family=self.name,
                                     tag=self.tag(params), bias=bias)
        return build_plan(matrix, op, self.grouping(matrix, params), config["bk"],
                          family=self.name, tag=self.tag(params), bias=bias,
                          tn=config.get("tn", 1))

    def unpack(self, plan: RowGroupPlan) -> SparseMatrix:
        return unpack_plan(plan)

    def render(self, plan: RowGroupPlan, op: Operation, config: dict) -> Kernel:
        name = config_name(plan.tag, config, op)
        wg = is_wg(config)
        bm = wg_tile_rows(plan.bm) if wg else plan.bm * max(1, plan.xr)
        smem = smem_bytes(plan.bm, config, op.layout)
        tile = {k: config[k] for k in CONFIG_KEYS}  # the template's names ("wg" is `wg`)
        tn = config.get("tn", 1)
        scale = float(np.float32(op.epilogue.scale))
        source = render(self.template, name=name, family=plan.family, tag=plan.tag,
                        dtype=plan.dtype, elem_t=ELEM_T[plan.dtype], m=plan.shape[0],
                        k=plan.shape[1], num_slots=plan.num_slots, group_rows=plan.group_rows,
                        bm=bm, am=plan.bm * max(1, plan.xr), wg=wg, xr=plan.xr, xu=plan.xu,
                        total_chunks=plan.total_chunks, off=plan.offsets,
                        permuted=plan.permuted, has_bias=plan.has_bias, layout=op.layout,
                        runs8=plan.runs8,
                        act=ACT_CODES[op.epilogue.activation], scale=scale.hex() + "f",
                        smem_bytes=smem, min_blocks=min_blocks(plan.bm, config), tn=tn,
                        class_ends=cost_classes(plan, tn), **tile)
        threads = 32 * config["wm"] * config["wn"]
        return Kernel(name=name, source=source, packed=plan.packed, block=(threads, 1, 1),
                      grid=(max(1, plan.num_slots), 1, 1), n_axis=1, n_tile=config["bn"] * tn,
                      shared_bytes=smem, zero_output=False, options=(), config=dict(config))

    def generate(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
                 bias: Optional[np.ndarray] = None) -> Kernel:
        return self.render(self.plan(matrix, op, params, config, bias=bias), op, config)
