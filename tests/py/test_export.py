"""Deployment bundles: `sparseforge export` writes C sources that build with
CMake into a library needing the CUDA driver alone; examples/deploy builds
against one and checks every layer against a CPU reference from the
exported test vectors.  Without a GPU it must stop with the clear "no CUDA
driver" message; with one (on the GPU machine) every check passes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseforge import native
from sparseforge.cache import Cache
from sparseforge.export import ExportError, export
from sparseforge.generator import io
from sparseforge.generator.synth import random_matrix

ROOT = Path(__file__).resolve().parents[2]
HAVE_CMAKE = shutil.which("cmake") is not None


def _env(no_driver=True):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if no_driver:
        e["SF_CUDA_DRIVER"] = "/nonexistent/libcuda.so.1"
    return e


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A database of two layers compiled (untuned) for sm_80 and sm_90a, and
    the weights file they came from."""
    d = tmp_path_factory.mktemp("tuned")
    weights = d / "model.npz"
    io.save(weights, [("blocks.0", random_matrix("bsr:32x32", 256, 192, 0.25, "fp16", seed=1)),
                      ("two:four", random_matrix("nm24", 128, 256, 0.5, "bf16", seed=2))])
    db = d / "t.db"
    r = subprocess.run([sys.executable, "-m", "sparseforge", "tune", str(weights), "--db", str(db),
                        "--n", "16,256", "--budget", "1"], env=_env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return db, weights


@pytest.mark.skipif(not HAVE_CMAKE, reason="no cmake")
def test_the_bundle_builds_and_the_example_checks_it(tuned, tmp_path):
    db, weights = tuned
    out = tmp_path / "bundle"
    r = subprocess.run([sys.executable, "-m", "sparseforge", "export", str(db), "-o", str(out),
                        "--vectors", str(weights), "--weights", "file"], env=_env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "bundle sfmodel of 2 layer(s) for sm_80, sm_90a" in r.stdout
    for f in ("include/sfmodel.h", "src/sfmodel.c", "CMakeLists.txt", "sfmodel.weights",
              "vectors/layer0.sfv", "vectors/layer1.sfv", "runtime/layer.c"):
        assert (out / f).exists(), f
    header = (out / "include" / "sfmodel.h").read_text()
    assert "SFMODEL_blocks_0 = 0" in header and "SFMODEL_two_four = 1" in header
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ROOT / "examples" / "deploy"), "-B", str(build),
                    f"-DSF_BUNDLE_DIR={out}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)], check=True,
                   capture_output=True)
    exe = build / "deploy_check"
    needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout + \
        subprocess.run(["readelf", "-d", str(build / "bundle" / "libsfmodel.so")],
                       capture_output=True, text=True).stdout
    for lib in ("nvrtc", "sqlite", "cublas", "cusparse", "python"):
        assert lib not in needed.lower(), needed
    gpu, why = native.gpu_available()
    r = subprocess.run([str(exe), str(out / "vectors"), str(out / "sfmodel.weights")],
                       env=_env(no_driver=not gpu), capture_output=True, text=True, timeout=300)
    if not gpu:
        assert r.returncode == 3, (r.stdout, r.stderr)
        assert r.stderr.startswith("deploy_check: no CUDA driver found"), r.stderr
        return
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "all layers correct" in r.stdout and "WRONG" not in r.stdout
    # the weights file is checked: a flipped byte is refused, naming it
    bad = tmp_path / "bad.weights"
    data = bytearray((out / "sfmodel.weights").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    r = subprocess.run([str(exe), str(out / "vectors"), str(bad)], env=_env(no_driver=False),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 4 and "failed their sha256" in r.stderr, r.stderr


def test_export_refuses_what_the_database_does_not_hold(tuned, tmp_path):
    db, weights = tuned
    with Cache(db, readonly=True) as cache:
        with pytest.raises(ExportError, match="no usable layer named 'missing'"):
            export(cache, tmp_path / "a", ["missing"])
        with pytest.raises(ExportError, match=r"layer 'blocks.0' has no record for sm_86: it "
                                              r"was tuned on untuned \(sm_80\) \(sm_80\)"):
            export(cache, tmp_path / "b", ["blocks.0"], ["sm_86"])
        with pytest.raises(ExportError, match="a bundle's name is a C identifier"):
            export(cache, tmp_path / "c", ["blocks.0"], bundle_name="not-an-identifier")
        bundle, files = export(cache, tmp_path / "d", ["two:four"], ["sm_90a"])
        assert bundle.archs == ["sm_90a"] and len(bundle.layers) == 1
        src = (tmp_path / "d" / "src" / "sfmodel.c").read_text()
        assert ".grid = {" in src and ".n_axis = " in src and "tuned on untuned (sm_90a)" in src
    r = subprocess.run([sys.executable, "-m", "sparseforge", "export", str(db), "-o",
                        str(tmp_path / "d")], env=_env(), cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 1 and "exists and is not empty; pass --force" in r.stderr


def test_test_vectors_hold_the_matrix_and_an_x(tuned, tmp_path):
    import struct
    db, weights = tuned
    with Cache(db, readonly=True) as cache:
        export(cache, tmp_path / "v", None, ["sm_80"], vectors=str(weights))
    raw = (tmp_path / "v" / "vectors" / "layer1.sfv").read_bytes()
    assert raw[:4] == b"SFV1"
    rows, cols, nnz, ncol, dtype, layout, act, scale = struct.unpack("<qqqqiiif", raw[4:52])
    m = dict(io.load(weights))["two:four"]
    assert (rows, cols, nnz, dtype, layout, act, scale) == (128, 256, m.nnz, 2, 0, 0, 1.0)
    coo = np.frombuffer(raw, dtype=[("r", "<i4"), ("c", "<i4"), ("v", "<f4")], count=nnz,
                        offset=52)
    dense = np.zeros((rows, cols), np.float32)
    dense[coo["r"], coo["c"]] = coo["v"]
    np.testing.assert_array_equal(dense, m.to_dense().astype(np.float32))
    x = np.frombuffer(raw, dtype="<f4", offset=52 + 12 * nnz)
    assert x.size == cols * ncol and np.all(np.isfinite(x)) and x.std() > 0.5
