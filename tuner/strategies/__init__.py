"""Search strategies, one module each, behind one interface.

A strategy gets the search space (a list of configuration dicts), an
`evaluate` callable and a Budget.  `evaluate(configs)` measures a batch
(compiled in parallel, timed serially) and returns one time per config in
milliseconds, `math.inf` for a failed one; results already known (resumed
trials) come back without being measured again.  A strategy stops when
`budget.exhausted()` says so or when it has nothing left to try.  Hints
(the family's preferred configurations) go first where the budget is
short of the space.  A strategy that knows its next batch before it
measures the current one names it with `prefetch(evaluate, batch)`, so
that it compiles while the current one is measured, and what may come
after with `prefetch(evaluate, configs, speculative=True)`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

Evaluate = Callable[[list[dict]], list[float]]


@dataclass
class Budget:
    max_trials: Optional[int] = None      # trials the strategy may ask for
    max_seconds: Optional[float] = None
    trials: int = 0
    started: float = field(default_factory=time.monotonic)

    def exhausted(self) -> bool:
        if self.max_trials is not None and self.trials >= self.max_trials:
            return True
        if self.max_seconds is not None and time.monotonic() - self.started >= self.max_seconds:
            return True
        return False

    def remaining(self) -> Optional[int]:
        return None if self.max_trials is None else max(0, self.max_trials - self.trials)

    @classmethod
    def parse(cls, text: Optional[str], space_size: int) -> "Budget":
        """'all', '40' (trials), '25%' (of the space), '90s' / '5m' (time).
        ValueError for anything else, and for a budget of nothing (0, a
        negative number, 0%, 0s)."""
        if text is None or text.strip().lower() == "all":
            return cls()
        t = text.strip().lower()
        usage = ("expected all, N (trials), P% (of the space, 0 < P <= 100), Ns or Nm "
                 "(time), each above zero")
        try:
            value = float(t[:-1]) if t[-1:] in ("%", "s", "m") else int(t)
        except ValueError:
            raise ValueError(f"bad budget {text!r}: {usage}") from None
        if not value > 0 or value != value or value == float("inf") or (t.endswith("%") and value > 100):
            raise ValueError(f"bad budget {text!r}: {usage}")
        if t.endswith("%"):
            return cls(max_trials=max(1, math.ceil(space_size * value / 100)))
        if t.endswith("s"):
            return cls(max_seconds=value)
        if t.endswith("m"):
            return cls(max_seconds=60 * value)
        return cls(max_trials=int(value))


class Strategy:
    name = ""

    def run(self, space: list[dict], evaluate: Evaluate, budget: Budget, seed: int = 0,
            hints: Sequence[dict] = ()) -> None:
        """Measures configurations of `space` through `evaluate` until the
        budget is spent.  `hints`: configurations the family expects to be
        good (measured elsewhere), which a budgeted strategy tries first."""
        raise NotImplementedError


def hinted(space: list[dict], hints: Sequence[dict]) -> list[dict]:
    """The hints that are in `space`, in order, once each."""
    by_key = {config_key(c): c for c in space}
    out, seen = [], set()
    for h in hints:
        k = config_key(h)
        if k in by_key and k not in seen:
            seen.add(k)
            out.append(by_key[k])
    return out


def prefetch(evaluate: Evaluate, configs: list[dict], speculative: bool = False) -> None:
    """Tells `evaluate` which configurations come next, where it listens
    (the tuner's does: it starts compiling them); otherwise nothing.
    `speculative`: configurations that may come after those (built behind
    the ones named without it)."""
    ahead = getattr(evaluate, "prefetch", None)
    if ahead is not None and configs:
        if speculative:
            ahead(configs, speculative=True)
        else:
            ahead(configs)


def config_key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


_STRATEGIES: dict[str, type] = {}


def register(cls):
    _STRATEGIES[cls.name] = cls
    return cls


def get_strategy(name: str) -> Strategy:
    from . import exhaustive, greedy, random_search  # noqa: F401
    if name not in _STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(_STRATEGIES))}")
    return _STRATEGIES[name]()


def strategy_names() -> list[str]:
    from . import exhaustive, greedy, random_search  # noqa: F401
    return sorted(_STRATEGIES)
