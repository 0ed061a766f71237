"""The row-group plan: how a matrix's rows fall into groups (Grouping), and
the packed device buffer a row-group kernel reads (RowGroupPlan) --
weights in BK-chunks (one chunk of one group is one contiguous BM x BK
run), the column indices per chunk (padded with the group's last index,
under zero weights), the schedule (groups sorted by k_g, longest first),
the row map and the bias (by position, like the row map).  The
shared-gather path packs sets of xr groups instead (xshare.py).
`unpack_plan` reads a plan back, for tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...kernel import Operation
from ...matrix import SparseMatrix, from_device_bytes, to_device_bytes
from . import xshare

ELEM_T = {"fp16": "__half", "bf16": "__nv_bfloat16"}
# the last columns of N, enough to fill the GPU once, run longest slot
# first (rowgroup.cuh, tail_first); it tells apart this many runs of
# equal-cost slots
MAX_COST_CLASSES = 16


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
    swizzled: bool = False            # TMA path: each chunk's rows stored in the shared tile's
                                      # swizzled order (one bulk copy lands it as the wgmma reads it)

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
    if bk < 16 or bk % 16:
        raise ValueError(f"bk must be a positive multiple of 16, got {bk}")
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


def swizzle_chunks(bk: int, rows: int) -> np.ndarray:
    """Where each 16-byte chunk of a row lands in a swizzled shared tile of
    BK-element rows (rowgroup.cuh, swizzle<BK / 8>): out[r, ch] is the
    position in row r of the row's logical chunk ch."""
    row_ch = bk // 8
    line_rows = 1 if row_ch >= 8 else 8 // row_ch
    mask = 7 if row_ch >= 8 else row_ch - 1
    r = np.arange(rows)[:, None]
    return np.arange(row_ch)[None, :] ^ ((r // line_rows) & mask)


def _swizzle_weights(weights: np.ndarray, bk: int, inverse: bool = False) -> np.ndarray:
    """(chunks, rows, bk) weights with each row's 8-element chunks moved to
    (or, inverse, back from) their swizzled positions."""
    t, rows, _ = weights.shape
    pos = swizzle_chunks(bk, rows)                          # (rows, bk / 8)
    w4 = weights.reshape(t, rows, bk // 8, 8)
    out = np.empty_like(w4)
    ri = np.arange(rows)[:, None]
    if inverse:
        out[:, ri, np.arange(bk // 8)[None, :]] = w4[:, ri, pos]
    else:
        out[:, ri, pos] = w4
    return out.reshape(t, rows, bk)


def contiguous_runs(grouping: Grouping, k: int) -> int:
    """The columns of every group come in aligned runs of this many (0: no
    such runs usable by a tensor map of X: K not a multiple of the run or
    of 8).  A chunk of BK columns, BK dividing it, is then one box of X."""
    run = grouping.run
    return run if run > 1 and k % run == 0 and k % 8 == 0 else 0


def build_plan(matrix: SparseMatrix, op: Operation, grouping: Grouping, bk: int, *,
               family: str, tag: str, bias: Optional[np.ndarray] = None,
               tn: int = 1, swizzled: bool = False) -> RowGroupPlan:
    """Packs `matrix` by `grouping` into BK-chunks, longest group first.
    tn > 1 (streamed tiles): a group whose CTAs take span < tn tiles of N
    (tile_spans) has tn / span slots, each `span` tiles further along N; the
    slots run most work (span x chunks) first.  swizzled (the TMA path):
    each chunk's weights in the shared tile's swizzled order, and every
    chunk's columns one run of X (checked)."""
    m, k = matrix.shape
    G, bm = grouping.group_rows, grouping.bm
    perm = None if is_identity(grouping.perm) else grouping.perm
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

    if swizzled:
        if total_chunks and not np.all(indices - indices[:, :1] == np.arange(bk)):
            raise ValueError("a swizzled (TMA) plan needs every chunk's columns to be one run")
        weights = _swizzle_weights(weights, bk)
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
                        meta={"nnz": matrix.nnz}, swizzled=swizzled)


def shared_packing(grouping: Grouping, xr: int, bk: int, xu: int) -> list:
    """The sets of a shared-gather plan (cached on the grouping): xr groups
    each, in schedule order (longest first), with their chunk packing."""
    key = (xr, bk, xu)
    if key not in grouping.packs:
        kg = np.array([s.size for s in grouping.supports], dtype=np.int64)
        order = np.argsort(-kg, kind="stable")
        grouping.packs[key] = xshare.pack_sets(grouping.supports, order, xr, bk, xu, grouping.run)
    return grouping.packs[key]


def is_identity(perm: Optional[np.ndarray]) -> bool:
    """No permutation, or rows in order: the kernel reads no row map and
    stores runs of rows whole."""
    return perm is None or bool(np.array_equal(perm, np.arange(perm.size)))


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
                        bm=bm, bk=bk, permuted=not is_identity(grouping.perm), perm=grouping.perm,
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


def chunk_weights(plan: RowGroupPlan) -> np.ndarray:
    """A one-group-per-CTA plan's weights as (chunks, bm, bk) float32, in
    logical order (a swizzled plan's rows put back)."""
    total = plan.total_chunks
    w = from_device_bytes(plan.packed[plan.offsets["weights"]:], plan.dtype,
                          total * plan.bm * plan.bk).reshape(total, plan.bm, plan.bk)
    return _swizzle_weights(w, plan.bk, inverse=True) if plan.swizzled else w


def _unpack_groups(plan: RowGroupPlan):
    """(rows, cols, values) of a one-group-per-CTA plan's nonzero entries."""
    m, bm, bk, raw = plan.shape[0], plan.bm, plan.bk, plan.packed
    total = plan.total_chunks
    w = chunk_weights(plan)
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


