"""What every kernel family gives the tuner, and the pieces they share:
the operation (dtype, layout, epilogue), the generated kernel, rendering of
Jinja2 templates into one self-contained source, and the reference.

A family module (generator/families/<name>.py) defines one `Family`
subclass and registers it.  Its kernels all take the same four parameters:

    extern "C" __global__ void NAME(const unsigned char* packed,
                                    const void* X, void* Y, int N)

`packed` is one device buffer (weights, index tables, bias) built once by
the family's `plan`.  Layouts: "fm" (feature-major: X is K x N, Y is M x N,
row-major) and "tm" (token-major: X is N x K, Y is N x M, row-major).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .matrix import SparseMatrix, round_to_dtype

# In a checkout generator/ and templates/ are siblings; installed, they are
# sparseforge/generator and sparseforge/templates: siblings too.
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
INCLUDE_DIR = TEMPLATE_DIR / "include"

ACTIVATIONS = ("none", "relu", "gelu")
LAYOUTS = ("fm", "tm")


@dataclass(frozen=True)
class Epilogue:
    """y = activation(scale * acc + bias); rows land in original order."""
    bias: bool = False
    activation: str = "none"
    scale: float = 1.0

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; expected one of {ACTIVATIONS}")

    @property
    def tag(self) -> str:
        parts = []
        if self.scale != 1.0:
            parts.append(f"s{self.scale:g}")
        if self.bias:
            parts.append("bias")
        if self.activation != "none":
            parts.append(self.activation)
        return "_".join(parts) or "plain"


@dataclass(frozen=True)
class Operation:
    """Everything about Y = epilogue(W X) except W and N."""
    dtype: str = "fp16"         # of W, X and Y; accumulation is fp32
    layout: str = "fm"
    epilogue: Epilogue = Epilogue()

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; expected one of {LAYOUTS}")

    def tag(self, family_tag: str) -> str:
        """The op string recorded in the cache, e.g. 'shflbw64.fp16.fm.bias_gelu'."""
        return f"{family_tag}.{self.dtype}.{self.layout}.{self.epilogue.tag}"

    @property
    def elem_size(self) -> int:
        return 4 if self.dtype == "fp32" else 2


GRID_LIMITS = (2**31 - 1, 65535, 65535)  # blocks along x, y, z


@dataclass
class Kernel:
    """A generated kernel ready to compile and launch."""
    name: str                  # derived from the configuration
    source: str                # self-contained CUDA C++ (no project includes)
    packed: bytes              # the device buffer its first parameter points to
    block: tuple[int, int, int]
    grid: tuple[int, int, int]  # for N = n_tile (one tile of N)
    n_axis: int                # grid axis multiplied by ceil(N / n_tile); -1 none
    n_tile: int
    shared_bytes: int = 0
    zero_output: bool = False  # Y must be zeroed before each launch
    options: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)

    def grid_for(self, n: int) -> tuple[int, int, int]:
        """The launch grid for N columns; ValueError past CUDA's limits."""
        g = list(self.grid)
        if self.n_axis >= 0:
            g[self.n_axis] *= max(1, math.ceil(n / self.n_tile))
        for axis, (blocks, limit) in enumerate(zip(g, GRID_LIMITS)):
            if blocks > limit:
                raise ValueError(f"{self.name}: N = {n} needs {blocks} blocks along grid axis "
                                 f"{axis}, past CUDA's {limit}")
        return tuple(g)


class ConfigError(ValueError):
    """A configuration that breaks a family's constraints."""


def smem_limit(device: Optional[dict]) -> int:
    """Largest dynamic shared memory per block: the device's opt-in limit
    when given, else by compute capability (227 KB on sm_90, 163 KB on
    sm_80, 99 KB on other sm_8x); with no device, sm_90's."""
    if device:
        if device.get("smem_per_block_optin"):
            return int(device["smem_per_block_optin"])
        major = int(device.get("cc_major", 9))
        minor = int(device.get("cc_minor", 0))
        if major == 8:
            return 163 * 1024 if minor == 0 else 99 * 1024
        if major < 8:
            return 48 * 1024
    return 227 * 1024


class Family:
    """One kernel family.  Subclasses set `name` and implement the methods."""
    name: str = ""
    dtypes: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ("fm",)

    def tag(self, params: dict) -> str:
        """Family tag with its pattern parameters, e.g. 'shflbw64', 'bsr32x32'."""
        return self.name

    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        """Whether `matrix` has this family's pattern exactly (with params)."""
        raise NotImplementedError

    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """Every valid configuration (constraints checked against `device`,
        a dict of sf_device_info fields, where given)."""
        raise NotImplementedError

    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation,
                     params: dict, device: Optional[dict] = None) -> None:
        """Raises ConfigError naming the broken constraint."""
        raise NotImplementedError

    def default_config(self, matrix: SparseMatrix, op: Operation, params: dict,
                       device: Optional[dict] = None) -> dict:
        """The configuration used without tuning: the first of the space
        unless a family knows better."""
        space = self.search_space(matrix, op, params, device)
        if not space:
            raise ConfigError(f"{self.tag(params)}: no valid configuration")
        return space[0]

    def hint_configs(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """Configurations a budgeted search should measure first, best
        expected first: the default one unless a family knows more."""
        try:
            return [self.default_config(matrix, op, params, device)]
        except ConfigError:
            return []

    def generate(self, matrix: SparseMatrix, op: Operation, params: dict,
                 config: dict, bias: Optional[np.ndarray] = None) -> Kernel:
        """Plan (pack) and render one kernel for `config`."""
        raise NotImplementedError


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    _FAMILIES[family.name] = family
    return family


def families() -> dict[str, Family]:
    from . import families as _f  # noqa: F401  (registers every family)
    return dict(_FAMILIES)


def get_family(name: str) -> Family:
    fam = families()
    if name not in fam:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(sorted(fam))}")
    return fam[name]


def parse_pattern(spec: str) -> tuple[str, dict]:
    """'csr', 'bsr:32x32', 'bsr:32', 'shflbw:64', 'nm24' -> (family, params)."""
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    if name == "bsr":
        if not arg:
            raise ValueError("bsr needs a block size, e.g. bsr:32x32")
        br, _, bc = arg.lower().partition("x")
        return name, {"br": int(br), "bc": int(bc or br)}
    if name == "shflbw":
        if not arg:
            raise ValueError("shflbw needs a group size V, e.g. shflbw:64")
        return name, {"v": int(arg)}
    if name in ("csr", "nm24"):
        if arg:
            raise ValueError(f"{name} takes no parameter (got {arg!r})")
        return name, {}
    raise ValueError(f"unknown pattern {spec!r}; expected csr, bsr:RxC, shflbw:V or nm24")


def config_name(family_tag: str, config: dict, op: Operation) -> str:
    """A kernel name that is its configuration, e.g.
    'sf_shflbw64_fp16_fm_bias_gelu_bm64_bn128_w4_s3'."""
    parts = [f"{k}{v}" for k, v in sorted(config.items())]
    raw = "_".join(["sf", family_tag, op.dtype, op.layout, op.epilogue.tag] + parts)
    return re.sub(r"[^A-Za-z0-9_]", "_", raw)


def canonical_config(config: dict) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


# ---- rendering -------------------------------------------------------------

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"(sf/[^"]+)"\s*$', re.M)


def amalgamate(source: str, include_dir: Path = INCLUDE_DIR) -> str:
    """Replaces each `#include "sf/..."` by the header's text (once per
    header), so that the source compiles alone and its hash covers all the
    device code it uses."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def repl(m: re.Match) -> str:
            rel = m.group(1)
            if rel in seen:
                return f"/* {rel} (already included) */"
            seen.add(rel)
            path = include_dir / rel
            if not path.exists():
                raise FileNotFoundError(f"template include {rel} not found under {include_dir}")
            body = expand(path.read_text())
            return f"/* ---- begin {rel} ---- */\n{body}\n/* ---- end {rel} ---- */"
        return _INCLUDE_RE.sub(repl, text)

    return expand(source)


_env = None


def render(template: str, **values: Any) -> str:
    """Renders templates/<template> with `values` and amalgamates it."""
    global _env
    if _env is None:
        import jinja2
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                                  undefined=jinja2.StrictUndefined, trim_blocks=True,
                                  lstrip_blocks=True, keep_trailing_newline=True)
    header = ("// Generated by sparseforge; do not edit.  Regenerate with "
              "`sparseforge generate`.\n")
    return header + amalgamate(_env.get_template(template).render(**values))


# ---- reference ---------------------------------------------------------------

def gelu(x: np.ndarray) -> np.ndarray:
    """tanh approximation, as the kernels compute it."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def reference(matrix: SparseMatrix, x: np.ndarray, op: Operation,
              bias: Optional[np.ndarray] = None,
              columns: Optional[np.ndarray] = None) -> np.ndarray:
    """Y in float64 from W (rounded to its dtype) and X as given.
    `x` is K x N for "fm" and N x K for "tm"; the result has the same
    orientation (M x N or N x M).  `columns` (indices into N) restricts the
    result to those columns of Y, for spot checks of large problems."""
    xf = np.asarray(x)
    xk = xf if op.layout == "fm" else xf.T            # K x N
    if columns is not None:
        xk = xk[:, columns]
    xk = xk.astype(np.float64)
    m = matrix.rows
    y = np.empty((m, xk.shape[1]), dtype=np.float64)
    w = round_to_dtype(matrix.values, matrix.dtype).astype(np.float64)
    step = max(1, (1 << 24) // max(1, matrix.cols))    # rows per dense chunk
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        lo, hi = matrix.indptr[r0], matrix.indptr[r1]
        dense = np.zeros((r1 - r0, matrix.cols), dtype=np.float64)
        dense[matrix.row_ids()[lo:hi] - r0, matrix.indices[lo:hi]] = w[lo:hi]
        y[r0:r1] = dense @ xk
    ep = op.epilogue
    y *= ep.scale
    if ep.bias:
        if bias is None:
            raise ValueError("epilogue has a bias but none was given")
        y += np.asarray(bias, dtype=np.float64)[:, None]
    if ep.activation == "relu":
        y = np.maximum(y, 0.0)
    elif ep.activation == "gelu":
        y = gelu(y)
    return y if op.layout == "fm" else y.T
