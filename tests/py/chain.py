"""Three launches of one square kernel back to back on one stream, with no
synchronization between them: Y1 = W X, Y2 = W Y1, then X = W Y2 (the
third overwrites the first one's input).  A kernel launched as a
programmatic dependent (SF_DECLARE_PDL) that read its X before the kernel
writing it had finished, or wrote its Y while the one before still read
it, gives wrong values: the outputs start poisoned, and each is checked
against W times the input it should have read (scaled by the epilogue
so that the values stay within fp16's range)."""
from __future__ import annotations

import numpy as np

from sparseforge.generator.kernel import Epilogue, Operation, reference
from sparseforge.generator.matrix import from_device_bytes, round_to_dtype, to_device_bytes


def check_dependent_chain(fam, matrix, params: dict, config: dict, n: int, layout: str = "tm"):
    from sparseforge.tuner.execute import POISON, compile_kernel, default_context
    size = matrix.rows
    assert matrix.cols == size, "a chain needs a square W"
    # the epilogue's scale keeps each output about the size of its input
    # (three products of W would otherwise overflow fp16)
    rms = float(np.sqrt(np.mean(np.square(matrix.values.astype(np.float64))))) if matrix.nnz else 1.0
    scale = float(np.float32(1.0 / max(1e-6, rms * np.sqrt(max(1.0, matrix.nnz / size)))))
    op = Operation(dtype="fp16", layout=layout, epilogue=Epilogue(scale=scale))
    k = fam.generate(matrix, op, params, config)
    assert "SF_DECLARE_PDL();" in k.source
    assert not k.launch["zero_output"], "a chain of kernels that accumulate into Y is not checked here"
    ctx = default_context()
    fn = ctx.load(compile_kernel(k, ctx)).kernel(k.name)
    x0 = np.random.default_rng(5).standard_normal((n, size) if layout == "tm" else (size, n))
    x0 = x0.astype(np.float32)
    nbytes = n * size * 2
    packed = ctx.upload(k.packed)
    bx = ctx.upload(to_device_bytes(x0, "fp16"))
    b1, b2 = ctx.alloc(nbytes), ctx.alloc(nbytes)
    try:
        ctx.memset(b1, POISON)
        ctx.memset(b2, POISON)
        ctx.synchronize()
        cfg = k.launch_config(n)
        for src, dst in ((bx, b1), (b1, b2), (b2, bx)):
            ctx.launch(fn, cfg["grid"], cfg["block"], ctx.kernel_args(fn, packed, src, dst, n),
                       shared=cfg["shared_bytes"])
        ctx.synchronize()
        ys = [from_device_bytes(ctx.download(b, nbytes), "fp16", n * size).reshape(x0.shape)
              for b in (b1, b2, bx)]
    finally:
        for b in (packed, bx, b1, b2):
            b.free()
    inputs = [round_to_dtype(x0, "fp16")] + ys[:2]
    for i, (xin, y) in enumerate(zip(inputs, ys)):
        ref = reference(matrix, xin, op)
        err = np.abs(y - ref).max() / max(1e-6, np.abs(ref).max())
        assert np.isfinite(y).all() and err < 5e-3, (config, i, err)
