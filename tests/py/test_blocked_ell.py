"""The cuSPARSE Blocked-ELL peer: the bsr -> Blocked-ELL index conversion,
the argument checks of sf_time_blocked_ell (before any GPU call, so they run
anywhere), and a timing on the GPU (tests marked `gpu`)."""
import ctypes
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sparseforge import native
from sparseforge.generator.families.bsr import blocked_ell_columns
from sparseforge.generator.matrix import SparseMatrix
from sparseforge.generator.synth import random_matrix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ctx():
    c = native.Context(0)
    yield c
    c.close()


def _block_matrix(blocks, shape, block):
    """A SparseMatrix whose nonzeros are one entry in each listed block
    (block-row, block-column), placed off the block's corner."""
    dense = np.zeros(shape, dtype=np.float32)
    for i, (br, bc) in enumerate(blocks):
        dense[br * block + (i % block), bc * block + block - 1 - (i % block)] = 1.0 + i
    return SparseMatrix.from_dense(dense, "fp16")


# ---- the conversion -----------------------------------------------------------
def test_blocked_ell_columns_by_hand():
    # 16 x 12, blocks of 4: 4 block-rows of 3, 3, 0 and 1 blocks
    blocks = [(0, 2), (0, 0), (1, 1), (1, 0), (1, 2), (0, 1), (3, 1)]
    m = _block_matrix(blocks, (16, 12), 4)
    cols = blocked_ell_columns(m, 4)
    assert cols.dtype == np.int32
    np.testing.assert_array_equal(cols, [[0, 1, 2],
                                         [0, 1, 2],
                                         [-1, -1, -1],
                                         [1, -1, -1]])
    # two block-rows of different widths, padded to the wider
    m = _block_matrix([(0, 2), (1, 0), (1, 2)], (8, 12), 4)
    np.testing.assert_array_equal(blocked_ell_columns(m, 4), [[2, -1], [0, 2]])


def test_blocked_ell_columns_of_a_bsr_pattern():
    mat = random_matrix("bsr:32x32", 256, 384, 0.3, "fp16", seed=4)
    cols = blocked_ell_columns(mat, 32)
    held = mat.to_dense().reshape(8, 32, 12, 32).any(axis=(1, 3))  # block mask
    assert cols.shape == (8, held.sum(axis=1).max())
    for i in range(8):
        row = cols[i][cols[i] >= 0]
        np.testing.assert_array_equal(row, np.flatnonzero(held[i]))
        assert np.all(cols[i][row.size:] == -1)


def test_blocked_ell_columns_edges():
    empty = SparseMatrix((8, 8), np.zeros(9), np.zeros(0), np.zeros(0), "fp16")
    np.testing.assert_array_equal(blocked_ell_columns(empty, 4), [[-1], [-1]])
    m = _block_matrix([(0, 0)], (8, 12), 4)
    for block in (3, 5, 0):
        with pytest.raises(ValueError, match=rf"the block size \({block}\) must divide "
                                             r"M \(8\) and K \(12\)"):
            blocked_ell_columns(m, block)


# ---- argument checks (no GPU needed: they come before any GPU call) -----------
GOOD = dict(dtype="fp16", m=8, k=12, n=16, block=4)
GOOD_COLS = np.array([[0, 2], [1, -1]], dtype=np.int32)


@pytest.mark.parametrize("change,cols,message", [
    (dict(m=10), GOOD_COLS, "the block size (4) must divide M (10) and K (12)"),
    (dict(k=10), GOOD_COLS, "the block size (4) must divide M (8) and K (10)"),
    (dict(block=0), GOOD_COLS, "the block size (0) must divide M (8) and K (12)"),
    (dict(n=0), GOOD_COLS, "blocked-ELL sizes must be in [1, 2^31): m 8, n 0, k 12"),
    (dict(m=1 << 31, block=3), GOOD_COLS,
     "blocked-ELL sizes must be in [1, 2^31): m 2147483648, n 16, k 12"),
    ({}, np.zeros((2, 4), np.int32),
     "ell_cols (16) must be a multiple of the block size (4) in [4, K = 12]"),
    ({}, np.array([[0, 3], [1, -1]]),
     "col_ind[0][1] = 3: block-column indices must be in [0, K / block = 3) or -1"),
    ({}, np.array([[0, 2], [-2, -1]]),
     "col_ind[1][0] = -2: block-column indices must be in [0, K / block = 3) or -1"),
])
def test_library_refuses(ctx, change, cols, message):
    args = {**GOOD, **change}
    with pytest.raises(native.InvalidArgumentError) as ei:
        ctx.time_blocked_ell(block_cols_index=cols, **args)
    assert ei.value.status == native.SF_ERR_INVALID_ARG
    assert ei.value.message == message


def test_binding_refuses(ctx):
    with pytest.raises(ValueError, match=r"unknown dtype 'fp32'; Blocked-ELL SpMM takes fp16 or bf16"):
        ctx.time_blocked_ell(**{**GOOD, "dtype": "fp32"}, block_cols_index=GOOD_COLS)
    with pytest.raises(ValueError, match="unknown layout 'best'; expected fm or tm"):
        ctx.time_blocked_ell(**GOOD, block_cols_index=GOOD_COLS, layout="best")
    with pytest.raises(ValueError, match=r"block_cols_index has 3 rows; M / block = 8 / 4 = 2"):
        ctx.time_blocked_ell(**GOOD, block_cols_index=np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError, match=r"must be a 2-D array with at least one column, "
                                         r"got shape \(4,\)"):
        ctx.time_blocked_ell(**GOOD, block_cols_index=np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"got shape \(2, 0\)"):
        ctx.time_blocked_ell(**GOOD, block_cols_index=np.zeros((2, 0), np.int32))
    with pytest.raises(TypeError, match="block_cols_index must hold integers, not float64"):
        ctx.time_blocked_ell(**GOOD, block_cols_index=GOOD_COLS.astype(float))
    with pytest.raises(ValueError, match="block_cols_index holds values outside int32"):
        ctx.time_blocked_ell(**GOOD, block_cols_index=GOOD_COLS.astype(np.int64) << 32)
    with pytest.raises(TypeError, match="block must be an int"):
        ctx.time_blocked_ell(**{**GOOD, "block": 4.0}, block_cols_index=GOOD_COLS)


def test_raw_descriptor_checks(ctx):
    """What only a C caller can get wrong: NULL pointers, a dtype outside
    fp16/bf16, an unknown layout."""
    lib = native._clib()
    h = ctx._live_handle()
    t = native.sf_timing()
    cols = np.ascontiguousarray(GOOD_COLS)

    def desc(**kw):
        fields = dict(dtype=1, m=8, n=16, k=12, block=4, ell_cols=8,
                      col_ind=cols.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), layout=0)
        fields.update(kw)
        return native.sf_blocked_ell_desc(**fields)

    cases = [(None, ctypes.byref(t), "desc or out is NULL"),
             (ctypes.byref(desc()), None, "desc or out is NULL"),
             (ctypes.byref(desc(dtype=0)), ctypes.byref(t),
              "blocked-ELL SpMM takes fp16 or bf16 values, not dtype 0"),
             (ctypes.byref(desc(layout=-1)), ctypes.byref(t),
              "unknown layout -1 (0 feature-major, 1 token-major)"),
             (ctypes.byref(desc(col_ind=None)), ctypes.byref(t), "col_ind is NULL")]
    for d, out, message in cases:
        assert lib.sf_time_blocked_ell(h, d, None, out) == native.SF_ERR_INVALID_ARG
        assert lib.sf_errmsg(h).decode() == message
    assert lib.sf_time_blocked_ell(None, ctypes.byref(desc()), None,
                                   ctypes.byref(t)) == native.SF_ERR_INVALID_ARG


_NO_DRIVER_SCRIPT = r"""
import json
import numpy as np
from sparseforge import native
ctx = native.Context(0)
try:
    ctx.time_blocked_ell("fp16", 8, 12, 16, 4, np.array([[0, 2], [1, -1]]))
    print(json.dumps(None))
except native.SFError as e:
    print(json.dumps([type(e).__name__, e.message]))
"""


def test_valid_arguments_reach_the_driver():
    """A descriptor that passes every check goes on to the GPU: without a
    driver that is NoDriverError, on any machine."""
    env = dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _NO_DRIVER_SCRIPT], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    name, message = json.loads(r.stdout.strip().splitlines()[-1])
    assert name == "NoDriverError"
    assert message.startswith("no CUDA driver found: /nonexistent/libcuda.so.1")


# ---- bench/s1.py's table --------------------------------------------------------
def _load_s1():
    spec = importlib.util.spec_from_file_location("s1_bench", ROOT / "bench" / "s1.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_s1_table_has_the_ell_columns():
    s1 = _load_s1()
    base = dict(m=256, k=256, n=512, ms=1.0, cublas=2.0, speedup=2.0, roof=0.5, l2=0.5, err=1e-4,
                trials=4, failed=0, config={"bn": 128}, bf16=1.0, epi=1.1)
    rows = [dict(base, pattern="bsr:32x32", density=0.1, ell=4.0, vs_ell=4.0),
            dict(base, pattern="bsr:32x32", density=0.1, ell=9.0, vs_ell=9.0),
            dict(base, pattern="shflbw:64", density=0.1, ell=math.nan, vs_ell=math.nan)]
    args = SimpleNamespace(dtype="fp16", strategy="greedy", budget="4", label="", layout="fm")
    table = s1.format_table(rows, {"name": "GPU"}, 1e12, 1e15, args, 1e12).splitlines()
    head = next(line for line in table if line.startswith("| family | density | M x K x N"))
    assert "| speedup | cuSPARSE ELL ms | vs ELL |" in head
    assert "| 2.00x | 4.0000 | 4.00x |" in table[table.index(head) + 2]
    assert "| 2.00x | - | - |" in table[table.index(head) + 4]
    assert "| bsr:32x32 | 0.1 | 2.00x | 6.00x | 1.00 | +10.0% |" in table
    assert "| shflbw:64 | 0.1 | 2.00x | - | 1.00 | +10.0% |" in table


# ---- GPU ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_time_blocked_ell(ctx, layout):
    mat = random_matrix("bsr:32x32", 512, 768, 0.25, "fp16", seed=0)
    cols = blocked_ell_columns(mat, 32)
    dtypes = ["fp16"] + (["bf16"] if ctx.device_info()["cc_major"] >= 8 else [])
    for dtype in dtypes:
        t = ctx.time_blocked_ell(dtype, 512, 768, 256, 32, cols, layout=layout, min_reps=5,
                                 max_reps=20, min_total_ms=1.0)
        assert set(t) == {"median_ms", "p20_ms", "p80_ms", "min_ms", "mean_ms", "reps", "layout"}
        assert t["layout"] == layout and 5 <= t["reps"] <= 20
        assert 0 < t["min_ms"] <= t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]
    g = ctx.time_blocked_ell("fp16", 512, 768, 256, 32, cols, layout=layout, min_reps=3,
                             max_reps=6, min_total_ms=0, graph_batch=4, flush_l2=False)
    assert g["min_ms"] > 0


@pytest.mark.gpu
def test_time_blocked_ell_empty_slots(ctx):
    """Block-rows with no blocks at all (a column of -1 only) time too."""
    cols = np.full((8, 2), -1, dtype=np.int32)
    cols[0] = [0, 5]
    t = ctx.time_blocked_ell("fp16", 512, 384, 128, 64, cols, min_reps=3, max_reps=6,
                             min_total_ms=0)
    assert t["median_ms"] > 0
