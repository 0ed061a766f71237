"""Every configuration, in batches (for small spaces)."""
from typing import Sequence

from . import Budget, Evaluate, Strategy, register


@register
class Exhaustive(Strategy):
    name = "exhaustive"
    batch = 16

    def run(self, space: list[dict], evaluate: Evaluate, budget: Budget, seed: int = 0,
            hints: Sequence[dict] = ()) -> None:  # every configuration: hints change nothing
        for i in range(0, len(space), self.batch):
            if budget.exhausted():
                return
            chunk = space[i:i + self.batch]
            rem = budget.remaining()
            if rem is not None:
                chunk = chunk[:rem]
            evaluate(chunk)
