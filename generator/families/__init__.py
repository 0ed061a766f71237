"""The registry of kernel families: one package per family
(generator/families/<name>/), each registering one Family instance when
imported.  Everything outside the packages reaches a family through the
functions here; none of it names one.

    fam, params = parse_pattern("bsr:32x32")
    for fam in families().values(): ...
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Optional

from ..family import Family, PatternError
from ..matrix import SparseMatrix

_FAMILIES: dict[str, Family] = {}
_loaded = False


def register(family: Family) -> Family:
    """Adds a family (its package calls this when imported)."""
    if not family.name or not family.name.isidentifier():
        raise ValueError(f"a family needs an identifier for a name, got {family.name!r}")
    if family.name in _FAMILIES and type(_FAMILIES[family.name]) is not type(family):
        raise ValueError(f"two families named {family.name!r}")
    _FAMILIES[family.name] = family
    return family


def _load() -> None:
    """Imports every package under generator/families/ (each registers its
    family; a package that registers none, like the shared row-group
    engine, is just imported)."""
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def families() -> dict[str, Family]:
    """name -> Family, in the order auto-detection asks them."""
    _load()
    return dict(sorted(_FAMILIES.items(), key=lambda kv: (kv[1].auto_rank, kv[0])))


def get_family(name: str) -> Family:
    fam = families()
    if name not in fam:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(sorted(fam))}")
    return fam[name]


def pattern_syntax() -> str:
    """Every family's pattern syntax, e.g. 'bsr:RxC | csr | nm24 | shflbw:V'."""
    return " | ".join(f.syntax for f in sorted(families().values(), key=lambda f: f.name))


def parse_pattern(spec: str) -> tuple[str, dict]:
    """'bsr:32x32' -> ('bsr', {'br': 32, 'bc': 32}); PatternError (a
    ValueError) naming what is expected."""
    if not isinstance(spec, str):
        raise PatternError(f"a pattern is a string such as {pattern_syntax()}, "
                           f"not {type(spec).__name__}")
    name, _, arg = spec.strip().partition(":")
    name = name.strip().lower()
    fam = families().get(name)
    if fam is None:
        raise PatternError(f"unknown pattern {spec!r}; expected one of: {pattern_syntax()}")
    try:
        return name, fam.parse_params(arg.strip())
    except PatternError as e:
        raise PatternError(f"pattern {spec!r}: {e}") from None


def auto_pattern(matrix: SparseMatrix) -> str:
    """The pattern of the first family (in auto_rank order, the most
    structured first) that detects an exact fit."""
    for fam in families().values():
        params = fam.detect(matrix)
        if params is not None:
            return fam.spec(params)
    raise PatternError("no family accepts this matrix")


def family_of(spec: str) -> tuple[Family, dict]:
    """(Family, params) of a pattern string."""
    name, params = parse_pattern(spec)
    return get_family(name), params


def find(name: str) -> Optional[Family]:
    """The family `name`, or None."""
    return families().get(name)


def parse_int(text: str, what: str, lo: int, hi: int) -> int:
    """A pattern parameter: a decimal integer in [lo, hi]; PatternError
    naming it otherwise (the families' shared reader)."""
    t = text.strip()
    if not t.isdigit():
        raise PatternError(f"{what} must be a whole number from {lo} to {hi}, got {text!r}")
    v = int(t)
    if not lo <= v <= hi:
        raise PatternError(f"{what} must be from {lo} to {hi}, got {v}")
    return v
