"""Budgeted neighbourhood search for large spaces.

Starts from the family's hints and a spread sample (a quarter of the
budget together), then repeatedly measures the unmeasured neighbours of the
best configurations found so far (neighbours differ in exactly one
parameter, or in having one optional key), best first; when the best ones
have no unmeasured neighbours left it samples at random again.  Tile
sizes interact mostly one parameter at a time, so most of the budget goes
where the good configurations are.  While a batch is measured, what may
come next (the neighbours of the best so far beyond the batch) is named
to be built speculatively.
"""
import math
import random

from typing import Sequence

from . import Budget, Evaluate, Strategy, config_key, hinted, prefetch, register


_ABSENT = object()   # a neighbour's value for an optional key: the key left out
# Configurations built speculatively while a batch is measured (the
# neighbours of the best SPECULATE_FROM so far not in the batch): each
# round otherwise waits for one compilation while the threads sit idle.
SPECULATE, SPECULATE_FROM = 16, 4


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

        def measure(batch, after=()):
            """Measures the batch; `after`: what may be asked for next,
            built speculatively meanwhile (within the budget)."""
            rem = budget.remaining()
            if rem is not None:
                batch = batch[:rem]
            batch = [c for c in batch if config_key(c) not in times]
            if not batch:
                return
            keys = {config_key(c) for c in batch}
            after = [c for c in after if config_key(c) not in times and config_key(c) not in keys]
            left = SPECULATE if rem is None else min(SPECULATE, rem - len(batch))
            if after and left > 0:
                prefetch(evaluate, after[:left], speculative=True)
            for c, t in zip(batch, evaluate(batch)):
                times[config_key(c)] = t

        def near(ranked_keys) -> list[dict]:
            """The unmeasured neighbours of these configurations, in order."""
            out, seen = [], set()
            for k in ranked_keys:
                for n in _neighbours(by_key[k], index, by_key):
                    nk = config_key(n)
                    if nk not in times and nk not in seen:
                        seen.add(nk)
                        out.append(n)
            return out

        total = budget.max_trials if budget.max_trials is not None else len(space)
        init = max(4, math.ceil(total / 4))
        first = hinted(space, hints)[:init]  # the family's picks, then a spread sample
        picked = {config_key(c) for c in first}
        rest = [c for c in space if config_key(c) not in picked]
        # while the first batch is measured: the first hint's neighbours (a
        # warm search's first hint is the earlier matrices' winner)
        measure(first + rng.sample(rest, min(init - len(first), len(rest))),
                near([config_key(first[0])]) if first else ())
        while not budget.exhausted() and len(times) < len(space):
            ranked = sorted((t, k) for k, t in times.items() if math.isfinite(t))
            batch = []
            for _, k in ranked[:3]:
                batch += [n for n in _neighbours(by_key[k], index, by_key)
                          if config_key(n) not in times and n not in batch]
                if len(batch) >= 6:
                    break
            if not batch:
                rest = [c for c in space if config_key(c) not in times]
                batch = rng.sample(rest, min(4, len(rest)))
            # meanwhile: the next rounds should the best stay the best
            measure(batch[:8], near([k for _, k in ranked[:SPECULATE_FROM]]))
