"""Magnitude pruning to Shfl-BW: rows are permuted, then each group of V
consecutive rows keeps whole V x 1 column vectors, the ones of largest L2
norm over all groups.  The permutation is searched: rows are clustered by
where their large weights are (greedy on normalized |w| profiles), refined
by reassigning rows to the group whose kept columns hold most of their
energy, and compared with the identity order; the order that keeps the
most |W|^2 wins.
"""
from __future__ import annotations

import numpy as np

from ...prune import closest_prefix, ranked


def group_sizes(m: int, v: int) -> np.ndarray:
    g = -(-m // v)
    sizes = np.full(g, v, dtype=np.int64)
    if g and m % v:
        sizes[-1] = m % v
    return sizes


def group_scores(sq: np.ndarray, perm: np.ndarray, v: int) -> np.ndarray:
    """(G x K) the sums of sq's rows in `perm` order, v at a time (the
    last group short where v does not divide M), each added row by row in
    order: the sums a zero-padded (G v x K) copy would give, without
    writing one (its fresh pages cost more than the sums)."""
    m, k = sq.shape
    whole = m // v
    score = np.empty((-(-m // v), k), dtype=np.float64)
    score[:whole] = sq[perm[:whole * v]].reshape(whole, v, k).sum(axis=1)
    if m % v:
        score[whole] = sq[perm[whole * v:]].sum(axis=0)
    return score


def _shflbw_select(sq: np.ndarray, perm: np.ndarray, v: int, target: int, rng):
    """For rows in `perm` order, groups of v: (selected (G x K) bool, kept
    energy) of the global best V x 1 vectors."""
    m, k = sq.shape
    g = -(-m // v)
    score = group_scores(sq, perm, v)
    sizes = np.repeat(group_sizes(m, v), k)
    order = ranked(score.ravel(), rng)
    n = closest_prefix(sizes[order], target)
    sel = np.zeros(g * k, dtype=bool)
    sel[order[:n]] = True
    return sel.reshape(g, k), float(score.ravel()[order[:n]].sum())


def _cluster_order(sq: np.ndarray, v: int, t: int) -> np.ndarray:
    """Greedy clustering of rows by their normalized |w| profile restricted
    to each row's t largest entries (|w| rather than w^2, whose few largest
    entries would dominate the similarity): seed a group with the free row
    of most energy, fill it with the v - 1 free rows most similar to it."""
    m, k = sq.shape
    t = max(1, min(t, k))
    if t < k:
        top = np.argpartition(-sq, t - 1, axis=1)[:, :t]
        prof = np.zeros_like(sq)
        np.put_along_axis(prof, top, np.take_along_axis(sq, top, axis=1), axis=1)
    else:
        prof = sq.copy()
    energy = prof.sum(axis=1)
    prof = np.sqrt(prof)
    norms = np.linalg.norm(prof, axis=1)
    prof /= np.where(norms > 0, norms, 1.0)[:, None]
    prof = prof.astype(np.float32)
    free = np.ones(m, dtype=bool)
    seeds = np.lexsort((np.arange(m), -energy))
    out = []
    si = 0
    remaining = m
    while remaining >= v:
        while not free[seeds[si]]:
            si += 1
        s = int(seeds[si])
        free[s] = False
        cols = np.flatnonzero(prof[s])
        cand = np.flatnonzero(free)
        if cols.size:
            sim = prof[np.ix_(cand, cols)] @ prof[s, cols]
        else:
            sim = np.zeros(cand.size, dtype=np.float32)
        pick = cand[np.lexsort((cand, -sim))[:v - 1]]
        free[pick] = False
        out.append(s)
        out.extend(sorted(pick.tolist()))
        remaining -= v
    out.extend(np.flatnonzero(free).tolist())
    return np.asarray(out, dtype=np.int64)


def _reassign(sq: np.ndarray, sel: np.ndarray, v: int) -> np.ndarray:
    """Balanced reassignment of rows to groups: each row to the group whose
    selected columns hold most of its energy, groups filled to capacity in
    order of preference.  Returns the new perm (groups in order)."""
    m = sq.shape[0]
    cap = group_sizes(m, v).copy()
    g = cap.size
    score = sq.astype(np.float32) @ sel.T.astype(np.float32)  # M x G
    assigned = np.full(m, -1, dtype=np.int64)
    while True:
        free = np.flatnonzero(assigned < 0)
        if free.size == 0:
            break
        sc = score[free].copy()
        sc[:, cap == 0] = -np.inf
        choice = np.argmax(sc, axis=1)
        best = sc[np.arange(free.size), choice]
        order = np.lexsort((free, -best, choice))
        ch = choice[order]
        first = np.searchsorted(ch, ch, side="left")
        rank = np.arange(ch.size) - first
        ok = rank < cap[ch]
        assigned[free[order[ok]]] = ch[ok]
        cap -= np.bincount(ch[ok], minlength=g)
    return np.lexsort((np.arange(m), assigned))


def prune_shflbw(w, target, rng, v, sparsity, refine=3):
    """(mask in original row order, perm, extra stats) of the best order found."""
    m, k = w.shape
    sq = np.square(w, dtype=np.float64)
    ident = np.arange(m, dtype=np.int64)
    seed_state = rng.bit_generator.state

    def evaluate(perm):
        rng.bit_generator.state = seed_state  # same tie-breaking for every order
        return _shflbw_select(sq, perm, v, target, rng)

    sel_id, e_id = evaluate(ident)
    best = (e_id, ident, sel_id)
    if m > v:
        t = int(round((1.0 - sparsity) * k))
        perm = _cluster_order(sq, v, t)
        sel, e = evaluate(perm)
        cands = [(e, perm, sel)]
        # refine from the better of the two
        cur = max(cands + [best], key=lambda c: c[0])
        for _ in range(refine):
            perm = _reassign(sq, cur[2], v)
            sel, e = evaluate(perm)
            if e <= cur[0] * (1 + 1e-12):
                break
            cur = (e, perm, sel)
        if cur[0] > best[0] * (1 + 1e-12):
            best = cur
    e, perm, sel = best
    # mask in original row order: position i (row perm[i]) keeps its group's columns
    mask = np.zeros((m, k), dtype=bool)
    mask[perm] = np.repeat(sel, group_sizes(m, v), axis=0)[:m]
    total = float(sq.sum())
    extra = {"permuted": not np.array_equal(perm, ident),
             "identity_kept_l2": e_id / total if total > 0 else 1.0}
    return mask, perm, extra
