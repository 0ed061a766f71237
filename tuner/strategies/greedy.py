"""Budgeted neighbourhood search for large spaces.

Starts from the family's hints and a spread sample (a quarter of the
budget together), then repeatedly measures the unmeasured neighbours of the
best configurations found so far (neighbours differ in exactly one
parameter, or in having one optional key), best first; when the best ones
have no unmeasured neighbours left it samples at random again.  Tile
sizes interact mostly one parameter at a time, so most of the budget goes
where the good configurations are.

It streams: up to IN_FLIGHT configurations are asked for (being built)
ahead of the one measured, each picked from the best measured so far when
there is room, and what may come after them is named to be built
speculatively -- with a round of candidates measured at a time, every
round waited for its slowest compilation.
"""
import math
import random
from collections import deque

from typing import Sequence

from . import Budget, Evaluate, Strategy, config_key, hinted, prefetch, register


_ABSENT = object()   # a neighbour's value for an optional key: the key left out
# Configurations built speculatively while a batch is measured (the
# neighbours of the best SPECULATE_FROM so far not in the batch): each
# round otherwise waits for one compilation while the threads sit idle.
SPECULATE, SPECULATE_FROM = 16, 4
# ... and the next configurations of the random order taken where the best
# ones have no neighbours left (on the 2:4 space of an H100 most of a
# search's budget: each such pick otherwise waited for its compilation).
SPECULATE_LATER = 8
# Configurations asked for ahead of the one measured, each chosen from the
# best measured so far when the queue has room and measured in the order
# asked (deterministic for given times).  Few: a pick made on older times
# is a worse pick (on the synthetic tables of tests/py/test_strategies.py,
# a quarter of the space found the best within 5% for 40 of 40 tables with
# 2 ahead, 35 with 4, 24 with 8); the speculative builds are what keep the
# compile threads ahead.
IN_FLIGHT = 2


def _neighbours(config: dict, index: dict, by_key: dict) -> list[dict]:
    """The configurations of the space that differ from `config` in one
    parameter; a key only some configurations have (an optional one) counts
    as absent = one more value, so adding or dropping it is one step."""
    out = []
    for name, values in index.items():
        for value in values:
            if value == config.get(name, _ABSENT):
                continue
            cand = dict(config)
            if value is _ABSENT:
                del cand[name]
            else:
                cand[name] = value
            k = config_key(cand)
            if k in by_key:
                out.append(by_key[k])
    return out


@register
class Greedy(Strategy):
    name = "greedy"

    def run(self, space: list[dict], evaluate: Evaluate, budget: Budget, seed: int = 0,
            hints: Sequence[dict] = ()) -> None:
        rng = random.Random(seed)
        by_key = {config_key(c): c for c in space}
        index: dict = {}
        for c in space:
            for k, v in c.items():
                index.setdefault(k, [])
                if v not in index[k]:
                    index[k].append(v)
        for k, values in index.items():
            if any(k not in c for c in space):
                values.append(_ABSENT)
        times: dict = {}
        queue: deque = deque()     # asked for (building), not measured yet, in order
        queued: set = set()

        def untouched(c: dict) -> bool:
            """Neither measured nor queued."""
            k = config_key(c)
            return k not in times and k not in queued

        def near(ranked_keys) -> list[dict]:
            """The untouched neighbours of these configurations, in order."""
            out, seen = [], set()
            for k in ranked_keys:
                for n in _neighbours(by_key[k], index, by_key):
                    nk = config_key(n)
                    if untouched(n) and nk not in seen:
                        seen.add(nk)
                        out.append(n)
            return out

        def ask(configs) -> None:
            """Queues configurations (within the budget) and has them built."""
            rem = budget.remaining()
            room = len(configs) if rem is None else max(0, rem - len(queue))
            new = [c for c in configs if untouched(c)][:room]
            for c in new:
                queue.append(c)
                queued.add(config_key(c))
            prefetch(evaluate, new)

        def speculate(configs) -> None:
            rem = budget.remaining()
            most = SPECULATE + SPECULATE_LATER
            left = most if rem is None else min(most, rem - len(queue))
            if configs and left > 0:
                prefetch(evaluate, configs[:left], speculative=True)

        total = budget.max_trials if budget.max_trials is not None else len(space)
        init = max(4, math.ceil(total / 4))
        first = hinted(space, hints)[:init]  # the family's picks, then a spread sample
        picked = {config_key(c) for c in first}
        rest = [c for c in space if config_key(c) not in picked]
        ask(first + rng.sample(rest, min(init - len(first), len(rest))))
        # where the best ones have no neighbours left: the rest of the space
        # in an order drawn now, so that the next of them are known (and
        # built) before they are asked for
        later = rng.sample(space, len(space))

        def upcoming(count: int) -> list[dict]:
            return [c for c in later if untouched(c)][:count]

        # meanwhile: the first hint's neighbours (a warm search's first hint
        # is the earlier matrices' winner)
        speculate(near([config_key(first[0])]) if first else [])
        while not budget.exhausted() and len(times) < len(space):
            if len(queue) < IN_FLIGHT:
                ranked = [k for _, k in sorted((t, k) for k, t in times.items() if math.isfinite(t))]
                batch = near(ranked[:3])[:IN_FLIGHT - len(queue)]
                if not batch and not queue:
                    batch = upcoming(IN_FLIGHT)
                ask(batch)
                speculate(near(ranked[:SPECULATE_FROM])[:SPECULATE] + upcoming(SPECULATE_LATER))
            if not queue:
                return
            c = queue.popleft()
            queued.discard(config_key(c))
            times[config_key(c)] = evaluate([c])[0]
