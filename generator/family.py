"""The Family protocol: everything one kernel family knows, behind one
interface, so that the command line, the tuner, sweeps and benchmarks loop
over the registry (generator/families/__init__.py) and never name a family.

A family is one package, generator/families/<name>/, holding:

- its pattern: parameters and their parsing (`parse_params`, `tag`,
  `spec`), whether a matrix fits and at what cost (`fits`, `analyze`,
  `detect`), pruning to it (`prune`) and random synthesis (`synth`);
- its operation: the dtypes and layouts its kernels take, the dtype it
  computes a matrix in (`dtype_for`);
- its search space as data (a generator/space.py table of choices and
  constraints, from which the templates' static_asserts are generated),
  with `search_space`, `check_config`, `hint_configs`;
- its kernels: `plan` (packing), `render` (to a Kernel: source, packed
  buffer, launch record), `unpack` (the plan read back);
- its benchmark peer, where it has one (`time_peer`).

Adding a family is adding a package and registering an instance there
(ARCHITECTURE.md says how).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .kernel import Kernel, Operation
from .matrix import SparseMatrix
from .space import ConfigError


def accepted_by(check, configs) -> list[dict]:
    """The configurations of `configs` that `check` accepts (raises no
    ConfigError for), each once, in order."""
    out = []
    for cfg in configs:
        try:
            check(cfg)
        except ConfigError:
            continue
        if cfg not in out:
            out.append(cfg)
    return out


class PatternError(ValueError):
    """A pattern string or its parameters that no family accepts."""


# Where a search's N falls: decode (a few tokens: small tiles of N, K split
# over CTAs) or prefill (large tiles).  Between them the two kinds of hint
# take turns.
DECODE_MAX_N = 64
PREFILL_MIN_N = 256


def by_regime(decode: list, prefill: list, n: Optional[int]) -> list:
    """One list of hints from a family's decode tiles and its prefill tiles:
    decode's first for N <= DECODE_MAX_N, prefill's first for N >=
    PREFILL_MIN_N, else (N unknown or between) taking turns, decode's first
    (a budgeted search measures the first few: at budget 4 a prefill search
    measured two decode tiles of no use to it)."""
    if n is not None and n <= DECODE_MAX_N:
        return decode + prefill
    if n is not None and n >= PREFILL_MIN_N:
        return prefill + decode
    out = [c for pair in zip(decode, prefill) for c in pair]
    return out + decode[len(prefill):] + prefill[len(decode):]


def by_tile_n(hints: list, n: Optional[int], decode_max_bn: int = 64) -> list:
    """`hints` (each with a tile of `bn` columns of N) ordered for N: those
    of at most decode_max_bn columns are decode's tiles, the rest
    prefill's (by_regime); N unknown, as given."""
    if n is None:
        return hints
    return by_regime([h for h in hints if h["bn"] <= decode_max_bn],
                     [h for h in hints if h["bn"] > decode_max_bn], n)


@dataclass
class Fit:
    """How a matrix fits one pattern (one parameter choice of a family)."""
    spec: str                 # the pattern, e.g. "bsr:32x32"
    tag: str                  # its tag, e.g. "bsr32x32"
    fits: bool                # stored exactly, at no cost
    cost: float               # the conversion's cost (the family says its unit)
    cost_text: str            # the cost as the report shows it
    detail: str               # one line for `inspect`
    data: dict = field(default_factory=dict)   # the same, for --json


@dataclass
class Pruned:
    """A family's pruning of a dense matrix: the entries kept (in the
    original row order), the row permutation found (or None), and what the
    family reports beside the kept fraction of |W|."""
    mask: np.ndarray
    perm: Optional[np.ndarray] = None
    extra: dict = field(default_factory=dict)


class Family(ABC):
    """One kernel family (see the module docstring)."""
    name: str = ""              # the registry key, the pattern's first word
    syntax: str = ""            # how its pattern is written, e.g. "bsr:RxC"
    summary: str = ""           # one line: what the pattern is
    dtypes: tuple = ()          # element types its kernels take
    layouts: tuple = ("fm",)    # activation layouts its kernels take
    # The order in which `auto_pattern` asks families to detect an exact fit
    # (lower first): the most structured first.  The family with the highest
    # rank should accept every matrix.
    auto_rank: int = 100

    # ---- the pattern ------------------------------------------------------
    # (the defaults are a pattern without parameters, written as the name)
    def parse_params(self, arg: str) -> dict:
        """The parameters written after "name:" ("" when none); raises
        PatternError saying what is expected."""
        if arg:
            raise PatternError(f"{self.name} takes no parameter (got {arg!r})")
        return {}

    def tag(self, params: dict) -> str:
        """Family tag with its parameters, e.g. 'shflbw64', 'bsr32x32'."""
        return self.name

    def spec(self, params: dict) -> str:
        """The pattern string of `params` (parse_params' inverse)."""
        return self.name

    @abstractmethod
    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        """Whether `matrix` has this pattern exactly (with params)."""

    @abstractmethod
    def analyze(self, matrix: SparseMatrix) -> list[Fit]:
        """How the matrix fits each parameter choice `inspect` reports."""

    def detect(self, matrix: SparseMatrix) -> Optional[dict]:
        """The parameters of an exact fit worth tuning as this family, or
        None (auto_pattern asks the families in auto_rank order)."""
        return None

    @abstractmethod
    def prune(self, w: np.ndarray, params: dict, sparsity: float,
              rng: np.random.Generator) -> Pruned:
        """Magnitude pruning of dense float32 `w` to the pattern, keeping
        about (1 - sparsity) of the entries; PatternError where the pattern
        cannot reach `sparsity`."""

    @abstractmethod
    def synth(self, params: dict, m: int, k: int, density: float,
              rng: np.random.Generator) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """A random (mask, perm) of the pattern at `density`."""

    def densities(self, params: dict, asked: list) -> list:
        """The densities a sweep runs this pattern at (a fixed-density
        pattern gives its own)."""
        return list(asked)

    def dtype_for(self, dtype: str) -> str:
        """The dtype this family computes a matrix of `dtype` in."""
        return dtype if dtype in self.dtypes else self.dtypes[0]

    # ---- the search space ---------------------------------------------------
    @abstractmethod
    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """Every valid configuration (constraints checked against `device`,
        a dict of sf_device_info fields, where given)."""

    @abstractmethod
    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation,
                     params: dict, device: Optional[dict] = None) -> None:
        """Raises ConfigError naming the broken constraint."""

    def accepted(self, configs, matrix: SparseMatrix, op: Operation, params: dict,
                 device: Optional[dict] = None) -> list[dict]:
        """The configurations of `configs` that check_config accepts, each
        once, in order."""
        return accepted_by(lambda cfg: self.check_config(cfg, matrix, op, params, device),
                           configs)

    def hint_configs(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None, n: Optional[int] = None) -> list[dict]:
        """Configurations a budgeted search measures first, best expected
        first: the default one unless a family knows more.  `n`, the search's
        columns of N where known, orders decode's and prefill's tiles
        (by_regime)."""
        try:
            return [self.default_config(matrix, op, params, device)]
        except ConfigError:
            return []

    def default_config(self, matrix: SparseMatrix, op: Operation, params: dict,
                       device: Optional[dict] = None) -> dict:
        """The configuration used without tuning: the first of the space."""
        space = self.search_space(matrix, op, params, device)
        if not space:
            raise ConfigError(f"{self.tag(params)}: no valid configuration")
        return space[0]

    def check_op(self, op: Operation) -> None:
        """ConfigError unless the family's kernels take op's dtype and
        layout."""
        if op.dtype not in self.dtypes:
            raise ConfigError(f"dtype: {self.name} computes in {', '.join(self.dtypes)}, "
                              f"not {op.dtype}")
        if op.layout not in self.layouts:
            raise ConfigError(f"layout: {self.name} takes {', '.join(self.layouts)}, "
                              f"not {op.layout}")

    # ---- kernels ------------------------------------------------------------
    @abstractmethod
    def plan(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
             bias: Optional[np.ndarray] = None):
        """The packed buffer and everything the template needs."""

    @abstractmethod
    def render(self, plan, op: Operation, config: dict) -> Kernel:
        """The kernel of a plan: source, packed buffer, launch record."""

    @abstractmethod
    def unpack(self, plan) -> SparseMatrix:
        """The matrix the plan's packed buffer holds."""

    def generate(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
                 bias: Optional[np.ndarray] = None) -> Kernel:
        """Plan and render one kernel for `config`."""
        return self.render(self.plan(matrix, op, params, config, bias=bias), op, config)

    # ---- benchmarks ---------------------------------------------------------
    peer: str = ""   # the library a benchmark compares with besides cuBLAS

    def time_peer(self, ctx, matrix: SparseMatrix, params: dict, op: Operation, n: int,
                  timing: dict) -> dict:
        """The peer's timing on this matrix (a dict with median_ms), timed
        by the protocol of `timing`; ValueError (or the library's error)
        where it cannot run it."""
        raise ValueError(f"{self.name} has no benchmark peer")

    def token_major_as_fast(self, dtype: str) -> bool:
        """Whether this family's token-major kernels in `dtype` are as fast
        as its feature-major ones (built alike, X read a row of 16 bytes
        or more at a time), so that sparseforge.torch's feature-major route
        (X and Y transposed around the feature-major kernel) cannot win and
        sparsify does not tune it.  False, try it, unless the family's
        measurements say so."""
        return False

    def gather_bytes(self, matrix: SparseMatrix, params: dict, n: int,
                     config: dict) -> Optional[float]:
        """Bytes the kernel reads out of L2 (a family with a model of it),
        for the benchmarks' L2 column; None without one."""
        return None
