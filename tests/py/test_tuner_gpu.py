"""The tuner on a real GPU: a tune per family into a fresh database, the
stored layer opened and run through the C runtime (the deployment path),
and a planted faulting candidate recorded while the run goes on."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseforge.cache import Cache
from sparseforge.generator import io
from sparseforge.generator.families import get_family, parse_pattern
from sparseforge.generator.kernel import Operation, reference
from sparseforge.generator.matrix import from_device_bytes, to_device_bytes
from sparseforge.generator.synth import random_matrix
from sparseforge.tuner.driver import QUICK_TIMING, Tuner
from sparseforge.tuner.execute import compare, random_input

PATTERNS = [("csr", "fp32", 0.1), ("bsr:64x64", "fp16", 0.25), ("shflbw:64", "fp16", 0.25),
            ("nm24", "bf16", 0.5)]


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,dtype,density", PATTERNS)
def test_tune_then_open_and_run_the_layer(tmp_path, pattern, dtype, density):
    from sparseforge import native
    fam, params = parse_pattern(pattern)
    m = random_matrix(pattern, 384, 320, density, dtype, seed=3)
    op = Operation(dtype, "fm")
    db = str(tmp_path / "t.db")
    with Cache(db) as cache:
        tuner = Tuner(cache, strategy="greedy", budget="5", timing=QUICK_TIMING, seed=1)
        try:
            res = tuner.tune(m, fam, params, op, [64, 512], "layer")
        finally:
            tuner.close()
        for n, nr in res.per_n.items():
            assert nr.config is not None and nr.median_ms > 0 and nr.max_error < 1e-2
            assert nr.peer_ms > 0 and nr.speedup > 0          # cuBLAS, same run
        assert len(cache.layers("layer")) == 1
    # the deployment path: open by name (cubin from the cache), run, check
    with Cache(db, readonly=True) as cache, native.Context(0) as ctx:
        layer = ctx.open_layer(cache, "layer")
        assert layer.compiled_count == 0
        n = 100
        x = random_input(op, m.cols, n, np.random.default_rng(5))
        xb = ctx.upload(to_device_bytes(x, dtype))
        yb = ctx.alloc(m.rows * n * op.elem_size)
        ctx.memset(yb, 0xFF)
        layer.run(xb, yb, n)
        ctx.synchronize()
        y = from_device_bytes(ctx.download(yb), dtype, m.rows * n).reshape(m.rows, n)
        assert compare(y, reference(m, x, op), dtype)["ok"]
        layer.close()


FAULTY = r"""
extern "C" __global__ void NAME(const unsigned char *packed, const void *X, void *Y, int N) {
  ((volatile float *)0x10)[threadIdx.x] = 1.0f;   // no allocation owns this address
}
"""


@pytest.mark.gpu
def test_planted_fault_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    """One candidate of the space is replaced (in the test only) by a kernel
    that writes through a bad pointer: its trial is recorded as a launch
    failure, the worker restarts and the search goes on."""
    from sparseforge.generator.kernel import Kernel
    m = random_matrix("shflbw:64", 256, 256, 0.25, "fp16", seed=4)
    op = Operation("fp16", "fm")
    fam = get_family("shflbw")
    with Cache(str(tmp_path / "t.db")) as cache:
        tuner = Tuner(cache, strategy="exhaustive", budget="4", timing=QUICK_TIMING, seed=1,
                      peer=False)
        space = fam.search_space(m, op, {"v": 64}, tuner.target)  # the space the tuner searches
        victim = space[1]
        render = fam.render

        def render_with_a_fault(plan, op_, config):
            k = render(plan, op_, config)
            if config != victim:
                return k
            return Kernel(k.name, FAULTY.replace("NAME", k.name), k.packed, k.launch,
                          k.options, k.config)

        monkeypatch.setattr(fam, "render", render_with_a_fault)
        try:
            tuner.tune(m, "shflbw", {"v": 64}, op, [128], "faulty")
            restarts = tuner.worker.restarts
        finally:
            tuner.close()
        trials = cache.trials(n=128)
        statuses = sorted(t["status"] for t in trials)
        assert statuses == ["launch_fail", "ok", "ok", "ok"], trials
        bad = next(t for t in trials if t["status"] == "launch_fail")
        assert "ILLEGAL_ADDRESS" in bad["message"] or "faulted" in bad["message"], bad
        assert restarts >= 1                      # a fresh worker took over
        assert cache.layers("faulty")


@pytest.mark.gpu
def test_the_command_with_two_lanes_tunes_every_layer_on_the_gpu(tmp_path):
    """`sparseforge tune --lanes 2` on the GPU (two searches taking turns on
    it): every layer stored with each N bucket, every winner verified, and
    the time line sums the phases over both lanes (a lane's waits for its
    turn, under 0.05 s, may not be printed; test_gpus checks them)."""
    root = Path(__file__).resolve().parents[2]
    mats = [(f"l{i}", random_matrix("shflbw:64", 256, 192, 0.25, "fp16", seed=i))
            for i in range(3)]
    io.save(tmp_path / "m.npz", mats)
    db = tmp_path / "t.db"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "sparseforge", "tune", str(tmp_path / "m.npz"),
                        "--pattern", "shflbw:64", "--db", str(db), "--n", "16,256",
                        "--budget", "4", "--quick", "--lanes", "2"],
                       env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(phases summed over 2 lanes)" in r.stdout
    with Cache(str(db), readonly=True) as cache:
        for name, _ in mats:
            (layer,) = cache.layers(name)
            assert [v["n_bucket"] for v in layer["variants"]] == [16, 256]
            for v in layer["variants"]:      # each winner a verified trial of its bucket
                (won,) = [t for t in cache.trials(matrix_fp=layer["matrix_fp"], op=layer["op"],
                                                  n=v["n_bucket"]) if t["config"] == v["config"]]
                assert won["status"] == "ok" and won["max_error"] < 1e-2
