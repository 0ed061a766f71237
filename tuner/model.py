"""Tuning every sparse layer of a model file: choose each layer's family,
tune identical matrices once, and produce the per-layer table."""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Optional

from ..generator.families import auto_pattern, family_of, parse_pattern
from ..generator.kernel import Epilogue, Operation
from ..generator.matrix import SparseMatrix
from .driver import LayerResult, Tuner

# A 2-D weight at or above this density is dense: it is listed, not tuned.
SPARSE_DENSITY_LIMIT = 0.75


def op_for(pattern: str, matrix: SparseMatrix, activation: str = "none",
           layout: str = "fm") -> Operation:
    """The operation a pattern's family computes `matrix` in: the family's
    dtype for the matrix's (fp16 for an fp32 matrix on a 16-bit family)."""
    fam, _ = family_of(pattern)
    return Operation(dtype=fam.dtype_for(matrix.dtype), layout=layout,
                     epilogue=Epilogue(activation=activation))


class Progress:
    """A one-line progress bar on a terminal, periodic lines otherwise."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
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


def tune_model(matrices: list[tuple[str, SparseMatrix]], tuner: Tuner, ns: list[int],
               pattern: Optional[str] = None, activation: str = "none", layout: str = "fm",
               force: bool = False, log=sys.stderr) -> list[ModelRow]:
    rows: list[ModelRow] = []
    done: dict = {}
    for name, m in matrices:
        if pattern is None and m.density >= SPARSE_DENSITY_LIMIT:
            rows.append(ModelRow(name, None, f"dense (density {m.density:.2f})"))
            continue
        pat = pattern or auto_pattern(m)
        fam, params = parse_pattern(pat)
        op = op_for(pat, m, activation, layout)
        if pattern is not None and m.density >= SPARSE_DENSITY_LIMIT:
            print(f"note: {name} is dense (density {m.density:.2f}); tuning it as {pat} as "
                  "asked (without --pattern, dense layers are listed and skipped)", file=log)
        elif pattern is not None and not family_of(pat)[0].fits(m, params):
            print(f"note: {name} ({m.rows}x{m.cols}, density {m.density:.2f}) does not fit "
                  f"{pat} exactly; tuning it as {pat} as asked (the family stores what it "
                  f"must, or refuses the matrix)", file=log)
        key = (m.fingerprint(), pat, op)
        if key in done:
            # identical matrix: tuned once, stored again under this name
            first = done[key]
            res = tuner.tune(m, fam, params, op, ns, name, force=False)
            res.note = f"same matrix as {first}"
            rows.append(ModelRow(name, res))
            continue
        print(f"tuning {name}: {m.rows}x{m.cols} density {m.density:.3f} as {pat} ({op.dtype})",
              file=log)
        res = tuner.tune(m, fam, params, op, ns, name, force=force)
        done[key] = name
        rows.append(ModelRow(name, res))
    return rows


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
    return "\n".join(out)
