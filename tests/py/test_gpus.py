"""Several GPUs of one host (--gpus), with replaying workers standing for
the GPUs: the (layer, N) items are shared out over them, every layer is
stored once with all its buckets in the one database, identical matrices
are served from their first's trials, GPUs of different models are
refused unless asked (then each model tunes everything, under its own
name), and --gpus is refused clearly without a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sparseforge.cache import Cache
from sparseforge.generator import io
from sparseforge.generator.families import get_family
from sparseforge.generator.matrix import SparseMatrix
from sparseforge.tuner.compiler import Compiler
from sparseforge.tuner.driver import Tuner
from sparseforge.tuner.gpus import GpuPool, parse_gpus, resolve_gpus
from sparseforge.tuner.model import plan_model

from replay import ReplayWorker

ROOT = Path(__file__).resolve().parents[2]
NS = [16, 64]


@pytest.fixture(autouse=True)
def small_space(monkeypatch):
    fam = get_family("csr")
    full = fam.search_space
    monkeypatch.setattr(fam, "search_space", lambda *a, **k: full(*a, **k)[:4])


def model() -> list[tuple[str, SparseMatrix]]:
    """Three csr layers (the third a copy of the first) and a dense one."""
    out = []
    for i, shape in enumerate([(96, 80), (64, 80)]):
        rng = np.random.default_rng(i)
        dense = rng.standard_normal(shape).astype(np.float32)
        dense[rng.random(shape) < 0.8] = 0
        out.append((f"layer{i}", SparseMatrix.from_dense(dense, dtype="fp32")))
    out.append(("copy_of_layer0", out[0][1]))
    out.append(("dense", SparseMatrix.from_dense(np.ones((8, 8), np.float32))))
    return out


def pool(cache, workers: dict, mixed=False) -> GpuPool:
    def make(ordinal, compiler):
        return Tuner(cache, strategy="exhaustive", worker=workers[ordinal], compiler=compiler,
                     jobs=2)
    return GpuPool(list(workers), make, Compiler(cache, 2), mixed=mixed)


def both_busy():
    """A trial hook: each GPU's first trial waits (up to 10 s) until the
    other has started one, so the test fails if one GPU takes all items."""
    barrier = threading.Barrier(2, timeout=10)
    waited = []

    def hook(worker, trial):
        if not worker.trials:
            try:
                barrier.wait()
                waited.append(True)
            except threading.BrokenBarrierError:
                waited.append(False)
    return hook, waited


def test_items_are_shared_out_and_every_layer_stored_once(tmp_path):
    hook, waited = both_busy()
    workers = {0: ReplayWorker(on_trial=hook), 1: ReplayWorker(on_trial=hook)}
    with Cache(tmp_path / "t.db") as cache:
        p = pool(cache, workers)
        try:
            tables = p.run(plan_model(model()), NS)
        finally:
            p.close()
        assert waited == [True, True], "one GPU took every item"
        # the summary's wall time is the run's, not that of the summing
        assert p.phases.as_dict()["wall"] >= p.phases.as_dict()["time"] / 2 > 0
        (rows,) = tables.values()
        assert [r.name for r in rows] == ["layer0", "layer1", "copy_of_layer0", "dense"]
        assert rows[3].skipped and rows[2].result.note == "same matrix as layer0"
        # each (layer, N) searched once, by one GPU or the other
        assert sum(len(w.trials) for w in workers.values()) == 2 * len(NS) * 4
        assert len(cache.trials(op="csr.fp32.fm.plain")) == 2 * len(NS) * 4
        for name in ("layer0", "layer1", "copy_of_layer0"):
            (layer,) = cache.layers(name)
            assert layer["gpu_name"] == "Replay GPU"
            assert [v["n_bucket"] for v in layer["variants"]] == NS
        for r in rows[:3]:
            assert sorted(r.result.per_n) == NS and all(nr.config for nr in r.result.per_n.values())


def test_the_lanes_of_one_gpu_take_turns_on_it(tmp_path):
    """Two searches in flight on one GPU (`--lanes 2`): each lane's worker
    gets work, and no two trials or setups are ever on the GPU at once."""
    busy, seen, guard = [0], [], threading.Lock()

    def on_gpu(worker, trial):
        with guard:
            busy[0] += 1
            seen.append(busy[0])
        time.sleep(0.003)
        with guard:
            busy[0] -= 1
    workers = iter([ReplayWorker(on_trial=on_gpu), ReplayWorker(on_trial=on_gpu)])
    lanes = []

    def make(ordinal, compiler):
        lanes.append(next(workers))
        return Tuner(cache, strategy="exhaustive", worker=lanes[-1], compiler=compiler, jobs=2)
    with Cache(tmp_path / "t.db") as cache:
        p = GpuPool([0], make, Compiler(cache, 2), lanes=2)
        try:
            tables = p.run(plan_model(model()), NS)
        finally:
            p.close()
        assert len(p.tuners) == 2 and all(w.trials for w in lanes), "a lane got no work"
        assert max(seen) == 1, "two lanes were on the GPU at once"
        # a lane's wait for the other's turn is its own phase, not the trial's load
        assert sum(t.phases.seconds["turn"] for t in p.tuners) > 0
        assert all(v >= 0 for t in p.tuners for v in t.phases.seconds.values())
        assert sum(len(w.trials) for w in lanes) == 2 * len(NS) * 4
        (rows,) = tables.values()
        assert [r.name for r in rows] == ["layer0", "layer1", "copy_of_layer0", "dense"]
        for name in ("layer0", "layer1", "copy_of_layer0"):
            (layer,) = cache.layers(name)
            assert [v["n_bucket"] for v in layer["variants"]] == NS
    with pytest.raises(ValueError, match="at least 1"):
        GpuPool([0], make, None, lanes=0)


def test_gpus_of_different_models_are_refused_unless_asked(tmp_path):
    with Cache(tmp_path / "t.db") as cache:
        with pytest.raises(ValueError, match=r"GPUs of different models \(0: GPU A, 1: GPU B\).*"
                                             r"--mixed-gpus"):
            pool(cache, {0: ReplayWorker(name="GPU A"), 1: ReplayWorker(name="GPU B")})
        assert cache.layers() == []
        workers = {0: ReplayWorker(name="GPU A"), 1: ReplayWorker(name="GPU B")}
        p = pool(cache, workers, mixed=True)
        try:
            tables = p.run(plan_model(model()[:2]), NS)
        finally:
            p.close()
        assert sorted(tables) == ["GPU A", "GPU B"]
        for w in workers.values():                 # each model tuned everything
            assert len(w.trials) == 2 * len(NS) * 4
        assert sorted(layer["gpu_name"] for layer in cache.layers("layer0")) == ["GPU A", "GPU B"]
        assert len({t["env_key"] for t in cache.trials(op="csr.fp32.fm.plain")}) == 2


def test_a_failure_on_one_gpu_stops_the_run_and_is_raised(tmp_path):
    def boom(worker, trial):
        raise RuntimeError("worker 1 broke")
    workers = {0: ReplayWorker(), 1: ReplayWorker(on_trial=boom)}
    with Cache(tmp_path / "t.db") as cache:
        p = pool(cache, workers)
        try:
            with pytest.raises(RuntimeError, match="worker 1 broke"):
                p.run(plan_model(model()[:2]), NS)
        finally:
            p.close()


@pytest.mark.parametrize("text,expected", [("all", "all"), ("0", [0]), ("1, 0", [1, 0])])
def test_gpus_are_parsed(text, expected):
    assert parse_gpus(text) == expected


@pytest.mark.parametrize("text,message", [("x", "'all' or GPU ordinals"),
                                          ("0,0", "names a GPU twice"),
                                          ("-1", "'all' or GPU ordinals"), ("", "GPU ordinals")])
def test_bad_gpus_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_gpus(text)


def test_gpus_are_resolved_against_the_host():
    yes = lambda: (True, "")   # noqa: E731
    assert resolve_gpus("all", lambda: 3, yes) == [0, 1, 2]
    with pytest.raises(ValueError, match="names GPU 4 but this host has 2"):
        resolve_gpus([0, 4], lambda: 2, yes)
    with pytest.raises(ValueError, match=r"--gpus: no GPU here \(no driver\)"):
        resolve_gpus("all", lambda: 0, lambda: (False, "no driver"))


def test_the_command_refuses_gpus_without_a_gpu(tmp_path):
    io.save(tmp_path / "m.npz", model()[:1])
    env = dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "sparseforge", "tune", str(tmp_path / "m.npz"),
                        "--db", str(tmp_path / "t.db"), "--gpus", "all"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "sparseforge tune: error: --gpus: no GPU here" in r.stderr
    assert "leave --gpus out" in r.stderr
    assert not (tmp_path / "t.db").exists()
    r = subprocess.run([sys.executable, "-m", "sparseforge", "tune", str(tmp_path / "m.npz"),
                        "--db", str(tmp_path / "t.db"), "--lanes", "2"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "sparseforge tune: error: --lanes: no GPU here" in r.stderr
    assert not (tmp_path / "t.db").exists()
    r = subprocess.run([sys.executable, "-m", "sparseforge", "tune", str(tmp_path / "m.npz"),
                        "--lanes", "0"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "argument --lanes: a positive whole number" in r.stderr
