"""Running one generated kernel on the GPU and checking it: the single path
that tests, the tuner's worker and the benchmarks use.

Every run poisons Y first (all bytes 0xFF: NaN in fp32, fp16 and bf16), so
an element the kernel fails to write shows up as NaN and fails the check.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Optional

import numpy as np

from ..generator.families import get_family
from ..generator.kernel import Kernel, Operation, reference
from ..generator.matrix import SparseMatrix, from_device_bytes, round_to_dtype, to_device_bytes

# Normwise relative error allowed per dtype of X, W and Y (fp32 accumulate).
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}
POISON = 0xFF

_local = threading.local()


def default_context():
    """One native context per thread (created on first use)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        from .. import native
        ctx = native.Context(0)
        _local.ctx = ctx
    return ctx


_binaries: dict[tuple[str, str], object] = {}


def compile_kernel(kernel: Kernel, ctx=None, arch: Optional[str] = None):
    """The kernel's binary for `arch` (default: the context's GPU), compiled
    once per process."""
    ctx = ctx or default_context()
    arch = arch or ctx.device_info()["arch"]
    key = (hashlib.sha256(kernel.source.encode()).hexdigest() + "|".join(kernel.options), arch)
    if key not in _binaries:
        _binaries[key] = ctx.compile(kernel.source, name=kernel.name + ".cu", arch=arch,
                                     options=kernel.options)
    return _binaries[key]


def random_input(op: Operation, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """X (K x N for fm, N x K for tm) as float32 values exact in op.dtype."""
    shape = (k, n) if op.layout == "fm" else (n, k)
    return round_to_dtype(rng.standard_normal(shape, dtype=np.float32), op.dtype)


def run_kernel(kernel: Kernel, op: Operation, x: np.ndarray, n: int, rows: int,
               ctx=None) -> np.ndarray:
    """Y = kernel(X) on the GPU, as float32 (M x N for fm, N x M for tm)."""
    ctx = ctx or default_context()
    binary = compile_kernel(kernel, ctx)
    module = ctx.load(binary)
    fn = module.kernel(kernel.name)
    bufs = []
    try:
        packed = ctx.upload(kernel.packed if kernel.packed else b"\0" * 16)
        bufs.append(packed)
        xb = ctx.upload(to_device_bytes(np.ascontiguousarray(x), op.dtype))
        bufs.append(xb)
        count = rows * n
        yb = ctx.alloc(max(1, count * op.elem_size))
        bufs.append(yb)
        ctx.memset(yb, 0 if kernel.launch["zero_output"] else POISON)
        cfg = kernel.launch_config(n)
        ctx.launch(fn, cfg["grid"], cfg["block"], ctx.kernel_args(fn, packed, xb, yb, n),
                   shared=cfg["shared_bytes"])
        ctx.synchronize()
        y = from_device_bytes(ctx.download(yb, count * op.elem_size), op.dtype, count)
    finally:
        for b in bufs:
            b.free()
    return y.reshape((rows, n) if op.layout == "fm" else (n, rows))


def compare(out: np.ndarray, ref: np.ndarray, dtype: str) -> dict:
    """Normwise and elementwise relative errors; NaN (unwritten) fails."""
    tol = TOLERANCE[dtype]
    out64 = out.astype(np.float64)
    finite = bool(np.all(np.isfinite(out64)))
    diff = np.abs(out64 - ref)
    scale = float(np.linalg.norm(ref))
    norm_err = float(np.linalg.norm(np.nan_to_num(diff, nan=np.inf))) / scale if scale else float(np.nanmax(diff, initial=0.0))
    amax = float(np.max(np.abs(ref), initial=0.0))
    max_err = float(np.max(np.nan_to_num(diff, nan=np.inf), initial=0.0)) / amax if amax else float(np.max(np.nan_to_num(diff, nan=np.inf), initial=0.0))
    ok = finite and norm_err <= tol and max_err <= 10 * tol
    return {"ok": ok, "norm_rel_err": norm_err, "max_rel_err": max_err, "tol": tol,
            "unwritten": int(np.sum(~np.isfinite(out64)))}


def verify(family, matrix: SparseMatrix, op: Operation, params: dict, config: dict, n: int,
           bias: Optional[np.ndarray] = None, seed: int = 0, ctx=None) -> dict:
    """Generates the kernel for `config`, runs it on a fresh X and compares
    with the float64 reference.  `family` is a Family or its name."""
    fam = get_family(family) if isinstance(family, str) else family
    rng = np.random.default_rng(seed)
    if op.epilogue.bias and bias is None:
        bias = rng.standard_normal(matrix.rows).astype(np.float32)
    kernel = fam.generate(matrix, op, params, config, bias=bias)
    x = random_input(op, matrix.cols, n, rng)
    y = run_kernel(kernel, op, x, n, matrix.rows, ctx=ctx)
    ref = reference(matrix, x, op, bias=bias)
    res = compare(y, ref, op.dtype)
    res["kernel"] = kernel.name
    return res
