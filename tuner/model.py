"""Tuning every sparse layer of a model file: choose each layer's family,
tune identical matrices once, and produce the per-layer table."""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional

import numpy as np

from ..generator.families import auto_pattern, family_of, parse_pattern
from ..generator.kernel import Epilogue, Operation
from ..generator.matrix import SparseMatrix
from .driver import LayerResult, Tuner

# A 2-D weight at or above this density is dense: it is listed, not tuned.
SPARSE_DENSITY_LIMIT = 0.75


def op_for(pattern: str, matrix: SparseMatrix, activation: str = "none",
           layout: str = "fm", bias: bool = False) -> Operation:
    """The operation a pattern's family computes `matrix` in: the family's
    dtype for the matrix's (fp16 for an fp32 matrix on a 16-bit family)."""
    fam, _ = family_of(pattern)
    return Operation(dtype=fam.dtype_for(matrix.dtype), layout=layout,
                     epilogue=Epilogue(bias=bias, activation=activation))


class Progress:
    """A one-line progress bar on a terminal, periodic lines otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr      # the one in use now, not at import
        self.tty = self.stream.isatty()
        self.last = 0.0

    def __call__(self, label: str, done: int, total: int):
        now = time.monotonic()
        if not self.tty and now - self.last < 5 and done < total:
            return
        self.last = now
        width = 30
        frac = min(1.0, done / total) if total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        line = f"{label[:40]:40s} [{bar}] {done}/{total}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done >= total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


@dataclass
class ModelRow:
    name: str
    result: Optional[LayerResult]
    skipped: str = ""
    index: int = 0          # the layer's position in the model (or the sweep)

    def light(self) -> "ModelRow":
        """The row without its matrix (to send it to another process)."""
        if self.result is None:
            return self
        return ModelRow(self.name, replace(self.result, matrix=None), self.skipped, self.index)


@dataclass
class Entry:
    """One layer of a model (or point of a sweep) as the tuning sees it:
    skipped (dense), or a matrix to tune under `name`.  Entries with one
    `key` (the same matrix, pattern and operation) are tuned once: the
    first, then the others from its trials (`first` names it)."""
    index: int
    name: str
    matrix: Optional[SparseMatrix] = None
    skipped: str = ""
    pattern: str = ""
    op: Optional[Operation] = None
    key: tuple = ()
    first: str = ""
    cost: float = 0.0       # the work it is expected to take, for sharing it out
    make: Optional[Callable[[], SparseMatrix]] = None   # the matrix, made when needed
    bias: Optional[np.ndarray] = None   # added in the epilogue (op's epilogue has bias)

    def get_matrix(self) -> SparseMatrix:
        if self.matrix is None:
            self.matrix = self.make()
        return self.matrix


def plan_model(matrices: list[tuple[str, SparseMatrix]], pattern: Optional[str] = None,
               activation: str = "none", layout: str = "fm", log=None,
               biases: Optional[dict] = None) -> list[Entry]:
    """Each 2-D weight's entry: dense ones skipped (unless --pattern), the
    family each fits, identical matrices tied to the first; a note where
    an explicit pattern meets a dense or non-fitting matrix (on `log`,
    stderr by default).  `biases`: name -> bias (M values) of the weights
    whose epilogue adds one."""
    log = log or sys.stderr
    entries: list[Entry] = []
    firsts: dict = {}
    for index, (name, m) in enumerate(matrices):
        if pattern is None and m.density >= SPARSE_DENSITY_LIMIT:
            entries.append(Entry(index, name, m, skipped=f"dense (density {m.density:.2f})"))
            continue
        pat = pattern or auto_pattern(m)
        fam, params = parse_pattern(pat)
        bias = (biases or {}).get(name)
        op = op_for(pat, m, activation, layout, bias=bias is not None)
        if pattern is not None and m.density >= SPARSE_DENSITY_LIMIT:
            print(f"note: {name} is dense (density {m.density:.2f}); tuning it as {pat} as "
                  "asked (without --pattern, dense layers are listed and skipped)", file=log)
        elif pattern is not None and not family_of(pat)[0].fits(m, params):
            print(f"note: {name} ({m.rows}x{m.cols}, density {m.density:.2f}) does not fit "
                  f"{pat} exactly; tuning it as {pat} as asked (the family stores what it "
                  f"must, or refuses the matrix)", file=log)
        key = (m.fingerprint(), pat, op)
        first = firsts.setdefault(key, name)
        entries.append(Entry(index, name, m, pattern=pat, op=op, key=key,
                             first="" if first == name else first, cost=float(max(1, m.nnz)),
                             bias=bias))
    return entries


def tune_entry(tuner: Tuner, entry: Entry, ns: list[int], force: bool = False,
               log=None) -> ModelRow:
    """One entry on one tuner: skipped, tuned, or (a copy of an earlier
    matrix) served from its trials and stored under its own name.  Says
    what it tunes on `log` (stderr by default)."""
    log = log or sys.stderr
    if entry.skipped:
        return ModelRow(entry.name, None, entry.skipped, entry.index)
    m = entry.get_matrix()
    fam, params = parse_pattern(entry.pattern)
    if entry.first:
        res = tuner.tune(m, fam, params, entry.op, ns, entry.name, bias=entry.bias, force=False)
        res.note = f"same matrix as {entry.first}"
    else:
        print(f"tuning {entry.name}: {m.rows}x{m.cols} density {m.density:.3f} as "
              f"{entry.pattern} ({entry.op.dtype})", file=log)
        res = tuner.tune(m, fam, params, entry.op, ns, entry.name, bias=entry.bias, force=force)
    return ModelRow(entry.name, res, index=entry.index)


def cold_entries(entries: list[Entry]) -> list[int]:
    """The positions of the entries whose search starts cold: the first of
    each shape, pattern and operation (the later ones start from its
    winners), copies of earlier matrices and skipped layers left out, and
    entries whose matrix is made on demand (a sweep's points: looking ahead
    would make them early)."""
    seen, out = set(), []
    for i, e in enumerate(entries):
        if e.skipped or e.first or e.matrix is None:
            continue
        m = e.matrix
        key = (m.rows, m.cols, e.pattern, e.op)
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


def tune_each(entries: list[Entry], tuner: Tuner, ns: list[int], force: bool = False,
              log=None) -> Iterator[ModelRow]:
    """The entries tuned one after another, each row as it is done.  As
    each entry starts, the next cold one (cold_entries) is looked ahead
    at: its first candidates build behind the current entry's work."""
    cold = cold_entries(entries) if tuner.gpu else []
    for i, e in enumerate(entries):
        nxt = next((j for j in cold if j > i), None)
        if nxt is not None:
            a = entries[nxt]
            fam, params = parse_pattern(a.pattern)
            tuner.look_ahead(a.get_matrix(), fam, params, a.op, ns, a.name, bias=a.bias,
                             force=force)
        yield tune_entry(tuner, e, ns, force, log)


def tune_entries(entries: list[Entry], tuner: Tuner, ns: list[int], force: bool = False,
                 log=None) -> list[ModelRow]:
    return list(tune_each(entries, tuner, ns, force, log))


def tune_model(matrices: list[tuple[str, SparseMatrix]], tuner: Tuner, ns: list[int],
               pattern: Optional[str] = None, activation: str = "none", layout: str = "fm",
               force: bool = False, log=None) -> list[ModelRow]:
    return tune_entries(plan_model(matrices, pattern, activation, layout, log), tuner, ns,
                        force, log)


def shard(entries: list[Entry], size: int) -> list[int]:
    """The rank (0 .. size-1) of each entry, the same on every rank: the
    tuned matrices by decreasing cost, each to the least loaded rank (ties
    to the lowest), an identical matrix to its first's rank, skipped
    entries to rank 0 (which lists them)."""
    ranks = [0] * len(entries)
    load = [0.0] * size
    of_key: dict = {}
    primaries = sorted((e for e in entries if not e.skipped and not e.first),
                       key=lambda e: (-e.cost, e.index))
    for e in primaries:
        r = min(range(size), key=lambda i: (load[i], i))
        load[r] += e.cost
        of_key[e.key] = r
    for i, e in enumerate(entries):
        if not e.skipped:
            ranks[i] = of_key[e.key]
    return ranks


def _fmt(v: float, spec: str) -> str:
    return format(v, spec) if v == v and not math.isinf(v) else "-"


def format_table(rows: list[ModelRow], device_name: str) -> str:
    head = (f"{'layer':32s} {'family':10s} {'N':>6s} {'config':44s} {'time ms':>9s} "
            f"{'cuBLAS ms':>9s} {'speedup':>7s} {'max err':>8s}")
    out = [f"GPU: {device_name}", head, "-" * len(head)]
    for row in rows:
        if row.result is None:
            out.append(f"{row.name[:32]:32s} skipped: {row.skipped}")
            continue
        r = row.result
        if not r.measured:
            out.append(f"{row.name[:32]:32s} {r.family_tag:10s} {r.note}")
            continue
        for n, nr in sorted(r.per_n.items()):
            cfg = ",".join(f"{k}={v}" for k, v in sorted((nr.config or {}).items())) or "(no valid kernel)"
            out.append(f"{row.name[:32]:32s} {r.family_tag:10s} {n:6d} {cfg[:44]:44s} "
                       f"{_fmt(nr.median_ms, '9.4f')} {_fmt(nr.peer_ms, '9.4f')} "
                       f"{_fmt(nr.speedup, '6.2f') + 'x' if nr.speedup == nr.speedup else '      -'} "
                       f"{_fmt(nr.max_error, '8.1e')}")
    if any(nr.recorded for row in rows if row.result is not None
           for nr in row.result.per_n.values()):
        out.append("(layers the database held: the times recorded when they were tuned on "
                   "this GPU; --retime verifies and times them again)")
    return "\n".join(out)


def format_profile(rows: list[ModelRow]) -> str:
    """--profile: each layer's searches (trials, failures, timings stopped
    early, winners of earlier matrices it started from) and, where one
    tuner did all of it, where its time went."""
    out = []
    for row in rows:
        r = row.result
        if r is None or not r.measured:
            continue
        for n, nr in sorted(r.per_n.items()):
            out.append(f"  {row.name[:40]:40s} N={n:<6d} {nr.trials:4d} trials ({nr.failed} failed, "
                       f"{nr.stopped_early} stopped early, {nr.filled} while compiling), "
                       f"{nr.warm_hints} earlier winners")
        if r.seconds:
            spent = ", ".join(f"{p} {s:.2f}" for p, s in r.seconds.items() if s >= 0.005)
            out.append(f"  {row.name[:40]:40s} {spent or 'no time in any phase'}")
    if not out:
        return "profile: nothing was measured"
    return "\n".join(["profile: per layer and N, trials (failed, stopped early) and the "
                      "earlier winners the search started from; seconds per phase"] + out)
