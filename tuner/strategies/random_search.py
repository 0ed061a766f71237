"""Uniform random sampling without replacement, up to the budget (the
family's hints first)."""
import random
from typing import Sequence

from . import Budget, Evaluate, Strategy, config_key, hinted, register
from .exhaustive import run_batches


@register
class RandomSearch(Strategy):
    name = "random"
    batch = 8

    def run(self, space: list[dict], evaluate: Evaluate, budget: Budget, seed: int = 0,
            hints: Sequence[dict] = ()) -> None:
        first = hinted(space, hints)
        picked = {config_key(c) for c in first}
        order = [c for c in space if config_key(c) not in picked]
        random.Random(seed).shuffle(order)
        order = first + order
        run_batches([order[i:i + self.batch] for i in range(0, len(order), self.batch)],
                    evaluate, budget)
