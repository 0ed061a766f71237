"""The cuSPARSELt 2:4 peer and the short-kernel protocol: argument checks
of sf_time_sparselt (before any GPU call, so they run anywhere), the
driver's rotation rule, and timings on the GPU (tests marked `gpu`; the
cuSPARSELt one skips, saying so, where the library is not installed)."""
import pytest

from sparseforge import native
from sparseforge.tuner.driver import SHORT_GRAPH, SHORT_N, timing_for


@pytest.fixture(scope="module")
def ctx():
    c = native.Context(0)
    yield c
    c.close()


@pytest.mark.parametrize("args, message", [
    (dict(m=48, k=64, n=40), "cuSPARSELt sizes must be multiples of 16 in [16, 2^31): "
                             "m 48, n 40, k 64"),
    (dict(m=8, k=64, n=32), "m 8, n 32, k 64"),
    (dict(m=32, k=4, n=32), "m 32, n 32, k 4"),
])
def test_library_refuses_sizes(ctx, args, message):
    with pytest.raises(native.InvalidArgumentError) as ei:
        ctx.time_sparselt("fp16", **args)
    assert ei.value.status == native.SF_ERR_INVALID_ARG
    assert message in ei.value.message


def test_binding_refuses(ctx):
    with pytest.raises(ValueError, match="cuSPARSELt's 2:4 peer takes fp16 or bf16"):
        ctx.time_sparselt("fp32", 64, 64, 64)
    with pytest.raises(ValueError, match="unknown layout 'best'; expected fm or tm"):
        ctx.time_sparselt("fp16", 64, 64, 64, layout="best")
    with pytest.raises(ValueError, match="rotate_bytes must not be negative, got -1"):
        ctx.time_gemm("fp16", 64, 64, 64, rotate_bytes=-1)


def test_short_kernels_rotate_through_twice_l2():
    device = {"l2_bytes": 50 << 20}
    base = {"warmup": 3, "min_reps": 30, "flush_l2": True}
    short = timing_for(base, SHORT_N, device)
    assert short == {**base, "rotate_bytes": 100 << 20, "graph_batch": SHORT_GRAPH,
                     "flush_l2": False}
    assert timing_for(base, SHORT_N + 1, device) == base
    assert timing_for(base, 16, None) == base            # no GPU: nothing is timed
    assert timing_for({**base, "rotate_bytes": 0}, 16, device) == {**base, "rotate_bytes": 0}
    assert timing_for({**base, "graph_batch": 64}, 16, device)["graph_batch"] == 64


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_sparselt_times_a_2to4_matmul(ctx, layout):
    try:
        t = ctx.time_sparselt("fp16", 1024, 1024, 256, layout=layout, min_reps=10,
                              min_total_ms=5.0)
    except native.NotFoundError as e:
        pytest.skip(str(e))
    assert 0 < t["min_ms"] <= t["median_ms"] < 10.0
    assert t["layout"] == layout and t["reps"] >= 10


@pytest.mark.gpu
def test_rotating_gemm_is_not_faster_than_cached(ctx):
    """cuBLAS at a short N with its operands rotating through twice L2
    reads W from device memory every launch; cached in L2 it cannot be
    slower (within noise)."""
    l2 = ctx.device_info()["l2_bytes"]
    common = dict(layout="tm", min_reps=20, min_total_ms=5.0, graph_batch=16, flush_l2=False)
    cold = ctx.time_gemm("fp16", 4096, 16, 4096, rotate_bytes=2 * l2, **common)
    warm = ctx.time_gemm("fp16", 4096, 16, 4096, **common)
    assert cold["median_ms"] > 0.9 * warm["median_ms"]
    # 32 MB of weights at most at ~5 TB/s: not faster than the bytes allow
    assert cold["median_ms"] > 4096 * 4096 * 2 / 5e12 * 1e3
