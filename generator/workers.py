"""Work spread over worker processes, the results in order: a model's
layers drawn and pruned (generator/recipe.py), a file's matrices pruned
(generator/prune.py)."""
from __future__ import annotations

import sys
from collections import deque
from typing import Callable, Iterable, Iterator

_END = object()


def in_order(fn: Callable, items: Iterable, jobs: int, *, died: str,
             alone: str = "note: one at a time in this process ({error})") -> Iterator:
    """fn(item) of each item, in order, `jobs` worker processes at a time
    (spawned: the caller may hold threads, whose locks a fork would copy,
    or a CUDA context), each result as soon as it and those before it are
    done.  At most `jobs` items are in flight, so a generator of large
    items is not held in memory at once.  With jobs <= 1, or where no
    process can be started here (`alone`, with {error}, is printed on
    stderr), one by one in this process.  A worker that dies (out of
    memory, killed) is a RuntimeError: `died` with {i}, the index of the
    first item not done."""
    it = iter(items)
    if jobs <= 1:
        yield from map(fn, it)
        return
    first = next(it, _END)
    if first is _END:
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        pending = deque([pool.submit(fn, first)])
    except OSError as e:   # no processes here (a sandbox, a limit): one by one
        print(alone.format(error=e), file=sys.stderr)
        yield fn(first)
        yield from map(fn, it)
        return
    done = 0

    def result(future):
        nonlocal done
        try:
            out = future.result()
        except BrokenProcessPool:
            raise RuntimeError(died.format(i=done)) from None
        done += 1
        return out

    with pool:
        for item in it:
            if len(pending) >= jobs:
                yield result(pending.popleft())
            pending.append(pool.submit(fn, item))
        while pending:
            yield result(pending.popleft())
