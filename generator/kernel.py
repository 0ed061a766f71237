"""The vocabulary every kernel family shares: the operation (dtype, layout,
epilogue), the generated kernel and its launch record, rendering of Jinja2
templates into one self-contained source, and the float64 reference.

Every generated kernel takes the same four parameters:

    extern "C" __global__ void NAME(const unsigned char* packed,
                                    const void* X, void* Y, int N)

`packed` is one device buffer (weights, index tables, bias) built once by
the family's `plan`.  Layouts: "fm" (feature-major: X is K x N, Y is M x N,
row-major) and "tm" (token-major: X is N x K, Y is N x M, row-major).  The
Family protocol is generator/family.py, the registry
generator/families/__init__.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import _abi
from .matrix import SparseMatrix, round_to_dtype
from .space import ConfigError  # noqa: F401  (raised by every family; defined with the tables)

# In a checkout generator/ and templates/ are siblings; installed, they are
# sparseforge/generator and sparseforge/templates: siblings too.
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
INCLUDE_DIR = TEMPLATE_DIR / "include"

# the activation words, by code (the header's SF_ACTIVATION_TABLE)
ACTIVATIONS = tuple(word for _, _, word in sorted(_abi.ACTIVATIONS, key=lambda a: a[1]))
ACT_CODES = {word: code for _, code, word in _abi.ACTIVATIONS}
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

    @property
    def act_code(self) -> int:
        """The epilogue's activation as the kernels' code."""
        return ACT_CODES[self.epilogue.activation]


@dataclass
class Kernel:
    """A generated kernel ready to compile and launch."""
    name: str                  # derived from the configuration
    source: str                # self-contained CUDA C++ (no project includes)
    packed: bytes              # the device buffer its first parameter points to
    launch: dict               # the launch record (runtime/sparseforge_runtime.h,
                               # SF_LAUNCH_RECORD_FIELDS): grid for one tile of N,
                               # n_axis, n_tile, block, shared_bytes, zero_output
    options: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)

    def launch_config(self, n: int) -> dict:
        """grid, block and shared_bytes for N columns, by the C library's
        one grid rule (ValueError past CUDA's limits)."""
        from ..native import launch_config
        return launch_config(self.launch, n)


def make_launch(grid, block, n_axis: int = -1, n_tile: int = 0, shared_bytes: int = 0,
                zero_output: bool = False) -> dict:
    """A launch record (the header's SF_LAUNCH_RECORD_FIELDS) from its
    values; grid and block pad to three dimensions with 1."""
    return {"grid": tuple(grid) + (1,) * (3 - len(grid)),
            "block": tuple(block) + (1,) * (3 - len(block)),
            "n_axis": n_axis, "n_tile": n_tile, "shared_bytes": shared_bytes,
            "zero_output": int(bool(zero_output))}


H100_SMS = 132   # multiprocessors where the device does not say


def sm_count(device: Optional[dict]) -> int:
    """The device's multiprocessors; with none given (or none said), an
    H100's."""
    return int((device or {}).get("sm_count") or H100_SMS)


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
