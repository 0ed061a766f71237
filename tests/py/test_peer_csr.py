"""The cuSPARSE CSR peer (sf_time_csr): the argument checks (before any GPU
call, so they run anywhere), the csr family's peer on a matrix, and
timings on the GPU (tests marked `gpu`)."""
import numpy as np
import pytest

from sparseforge import native
from sparseforge.generator.families import get_family
from sparseforge.generator.kernel import Operation
from sparseforge.generator.synth import random_matrix


@pytest.fixture(scope="module")
def ctx():
    c = native.Context(0)
    yield c
    c.close()


PTR = np.array([0, 2, 2, 3], np.int32)     # 3 x 4: rows of 2, 0 and 1 nonzeros
COL = np.array([0, 3, 1], np.int32)


@pytest.mark.parametrize("change, message", [
    (dict(m=0), "CSR sizes must be in [1, 2^31): m 0, n 16, k 4"),
    (dict(k=0), "m 3, n 16, k 0"),
    (dict(col=np.array([0, 4, 1], np.int32)), "col_ind[1] = 4: column indices must be in "
                                              "[0, K = 4)"),
    (dict(col=np.array([0, -1, 1], np.int32)), "col_ind[1] = -1"),
    (dict(ptr=np.array([0, 2, 1, 3], np.int32)), "row_ptr decreases at row 1 (2 -> 1)"),
    (dict(ptr=np.array([1, 2, 2, 3], np.int32)), "row_ptr must run from 0 to nnz = 3, got 1 .. 3"),
    (dict(alg=5), "alg 5 is not a CSR SpMM algorithm"),
])
def test_library_refuses(ctx, change, message):
    args = dict(dtype="fp16", m=3, k=4, n=16, ptr=PTR, col=COL, alg=-1)
    args.update(change)
    if args["m"] != 3:       # keep row_ptr's length right for the size check
        args["ptr"] = np.zeros(args["m"] + 1, np.int32)
    with pytest.raises(native.InvalidArgumentError) as ei:
        ctx.time_csr(args["dtype"], args["m"], args["k"], args["n"], args["ptr"], args["col"],
                     alg=args["alg"])
    assert ei.value.status == native.SF_ERR_INVALID_ARG
    assert message in ei.value.message


def test_binding_refuses(ctx):
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        ctx.time_csr("int8", 3, 4, 16, PTR, COL)
    with pytest.raises(ValueError, match="unknown layout 'best'; expected fm or tm"):
        ctx.time_csr("fp16", 3, 4, 16, PTR, COL, layout="best")
    with pytest.raises(ValueError, match="row_ptr has 4 entries, expected M \\+ 1 = 6"):
        ctx.time_csr("fp16", 5, 4, 16, PTR, COL)
    with pytest.raises(ValueError, match="col_ind has 2 entries, row_ptr says 3"):
        ctx.time_csr("fp16", 3, 4, 16, PTR, COL[:2])
    with pytest.raises(TypeError, match="row_ptr must hold integers"):
        ctx.time_csr("fp16", 3, 4, 16, PTR.astype(np.float32), COL)


def test_family_names_its_peer():
    fam = get_family("csr")
    assert fam.peer == "cuSPARSE CSR"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,layout", [("fp16", "fm"), ("bf16", "tm"), ("fp32", "fm"),
                                          ("fp16", "tm")])
def test_csr_peer_times_a_pattern(ctx, dtype, layout):
    mat = random_matrix("csr", 1024, 1024, 0.1, dtype, seed=1)
    fam = get_family("csr")
    l2 = ctx.device_info()["l2_bytes"]
    t = fam.time_peer(ctx, mat, {}, Operation(dtype, layout), 64,
                      dict(min_reps=10, min_total_ms=5.0, graph_batch=16, flush_l2=False,
                           rotate_bytes=2 * l2))
    assert 0 < t["min_ms"] <= t["median_ms"] < 10.0
    assert t["alg"] in (0, 4, 6, 12) and t["layout"] == layout and t["reps"] >= 10
    one = ctx.time_csr(dtype, 1024, 1024, 64, mat.indptr, mat.indices, layout=layout,
                       alg=t["alg"], min_reps=10, min_total_ms=5.0)
    assert one["alg"] == t["alg"]
