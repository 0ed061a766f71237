"""Tests of the ctypes binding (sparseforge.native).

CPU tests need only the built library (NVRTC compiles with no GPU); tests
marked `gpu` skip with the reason gpu_available() gives.  The library is
found as sparseforge._lib says ($SPARSEFORGE_LIB, else build/...).
"""
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseforge import native

ROOT = Path(__file__).resolve().parents[2]

HALF_KERNEL = r"""
#include <cuda_fp16.h>
extern "C" __global__ void axpb(const float *x, float *y, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __half2float(__float2half(a * x[i] + b));
}
"""


@pytest.fixture(scope="module")
def ctx():
    c = native.Context(0)
    yield c
    c.close()


# ---- CPU: compiling ---------------------------------------------------------
def test_nvrtc_version():
    major, minor = native.nvrtc_version()
    assert major >= 11 and minor >= 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compile_cubin(ctx, arch):
    b = ctx.compile(HALF_KERNEL, name="half.cu", arch=arch)
    assert isinstance(b, native.Binary)
    assert b.data[:4] == b"\x7fELF"
    assert b.ptx is False
    assert isinstance(b.log, str)


def test_compile_ptx(ctx):
    b = ctx.compile(HALF_KERNEL, arch="sm_90a", ptx=True)
    assert b.ptx is True
    assert b.data.endswith(b"\0")
    assert ".target sm_90a" in b.text
    assert ".entry axpb" in b.text


def test_compile_error_carries_log(ctx):
    bad = 'extern "C" __global__ void broken(float *y) {\n  y[0] = 1.0f\n}\n'
    with pytest.raises(native.CompileError) as ei:
        ctx.compile(bad, name="broken.cu", arch="sm_80")
    e = ei.value
    assert e.status == native.SF_ERR_COMPILE
    assert e.name == "SF_ERR_COMPILE"
    assert 'broken.cu(3): error: expected a ";"' in e.log
    assert '1 error detected in the compilation of "broken.cu".' in e.log
    assert e.message.startswith("NVRTC could not compile broken.cu for sm_80:\n")
    assert e.log in e.message


def test_missing_header_is_named(ctx):
    src = '#include "sf_absent_header.cuh"\nextern "C" __global__ void k() {}\n'
    with pytest.raises(native.CompileError) as ei:
        ctx.compile(src, name="needs.cu", arch="sm_90a")
    assert 'cannot open source file "sf_absent_header.cuh"' in ei.value.log
    assert "(include path: -I" in ei.value.message
    assert "(include path" not in ei.value.log
    with pytest.raises(native.CompileError) as ei:
        ctx.compile(HALF_KERNEL, arch="sm_90a", cuda_include_dir="/nonexistent/cuda/include")
    assert 'cannot open source file "cuda_fp16.h"' in ei.value.log
    assert "-I/nonexistent/cuda/include" in ei.value.message


def test_include_dirs_and_options(ctx, tmp_path):
    (tmp_path / "sf_value.h").write_text("#define SF_VALUE 7\n")
    src = ('#include "sf_value.h"\n#ifndef SF_SCALE\n#error SF_SCALE is missing\n#endif\n'
           'extern "C" __global__ void k(float *y) { y[0] = SF_SCALE * SF_VALUE; }\n')
    b = ctx.compile(src, arch="sm_90a", include_dirs=[tmp_path], options=["-DSF_SCALE=2.0f"])
    assert b.data[:4] == b"\x7fELF"
    with pytest.raises(native.CompileError, match="SF_SCALE is missing"):
        ctx.compile(src, arch="sm_90a", include_dirs=[tmp_path])
    with pytest.raises(native.NvrtcError, match="NVRTC_ERROR_INVALID_OPTION"):
        ctx.compile(src, arch="sm_90a", include_dirs=[tmp_path], options=["--no-such-option"])


def test_canonical_options(ctx):
    assert (ctx.canonical_options("sm_90a", options=["-DX=1", "-lineinfo"])
            == "--gpu-architecture=sm_90a -std=c++17 -default-device -DX=1 -lineinfo")
    assert (ctx.canonical_options("sm_90a", ptx=True)
            == "--gpu-architecture=compute_90a -std=c++17 -default-device")


@pytest.mark.parametrize("arch", ["sm90", "sm_9", "sm_90b", "ampere"])
def test_malformed_arch(ctx, arch):
    with pytest.raises(native.InvalidArgumentError) as ei:
        ctx.compile(HALF_KERNEL, arch=arch)
    assert isinstance(ei.value, ValueError)
    assert ei.value.message.startswith(f'malformed arch "{arch}": expected sm_<number>')


def test_bad_python_arguments(ctx):
    with pytest.raises(TypeError, match="source must be a str"):
        ctx.compile(b"bytes")
    with pytest.raises(TypeError, match="options must be a sequence of str"):
        ctx.compile(HALF_KERNEL, arch="sm_80", options="-DX=1")
    with pytest.raises(ValueError, match="device ordinal must be >= 0"):
        native.Context(-1)
    with pytest.raises(ValueError, match="binary data is empty"):
        native.Binary.from_bytes(b"")


def test_binary_from_bytes():
    b = native.Binary.from_bytes(b"\x7fELFxyz")
    assert b.data == b"\x7fELFxyz" and not b.ptx and b.log == ""
    p = native.Binary.from_bytes(b".version 8.0", ptx=True)
    assert p.data == b".version 8.0\0" and p.text == ".version 8.0"


def test_kernel_argument_conversion():
    arr, keep = native._kernel_args([0x1000, 3, 2.5, -7], "Pifq")
    assert [type(v) for v in keep] == [ctypes.c_uint64, ctypes.c_int32, ctypes.c_float,
                                       ctypes.c_int64]
    assert keep[0].value == 0x1000 and keep[1].value == 3 and keep[2].value == 2.5
    assert arr[2] == ctypes.addressof(keep[2])
    with pytest.raises(ValueError, match="names 2 arguments but 3 were given"):
        native._kernel_args([1, 2, 3], "PP")
    with pytest.raises(ValueError, match="does not fit in int32"):
        native._kernel_args([1 << 40], "i")
    with pytest.raises(ValueError, match="'x' is not one of P"):
        native._kernel_args([1], "x")
    with pytest.raises(ValueError, match="ambiguous without sig"):
        native._kernel_args([1], None)
    assert native._dims(7, "grid") == (7, 1, 1)
    assert native._dims((2, 3), "grid") == (2, 3, 1)
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        native._dims((1, 1, 1, 1), "grid")
    with pytest.raises(ValueError, match="must be in 1..2"):
        native._dims((0, 1), "block")


def test_closed_context():
    c = native.Context(0)
    c.close()
    c.close()  # twice is fine
    with pytest.raises(ValueError, match="the context is closed"):
        c.compile(HALF_KERNEL, arch="sm_80")


def test_gpu_available_never_raises():
    ok, reason = native.gpu_available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason


_NO_DRIVER_SCRIPT = r"""
import json
from sparseforge import native
out = {"available": native.gpu_available()}
ctx = native.Context(0)
for what, call in [("device_info", ctx.device_info), ("alloc", lambda: ctx.alloc(16)),
                   ("device_count", ctx.device_count), ("synchronize", ctx.synchronize),
                   ("load", lambda: ctx.load(ctx.compile(SRC, arch="sm_90a"))),
                   ("native_compile", lambda: ctx.compile(SRC))]:
    try:
        call()
        out[what] = None
    except native.SFError as e:
        out[what] = [type(e).__name__, e.status, e.message]
out["compiled"] = ctx.compile(SRC, arch="sm_90a").data[:4].hex()
print(json.dumps(out))
""".replace("SRC", repr(HALF_KERNEL))


def test_no_driver_in_subprocess():
    env = dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _NO_DRIVER_SCRIPT], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    ok, reason = out["available"]
    assert ok is False
    assert reason.startswith("no CUDA driver found: /nonexistent/libcuda.so.1")
    for what in ("device_info", "alloc", "device_count", "synchronize", "load",
                 "native_compile"):
        name, status, message = out[what]
        assert name == "NoDriverError", what
        assert status == native.SF_ERR_NO_DRIVER
        assert message.startswith("no CUDA driver found: /nonexistent/libcuda.so.1"), what
    assert out["compiled"] == "7f454c46"  # compiling needs no driver


# ---- GPU ----------------------------------------------------------------------
@pytest.mark.gpu
def test_device_info(ctx):
    info = ctx.device_info()
    assert set(info) == {"name", "cc_major", "cc_minor", "arch", "sm_count", "l2_bytes",
                         "smem_per_block_optin", "smem_per_sm", "regs_per_block",
                         "max_threads_per_block", "clock_khz", "driver_version",
                         "total_mem_bytes"}
    want = "sm_90a" if (info["cc_major"], info["cc_minor"]) == (9, 0) else \
        f"sm_{info['cc_major']}{info['cc_minor']}"
    assert info["arch"] == want
    assert info["name"] and info["sm_count"] > 0 and info["total_mem_bytes"] > 1 << 30
    assert ctx.device_count() >= 1


@pytest.mark.gpu
def test_launch_and_download(ctx):
    fn = ctx.load(ctx.compile(HALF_KERNEL)).kernel("axpb")
    attrs = fn.attributes()
    assert set(attrs) == {"num_regs", "shared_bytes", "local_bytes", "max_threads"}
    assert attrs["num_regs"] > 0 and attrs["local_bytes"] == 0
    n = 100_000
    x = (np.arange(n) % 64).astype(np.float32) * 0.5
    xb = ctx.upload(x)
    yb = ctx.alloc(4 * n)
    ctx.memset(yb, 0xFF)
    ctx.launch(fn, grid=(n + 255) // 256, block=256, args=[xb, yb, 2.0, 1.0, n], sig="PPffi")
    ctx.synchronize()
    y = np.frombuffer(ctx.download(yb), dtype=np.float32)
    np.testing.assert_array_equal(y, x * 2 + 1)
    # partial download and memset
    ctx.memset(yb, 0, nbytes=8)
    head = np.frombuffer(ctx.download(yb, 16), dtype=np.float32)
    np.testing.assert_array_equal(head, [0, 0, 3, 4])  # y = 2 x + 1, x = 0, .5, 1, 1.5
    # inferred signature (no plain ints)
    ctx.launch(fn, (n + 255) // 256, 256, [xb, yb, 1.0, 0.0, np.int32(n)])
    ctx.synchronize()
    np.testing.assert_array_equal(np.frombuffer(ctx.download(yb), np.float32), x)
    xb.free()
    xb.free()
    yb.free()


@pytest.mark.gpu
def test_ptx_load(ctx):
    fn = ctx.load(ctx.compile(HALF_KERNEL, ptx=True)).kernel("axpb")
    xb = ctx.upload(np.ones(256, np.float32))
    yb = ctx.alloc(1024)
    ctx.launch(fn, 1, 256, [xb, yb, 3.0, 0.5, 256], sig="PPffi")
    ctx.synchronize()
    assert np.all(np.frombuffer(ctx.download(yb), np.float32) == 3.5)


@pytest.mark.gpu
def test_errors_from_the_gpu(ctx):
    mod = ctx.load(ctx.compile(HALF_KERNEL))
    with pytest.raises(native.NotFoundError, match='no kernel named "nope"'):
        mod.kernel("nope")
    fn = mod.kernel("axpb")
    with pytest.raises(native.LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        ctx.launch(fn, 1, 4096, [0, 0, 1.0, 1.0, 0], sig="PPffi")
    if ctx.device_info()["cc_major"] != 8:
        with pytest.raises(native.CudaError, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
            ctx.load(ctx.compile(HALF_KERNEL, arch="sm_80"))
    mod.unload()
    with pytest.raises(ValueError, match="the module was unloaded"):
        fn.attributes()


@pytest.mark.gpu
def test_time(ctx):
    fn = ctx.load(ctx.compile(HALF_KERNEL)).kernel("axpb")
    n = 1 << 20
    xb, yb = ctx.alloc(4 * n), ctx.alloc(4 * n)
    ctx.memset(xb, 0)
    args = [xb, yb, 2.0, 1.0, n]
    t = ctx.time(fn, n // 256, 256, args, sig="PPffi", min_reps=20, max_reps=40,
                 min_total_ms=2.0)
    assert set(t) == {"median_ms", "p20_ms", "p80_ms", "min_ms", "mean_ms", "reps"}
    assert 20 <= t["reps"] <= 40
    assert 0 < t["min_ms"] <= t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]
    g = ctx.time(fn, n // 256, 256, args, sig="PPffi", min_reps=5, max_reps=10,
                 min_total_ms=0, flush_l2=False, graph_batch=10, warmup=0)
    assert 5 <= g["reps"] <= 10 and g["min_ms"] > 0
    with pytest.raises(ValueError, match="min_reps <= max_reps"):
        ctx.time(fn, 1, 1, args, sig="PPffi", min_reps=10, max_reps=5)


LAYER_SOURCE = r"""
#define M 16
#define K 8
extern "C" __global__ void dense(const void *packed, const void *X, void *Y, int N) {
  const float *w = (const float *)packed, *x = (const float *)X;
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; k++) acc += w[m * K + k] * x[k * N + n];
  ((float *)Y)[m * N + n] = acc;
}
"""


@pytest.mark.gpu
def test_open_layer(ctx, tmp_path):
    from sparseforge.cache import Cache
    from sparseforge.generator.kernel import make_launch
    rows, cols = 16, 8
    w = ((np.arange(rows * cols) % 7) - 3).astype(np.float32) * 0.25
    variant = {"n_bucket": 64, "source": LAYER_SOURCE, "kernel_name": "dense", "options": "",
               "generator_version": "test", "packed": w.tobytes(), "config": "{}",
               "launch": make_launch(grid=(1, rows), block=(32,), n_axis=0, n_tile=32)}
    with Cache(tmp_path / "layer.db") as cache:
        cache.put_matrix("py-dense", rows, cols, rows * cols, "fp32")
        cache.put_layer("py.dense", ctx.device_info()["name"], "py-dense", "dense.fp32.fm",
                        rows, cols, 4, 4, [variant])
        n = 50
        x = (np.arange(cols * n) % 5 - 2).astype(np.float32).reshape(cols, n)
        xb, yb = ctx.upload(x), ctx.alloc(4 * rows * n)
        for expect_compiled in (1, 0):
            layer = ctx.open_layer(cache, "py.dense")
            assert layer.shape == (rows, cols, 1)
            assert layer.compiled_count == expect_compiled
            ctx.memset(yb, 0xFF)
            layer.run(xb, yb, n)
            ctx.synchronize()
            y = np.frombuffer(ctx.download(yb), np.float32).reshape(rows, n)
            np.testing.assert_array_equal(y, w.reshape(rows, cols) @ x)
            layer.close()
        with pytest.raises(native.NotFoundError, match='no layer named "py.missing"'):
            ctx.open_layer(cache, "py.missing")


def test_load_layer_refuses_a_malformed_descriptor_before_the_gpu(ctx):
    from sparseforge.generator.kernel import make_launch
    launch = make_launch(grid=(1, 16), block=(32,), n_axis=0, n_tile=32)
    v = {"n_bucket": 0, "kernel_name": "dense", "launch": launch, "binary": b"\x7fELF",
         "packed": None}
    with pytest.raises(native.InvalidArgumentError,
                       match=r'layer "py.bad" variant 0 \(n_bucket 0\): n_bucket is below 1'):
        ctx.load_layer("py.bad", 16, 8, 4, 4, [v])
    with pytest.raises(ValueError, match="layer 'py.bad' variant 0 lacks packed"):
        ctx.load_layer("py.bad", 16, 8, 4, 4, [{k: v[k] for k in v if k != "packed"}])


@pytest.mark.gpu
def test_load_layer_runs_on_packed_weights_the_caller_holds(ctx):
    """A layer loaded from memory without its packed weights, run on device
    buffers the caller owns (one per variant): what the PyTorch module does
    with its tensors."""
    from sparseforge.generator.kernel import make_launch
    rows, cols = 16, 8
    w = ((np.arange(rows * cols) % 7) - 3).astype(np.float32) * 0.25
    binary = ctx.compile(LAYER_SOURCE)
    launch = make_launch(grid=(1, rows), block=(32,), n_axis=0, n_tile=32)
    layer = ctx.load_layer("py.held", rows, cols, 4, 4,
                           [{"n_bucket": 16, "kernel_name": "dense", "launch": launch,
                             "binary": binary, "packed": None},
                            {"n_bucket": 256, "kernel_name": "dense", "launch": launch,
                             "binary": binary.data, "packed": None}])
    assert layer.shape == (rows, cols, 2) and layer.compiled_count == 0
    n = 50
    x = (np.arange(cols * n) % 5 - 2).astype(np.float32).reshape(cols, n)
    xb, yb = ctx.upload(x), ctx.alloc(4 * rows * n)
    wb, zero = ctx.upload(w), ctx.alloc(4 * rows * cols)
    ctx.memset(zero, 0)
    for packed, want in (([wb, zero], w.reshape(rows, cols) @ x),     # N = 50: the first
                         ([zero, wb], np.zeros((rows, n), np.float32))):
        ctx.memset(yb, 0xFF)
        layer.run(xb, yb, n, packed=packed)
        ctx.synchronize()
        y = np.frombuffer(ctx.download(yb), np.float32).reshape(rows, n)
        np.testing.assert_array_equal(y, want)
    with pytest.raises(native.InvalidArgumentError,
                       match="1 packed pointers for a layer of 2 variants"):
        layer.run(xb, yb, n, packed=[wb])
    layer.close()


_SHA_SCRIPT = """
import hashlib, os, ctypes, random
from sparseforge._lib import load
lib = load()
rng = random.Random(7)
for n in [0, 1, 55, 56, 63, 64, 65, 119, 128, 129, 1000, 4113, 1 << 20] + \\
         [rng.randrange(1, 5000) for _ in range(20)]:
    d = os.urandom(n)
    out = ctypes.create_string_buffer(65)
    assert lib.sf_sha256_hex(d, len(d), out) == 0
    assert out.value.decode() == hashlib.sha256(d).hexdigest(), n
print("ok")
"""


@pytest.mark.parametrize("portable", [False, True])
def test_sha256_matches_hashlib(portable):
    """The library's SHA-256 (the SHA extensions where the CPU has them,
    else portable C; $SF_SHA256_PORTABLE forces the latter) over sizes
    around the 64-byte block and across the buffered path."""
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    env.pop("SF_SHA256_PORTABLE", None)
    if portable:
        env["SF_SHA256_PORTABLE"] = "1"
    r = subprocess.run([sys.executable, "-c", _SHA_SCRIPT], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
