"""Every configuration, in batches (for small spaces); the next batch
compiles while the current one is measured."""
from typing import Sequence

from . import Budget, Evaluate, Strategy, prefetch, register


@register
class Exhaustive(Strategy):
    name = "exhaustive"
    batch = 16

    def run(self, space: list[dict], evaluate: Evaluate, budget: Budget, seed: int = 0,
            hints: Sequence[dict] = ()) -> None:  # every configuration: hints change nothing
        chunks = [space[i:i + self.batch] for i in range(0, len(space), self.batch)]
        run_batches(chunks, evaluate, budget)


def run_batches(chunks: list[list[dict]], evaluate: Evaluate, budget: Budget) -> None:
    """Measures the chunks in order within the budget, naming each next
    chunk (as far as the budget reaches) before measuring the current one."""
    for i, chunk in enumerate(chunks):
        if budget.exhausted():
            return
        rem = budget.remaining()
        if rem is not None:
            chunk = chunk[:rem]
        prefetch(evaluate, chunk)
        if i + 1 < len(chunks):
            after = chunks[i + 1]
            prefetch(evaluate, after if rem is None else after[:max(0, rem - len(chunk))])
        evaluate(chunk)
