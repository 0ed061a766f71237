"""Comparing two cache databases by content: every row of every table
(binaries, environments, matrices, trials, layers and their variants,
packed blobs), leaving out when a row was written (`created` columns) and
the order rows were written in.  What a merged MPI run must equal a
single-process run in (tests/py/test_mpi.py).

    python -m sparseforge.tuner.dbcompare A.db B.db   # exit 1 and the differences

It reads the files read-only with Python's sqlite3 and names no table of
its own: every table the schema holds is compared.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

IGNORED_COLUMNS = {"created"}


def content(path) -> dict[str, list[tuple]]:
    """table -> its rows (the compared columns, sorted); the column names
    under "<table>.columns"."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such database")
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name")]
        out: dict = {}
        for t in tables:
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')
                    if r[1] not in IGNORED_COLUMNS]
            rows = con.execute(f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in cols)} '
                               f'FROM "{t}"').fetchall()
            out[t] = sorted(rows, key=_order)
            out[f"{t}.columns"] = cols
        return out
    finally:
        con.close()


def _order(row: tuple):
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in row)


def differences(a, b, limit: int = 10) -> list[str]:
    """What differs between the databases `a` and `b` ([] when their
    content is the same): tables one lacks, then rows of each table that
    only one holds (at most `limit` per table)."""
    ca, cb = content(a), content(b)
    out = []
    for t in sorted(set(ca) | set(cb)):
        if t.endswith(".columns"):
            continue
        if t not in ca or t not in cb:
            out.append(f"table {t} only in {b if t in cb else a}")
            continue
        if ca[f"{t}.columns"] != cb[f"{t}.columns"]:
            out.append(f"table {t}: columns differ ({ca[f'{t}.columns']} vs {cb[f'{t}.columns']})")
            continue
        only_a, only_b = _minus(ca[t], cb[t]), _minus(cb[t], ca[t])
        cols = ca[f"{t}.columns"]
        for which, rows in ((a, only_a), (b, only_b)):
            for row in rows[:limit]:
                out.append(f"{t}: only in {which}: {_show(cols, row)}")
            if len(rows) > limit:
                out.append(f"{t}: ... {len(rows) - limit} more only in {which}")
    return out


def _minus(rows: list, other: list) -> list:
    """Rows of `rows` not matched one-for-one in `other` (a multiset difference)."""
    left: dict = {}
    for r in other:
        left[r] = left.get(r, 0) + 1
    out = []
    for r in rows:
        if left.get(r, 0):
            left[r] -= 1
        else:
            out.append(r)
    return out


def _show(cols: list, row: tuple) -> str:
    parts = []
    for c, v in zip(cols, row):
        if isinstance(v, bytes):
            v = f"<{len(v)} bytes>"
        elif isinstance(v, str) and len(v) > 60:
            v = v[:57] + "..."
        parts.append(f"{c}={v!r}")
    return ", ".join(parts)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sparseforge.tuner.dbcompare A.db B.db", file=sys.stderr)
        return 2
    diff = differences(*args)
    for line in diff:
        print(line)
    print("same content" if not diff else f"{len(diff)} difference(s)")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
