"""Uniform random sampling without replacement, up to the budget."""
import random

from . import Budget, Evaluate, Strategy, register


@register
class RandomSearch(Strategy):
    name = "random"
    batch = 8

    def run(self, space: list[dict], evaluate: Evaluate, budget: Budget, seed: int = 0) -> None:
        order = list(space)
        random.Random(seed).shuffle(order)
        for i in range(0, len(order), self.batch):
            if budget.exhausted():
                return
            chunk = order[i:i + self.batch]
            rem = budget.remaining()
            if rem is not None:
                chunk = chunk[:rem]
            evaluate(chunk)
