"""The shared-gather plan of the row-group kernel: R groups per CTA, one
gather of X for all of them.

A row-group CTA reads each group's gathered rows of X once per group:
2*d*M*K*N/V bytes from L2 in all, V FLOPs per byte, which bounds every
such kernel by the L2 bandwidth (bench/RESULTS.md).  Groups of a random
pattern share columns (two groups at density d share d*d*K of them), so a
CTA that owns R groups and loads the union of their columns once reads
1 - (1 - d)^R of K instead of R*d of it: 0.45 of the per-group bytes at
R = 8, d = 0.25.

The CTA walks chunks.  In every chunk each of its R groups takes exactly
BK of its columns (padding entries carry zero weights), and the chunk's
union of those columns -- at most U rows of X -- is gathered once into
shared memory.  Each group's warps read their B fragments from the rows
they need (ldmatrix with per-lane row addresses), so the tensor cores do
the group's own work only.  Packing is a first-fit over the set's columns,
most shared first: a column goes to the first chunk where every group that
needs it has room and the union has room; a column that fits nowhere
jointly is placed group by group (loaded once per chunk it lands in).

Shared-memory banks: the union tile is swizzled by row (slot) modulo 8, and
an ldmatrix phase reads 8 of a group's entries, so each aligned octet of a
group's entries should name slots of 8 distinct residues.  Runs of a
multiple of 8 columns (bsr blocks) get 8-aligned slots and are conflict-free
as they stand; single columns get residues greedily (balancing each group's
count per residue) and each group's entries are dealt into octets by
residue.

Packed sections (all 16-byte aligned):
    weights  T[chunks][R * BM][BK]   the R groups' weight tiles, stacked
    indices  int32[chunks][U]        the row of X each slot holds; -1: not loaded
    local    uint8[chunks][R][BK]    the slot each group entry reads
    slots    int4[sets]              {first chunk, chunks, set * R * BM, R * BM}
    rows     int32[sets][R * BM]     original row of each tile row; -1: none
    bias     float32[M]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

XR_CHOICES = (4, 8, 16)         # groups per CTA
XS_BK_CHOICES = (16, 32)
XS_BN_CHOICES = (64, 128, 256)  # a tile row of at least 8 chunks keeps the swizzle by row
MAX_UNION = 256                 # slots fit a uint8


@dataclass
class SharedChunks:
    """The packing of one set of groups."""
    cols: np.ndarray     # int32 (chunks, U): the row of X in each slot, -1 where none
    local: np.ndarray    # uint8 (chunks, R, BK): the slot of each group entry
    src: np.ndarray      # int64 (chunks, R, BK): index into the group's support, -1 = padding


def unit_width(run: int, bk: int) -> int:
    """Columns placed together: whole aligned runs when they come in
    multiples of 8 (bsr blocks, at most BK), else single columns."""
    return min(run, bk) if run % 8 == 0 else 1


def pack_set(supports: list, bk: int, u: int, run: int = 1) -> SharedChunks:
    """Packs the sorted column lists of up to R groups (R = len(supports))
    into chunks of BK entries per group and at most `u` union rows."""
    r = len(supports)
    w = unit_width(run, bk)
    # units (aligned runs of w columns): their columns, and a bitmask of the
    # groups that read them; placed most shared first
    cols_all = [np.asarray(sup, dtype=np.int64) for sup in supports]
    all_cols = np.unique(np.concatenate(cols_all)) if cols_all else np.zeros(0, dtype=np.int64)
    uids, starts = np.unique(all_cols // w, return_index=True)
    unit_cols = dict(zip(uids.tolist(), np.split(all_cols, starts[1:])))
    owners = dict.fromkeys(unit_cols, 0)
    for g, cols in enumerate(cols_all):
        for uid in np.unique(cols // w).tolist():
            owners[uid] |= 1 << g
    units = sorted(owners.items(), key=lambda kv: (-bin(kv[1]).count("1"), kv[0]))

    kmax = max((len(s) for s in supports), default=0)
    n_chunks = -(-kmax // bk)
    cnt = np.zeros((r, n_chunks), dtype=np.int64)      # entries per group and chunk
    ucnt = np.zeros(n_chunks, dtype=np.int64)          # union slots (in columns) per chunk
    full = np.zeros(n_chunks, dtype=np.int64)          # bitmask: groups with no room for a unit
    place: list = [[] for _ in range(n_chunks)]        # per chunk: (columns, groups bitmask)

    def grow():
        nonlocal cnt, ucnt, full
        cnt = np.concatenate([cnt, np.zeros((r, 1), dtype=np.int64)], axis=1)
        ucnt = np.append(ucnt, 0)
        full = np.append(full, 0)
        place.append([])
        return cnt.shape[1] - 1

    def add(c, mask):
        for g in range(r):          # a unit takes w entries (a clipped run pads to w)
            if mask >> g & 1:
                cnt[g, c] += w
                if cnt[g, c] + w > bk:
                    full[c] |= 1 << g

    for uid, mask in units:
        cols = unit_cols[uid]
        ok = np.flatnonzero(((full & mask) == 0) & (ucnt + w <= u))
        if ok.size:
            c = int(ok[0])
            add(c, mask)
            ucnt[c] += w
            place[c].append((cols, mask))
            continue
        # no chunk fits every group: place group by group
        where: dict = {}
        for g in range(r):
            if not mask >> g & 1:
                continue
            room = np.flatnonzero((full >> g & 1) == 0)
            c = next((int(c_) for c_ in room if c_ in where or ucnt[c_] + w <= u), None)
            if c is None:
                c = grow()
            if c not in where:
                where[c] = 0
                ucnt[c] += w
            where[c] |= 1 << g
            add(c, 1 << g)
        for c, m in where.items():
            place[c].append((cols, m))

    n_chunks = len(place)
    out_cols = np.full((n_chunks, u), -1, dtype=np.int32)
    local = np.zeros((n_chunks, r, bk), dtype=np.uint8)
    src = np.full((n_chunks, r, bk), -1, dtype=np.int64)
    pos_in = [dict(zip(cols.tolist(), range(cols.size))) for cols in cols_all]
    for c in range(n_chunks):
        slot_of, entries = _assign_slots(place[c], r, u, w)
        for col, s in slot_of.items():
            out_cols[c, s] = col
        loaded = np.array(sorted(slot_of.values()), dtype=np.int64)
        for g in range(r):
            mine = [col for col in entries[g] if col in pos_in[g]]  # a run may be partly another group's
            order = _octets(mine, slot_of, bk, loaded, w >= 8)
            for e, col in enumerate(order):
                if col >= 0:
                    local[c, g, e] = slot_of[col]
                    src[c, g, e] = pos_in[g][col]
                else:              # padding: a loaded slot of the residue the octet lacks
                    local[c, g, e] = -col - 1
    return SharedChunks(cols=out_cols, local=local, src=src)


def _assign_slots(placed: list, r: int, u: int, w: int):
    """Slots for one chunk's union columns: 8-aligned blocks for runs of w
    >= 8 columns, else residues balanced per group.  Returns (column ->
    slot, per group the list of its columns in the chunk)."""
    slot_of: dict = {}
    entries = [[] for _ in range(r)]
    if w >= 8:
        nxt = 0
        for cols, mask in placed:
            for j, col in enumerate(cols.tolist()):
                slot_of[col] = nxt + j
            nxt += w
            for g in range(r):
                if mask >> g & 1:
                    entries[g].extend(cols.tolist())
        return slot_of, entries
    per_res = np.zeros(8, dtype=np.int64)          # slots used per residue
    gres = np.zeros((r, 8), dtype=np.int64)         # a group's columns per residue
    cap = u // 8
    for cols, mask in placed:                       # most shared first (the packing order)
        col = int(cols[0])
        groups = [g for g in range(r) if mask >> g & 1]
        score = gres[groups].max(axis=0) * 64 + gres[groups].sum(axis=0)
        score = np.where(per_res < cap, score, np.iinfo(np.int64).max)
        res = int(np.argmin(score))
        slot_of[col] = res + 8 * int(per_res[res])
        per_res[res] += 1
        gres[groups, res] += 1
        for g in groups:
            entries[g].append(col)
    return slot_of, entries


def _octets(cols: list, slot_of: dict, bk: int, loaded: np.ndarray, aligned: bool) -> list:
    """A group's BK entries in one chunk, as BK/8 octets.  aligned (runs in
    8-aligned slot blocks): one octet per block the group reads; else the
    columns dealt into octets by slot residue (8 distinct residues where
    the counts allow).  Padding entries are -(slot + 1) of a loaded slot,
    of a residue the octet lacks where there is one."""
    n_oct = bk // 8
    if aligned:
        blocks: dict = {}
        for col in cols:
            blocks.setdefault(slot_of[col] // 8, []).append(col)
        octs = [sorted(v, key=lambda c: slot_of[c]) for _, v in sorted(blocks.items())]
    else:
        octs = [[] for _ in range(n_oct)]
        ordered = sorted(cols, key=lambda c: (slot_of[c] % 8, slot_of[c]))
        for i, col in enumerate(ordered):
            octs[i % n_oct].append(col)
    if len(octs) > n_oct or any(len(o) > 8 for o in octs):
        raise AssertionError("a group took more than BK entries of a chunk")
    octs += [[] for _ in range(n_oct - len(octs))]
    by_res: dict = {}
    for s in loaded.tolist():
        by_res.setdefault(s % 8, s)
    fallback = int(loaded[0]) if loaded.size else 0
    out = []
    for o in octs:
        have = {slot_of[c] % 8 for c in o}
        pads = [-(by_res[res] + 1) for res in range(8) if res not in have and res in by_res]
        pads = pads[:8 - len(o)]
        pads += [-(fallback + 1)] * (8 - len(o) - len(pads))
        out.extend(o + pads)
    return out


def pack_sets(supports: list, order: np.ndarray, xr: int, bk: int, u: int, run: int):
    """Sets of xr groups in schedule order (longest first), each packed."""
    sets = []
    for i in range(0, len(order), xr):
        members = [int(g) for g in order[i:i + xr]]
        sets.append((members, pack_set([supports[g] for g in members], bk, u, run)))
    return sets
